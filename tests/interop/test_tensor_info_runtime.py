"""Tensor info and the size guard on every real fixture, against ExecuTorch's own
deserializers; and a bf16-rounding backend built on tensor info alone, in the runtime.

- ``get_tensor_info`` of every key equals what ExecuTorch's XNNGraph / program / FlatTensor
  deserializers describe (tests/support/et_tensor_reference.py), None exactly where they
  describe nothing, and ``get_array`` gives the reference bytes in that dtype and shape;
- a replacement 4 bytes larger is refused for every key of every fixture with a message
  naming the reference dtype, shape and both sizes, and accepted with
  ``allow_size_change=True``;
- ``examples/bf16_round.py`` leaves quantized tensors and scales untouched, and the runtime
  outputs of what it writes equal eager PyTorch with exactly those weights rounded to bf16.
"""

from __future__ import annotations

import copy
import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.et_reference import segment_bytes
from support.et_runtime import Job, run_programs
from support.et_tensor_reference import reference_tensor_descriptions
from support.fixtures import Fixture, all_fixtures, get_fixture

import ptestore
from ptestore.backends import BackendData
from ptestore.coordinator.named import MergedNamedDataMap, SourceFile
from ptestore.coordinator.report import BackendReport
from ptestore.coordinator.session import Run, Session
from ptestore.coordinator.spool import Spool
from ptestore.errors import InvalidReplacement
from ptestore.format.reader import read_container
from ptestore.storage.loaders import LocalFileLoader

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
IGNORED = ("where", "source")


def _files(fx: Fixture) -> list[SourceFile]:
    files = []
    for role, path in (("pte", fx.pte_path), ("ptd", fx.ptd_path)):
        if path is not None:
            loader = LocalFileLoader(path)
            files.append(SourceFile(role, loader, None, read_container(loader)))  # type: ignore[arg-type]
    return files


def _pte_fixtures() -> list[Fixture]:
    return [fx for fx in all_fixtures() if fx.pte_path is not None]


def _same(ours: dict[str, Any], ref: dict[str, Any]) -> bool:
    """Every field the reference states has our value (nested dicts likewise)."""

    def sub(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return all(sub(a.get(k), v) for k, v in b.items())
        return bool(a == b)

    return all(sub(ours.get(k), v) for k, v in ref.items() if k not in IGNORED)


@pytest.mark.parametrize("fx", _pte_fixtures(), ids=lambda f: f.name)
def test_tensor_info_matches_executorch(fx: Fixture) -> None:
    assert fx.pte_path is not None
    ref = reference_tensor_descriptions(fx.pte_path, fx.ptd_path)
    named = MergedNamedDataMap(_files(fx))
    for key in named:
        info = named.get_tensor_info(key)
        descs = ref.get(key, [])
        if not descs:
            assert info is None, f"{fx.name} {key}: nothing in ExecuTorch describes it"
            continue
        assert info is not None, f"{fx.name} {key}: ExecuTorch describes it as {descs[0]}"
        ours = info.to_json()
        first = descs[0]
        assert _same(ours, first), f"{fx.name} {key}: {ours} != {first}"
        assert ours["source"] == first["source"] and ours["where"] == first.get("where", "")
        # Every other description is either the same or listed as another use.
        others = [o.to_json() for o in info.other_uses]
        for d in descs[1:]:
            assert _same(ours, d) or any(_same(o, d) for o in others), f"{fx.name} {key}: {d}"
        # The bytes as an array: the reference bytes, in that dtype and shape.
        f, index, _ = named.where(key)
        path = fx.pte_path if f.role == "pte" else fx.ptd_path
        assert path is not None
        raw = segment_bytes(path, index, f.role)  # type: ignore[arg-type]
        arr = named.get_array(key)
        assert arr.tobytes() == raw[: info.nbytes] and not arr.flags.writeable
        assert arr.shape == info.array_shape and arr.dtype == np.dtype(info.array_dtype)
    # And nothing ExecuTorch describes is missing from the map's answers.
    for key in ref:
        if key in named:
            assert named.get_tensor_info(key) is not None


def test_quantized_fixtures_report_quantized_dtypes() -> None:
    for name in ("quant_xnnpack", "scale_alias_xnnpack"):
        fx = get_fixture(name)
        named = MergedNamedDataMap(_files(fx))
        dtypes = {named.get_tensor_info(k).dtype for k in named}  # type: ignore[union-attr]
        assert "qint8_per_channel" in dtypes, name


@pytest.mark.parametrize(
    "fx",
    [f for f in _pte_fixtures() if any(f.facts[r]["named_data"] for r in f.facts)],
    ids=lambda f: f.name,
)
def test_size_guard_on_every_key(fx: Fixture, tmp_path: Path) -> None:
    assert fx.pte_path is not None
    ref = reference_tensor_descriptions(fx.pte_path, fx.ptd_path)
    files = _files(fx)
    spool = Spool(str(tmp_path))
    try:
        session = Session(Run(files, spool, None), "AnyId", BackendReport("AnyId", "*", "x"))
        named = session.named_data_map
        for key in named:
            size = len(named.get_data(key))
            d = ref[key][0]
            with pytest.raises(InvalidReplacement) as err:
                session.replace_named(key, BackendData(b"\0" * (size + 4)))
            msg = str(err.value)
            assert f"key {key!r}" in msg
            assert f"the value is {d['dtype']} {d['shape']}, {size} bytes" in msg
            assert f"the replacement {size + 4} bytes" in msg
            assert "allow_size_change=True" in msg
            session.replace_named(key, BackendData(b"\0" * (size + 4), allow_size_change=True))
    finally:
        spool.close()


# -- the bf16 example in the runtime -------------------------------------------------


def _example() -> Any:
    sys.path.insert(0, str(REPO))
    try:
        from examples import bf16_round
    finally:
        sys.path.remove(str(REPO))
    return bf16_round


def _eager_modules() -> dict[str, Any]:
    """Fixture name -> its MethodSpecs, rebuilt by the (seeded) fixture generator."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import make_fixtures
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return {s.name: s.methods for s in make_fixtures.specs()}


def _param_keys(t: Any) -> set[str]:
    """The XNNPACK keys a float32 parameter could have (SHA-256 of its portable bytes:
    contiguous, or NHWC for 4-d weights)."""
    t = t.detach().float().contiguous()
    forms = [t] + ([t.permute(0, 2, 3, 1).contiguous()] if t.dim() == 4 else [])
    return {hashlib.sha256(f.numpy().tobytes()).hexdigest() for f in forms}


def _xnnpack_fixtures() -> list[Fixture]:
    return [
        fx
        for fx in all_fixtures()
        if fx.runnable and any(d["id"] == "XnnpackBackend" for d in fx.facts["pte"]["delegates"])
    ]


def test_bf16_example_matches_eager_with_rounded_weights(tmp_path: Path) -> None:
    import torch

    bf16 = _example()
    specs = _eager_modules()
    jobs: list[Job] = []
    expect: list[tuple[Fixture, str, Any]] = []  # (fixture, method, eager outputs or None)
    fixtures = _xnnpack_fixtures()
    assert {"quant_xnnpack", "scale_alias_xnnpack", "conv_xnnpack"} <= {f.name for f in fixtures}
    for fx in fixtures:
        assert fx.pte_path is not None
        dst = tmp_path / f"{fx.name}.pte"
        ptd = (fx.ptd_path, tmp_path / f"{fx.name}.ptd") if fx.ptd_path else None
        report = ptestore.specialize(
            fx.pte_path,
            dst,
            ptd=ptd,
            backends=[bf16.Bf16Round()],
            allow_unchanged=True,
            provenance=False,
        )
        replaced = set(report.backends[0].keys_replaced)
        named = MergedNamedDataMap(_files(fx))
        for key in named:
            info = named.get_tensor_info(key)
            assert info is not None
            if info.dtype != "float32" or info.role != "tensor":
                assert key not in replaced, f"{fx.name}: {key} ({info.dtype} {info.role})"
        if fx.has("quantized"):
            # Quantized weights, int32 biases and scales are untouched: same file.
            assert not replaced
            assert dst.read_bytes() == fx.pte_path.read_bytes()
        else:
            assert replaced == set(named.keys()), fx.name
        out_ptd = ptd[1] if ptd else None
        matched: set[str] = set()
        for m in fx.methods:
            jobs.append(Job(pte=dst, ptd=out_ptd, method=m, inputs=fx.inputs[m], label=fx.name))
            if fx.has("quantized"):
                expect.append((fx, m, None))
                continue
            module = copy.deepcopy(specs[fx.name][m].module)
            with torch.no_grad():
                for p in module.parameters():
                    keys = _param_keys(p) & replaced
                    if keys:
                        matched |= keys
                        p.copy_(p.to(torch.bfloat16).to(torch.float32))
                outs = module(*[torch.from_numpy(np.array(a)) for a in fx.inputs[m]])
            outs = outs if isinstance(outs, tuple | list) else [outs]
            expect.append((fx, m, [o.detach().numpy() for o in outs]))
        # Every rounded key is a parameter of the eager model, rounded there too.
        assert fx.has("quantized") or matched == replaced, fx.name
    results = run_programs(jobs)
    for result, (fx, m, eager) in zip(results, expect, strict=True):
        assert result.outputs is not None, result.describe()
        if eager is None:
            for a, b in zip(result.outputs, fx.outputs_runtime[m], strict=True):
                assert np.array_equal(a, b), f"{fx.name}/{m}"
            continue
        for a, b in zip(result.outputs, eager, strict=True):
            np.testing.assert_allclose(
                a, b, atol=max(fx.atol, 1e-5), rtol=max(fx.rtol, 1e-5), err_msg=f"{fx.name}/{m}"
            )
        # Not vacuous: rounding changed the outputs.
        assert not all(
            np.array_equal(a, b) for a, b in zip(result.outputs, fx.outputs_runtime[m], strict=True)
        ), f"{fx.name}/{m}: rounding changed nothing"
