"""Tensor info for named data (issue 8, problem 1) and the size guard (problem 2).

Without ExecuTorch: the interop suite checks the same answers against ExecuTorch's own
deserializers (tests/interop/test_tensor_info_runtime.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import synth
from support.fixtures import all_fixtures, get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NamedDataMap,
    QuantParams,
    TensorInfo,
)
from ptestore.cli import main
from ptestore.coordinator.named import MergedNamedDataMap, SourceFile
from ptestore.errors import FormatError, InvalidReplacement
from ptestore.format.flatbuf import FlatView
from ptestore.format.reader import read_container
from ptestore.format.tensorinfo import (
    MAX_ARRAY_DIMS,
    MAX_OTHER_USES,
    array_view,
    scalar_type_info,
)
from ptestore.format.tensors import TensorIndex, describe_tensors, named_data_json
from ptestore.format.xnnpack import parse_xnn_header, parse_xnngraph, xnngraph_span
from ptestore.storage.loaders import BytesLoader, LocalFileLoader

REPO = Path(__file__).resolve().parents[2]
#: A thirtieth of the main fuzz test's budget (PTESTORE_FUZZ_EXAMPLES, 10,000 in CI).
FUZZ_EXAMPLES = max(50, int(os.environ.get("PTESTORE_FUZZ_EXAMPLES", "10000")) // 30)


def merged(name: str) -> MergedNamedDataMap:
    fx = get_fixture(name)
    files = []
    for role, path in (("pte", fx.pte_path), ("ptd", fx.ptd_path)):
        if path is not None:
            loader = LocalFileLoader(path)
            files.append(SourceFile(role, loader, None, read_container(loader)))  # type: ignore[arg-type]
    return MergedNamedDataMap(files)


def keyed_fixtures() -> list[str]:
    return [fx.name for fx in all_fixtures() if any(fx.facts[r]["named_data"] for r in fx.facts)]


class Probe(BackendInterface):
    """Runs ``action(named_map, output)`` once."""

    def __init__(self, action: Any, name: str = "XnnpackBackend") -> None:
        self.name = name
        self.action = action

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        self.action(context.get_named_data_map(), output)


def run(name: str, action: Any, tmp_path: Path) -> ptestore.SpecializationReport:
    fx = get_fixture(name)
    assert fx.pte_path is not None
    ptd = (fx.ptd_path, tmp_path / "out.ptd") if fx.ptd_path else None
    return ptestore.specialize(
        fx.pte_path, tmp_path / "out.pte", ptd=ptd, backends=[Probe(action)], allow_unchanged=True
    )


# -- problem 1: dtype and shape for every key ---------------------------------------


@pytest.mark.parametrize("name", keyed_fixtures())
def test_every_key_of_every_fixture_has_tensor_info_matching_its_size(name: str) -> None:
    m = merged(name)
    assert len(m) > 0
    for key in m:
        info = m.get_tensor_info(key)
        assert info is not None, f"{name}: {key}"
        assert info.nbytes == m.stored_size(key), f"{name}: {key} {info}"
        assert info.source in ("xnnpack", "program", "ptd")


def test_xnnpack_float_model_info() -> None:
    m = merged("mlp_xnnpack")
    got = {(i.dtype, i.shape, i.source) for i in map(m.get_tensor_info, m) if i is not None}
    assert got == {
        ("float32", (32, 16), "xnnpack"),
        ("float32", (32,), "xnnpack"),
        ("float32", (8, 32), "xnnpack"),
        ("float32", (8,), "xnnpack"),
    }
    key = next(k for k in m if m.get_tensor_info(k).shape == (32, 16))  # type: ignore[union-attr]
    info = m.get_tensor_info(key)
    assert info is not None
    assert info.where == "forward[0] xvalues[1]"
    assert info.quantization is None and info.role == "tensor" and info.other_uses == ()
    # The legacy accessor keeps answering as before: .pte named data has no layout.
    assert m.get_tensor_layout(key) is None


def test_conv_weights_are_described_in_their_stored_layout() -> None:
    m = merged("conv_xnnpack")
    shapes = sorted(i.shape for i in map(m.get_tensor_info, m) if i is not None)
    assert (8, 3, 3, 3) in shapes and (16, 3, 3, 8) in shapes  # OHWI, not OIHW (16, 8, 3, 3)


def test_static_quantized_model_info() -> None:
    m = merged("quant_xnnpack")
    infos = {k: m.get_tensor_info(k) for k in m}
    weights = [i for i in infos.values() if i and i.dtype == "qint8_per_channel"]
    biases = [i for i in infos.values() if i and i.dtype == "qint32_per_channel"]
    scales = {k: i for k, i in infos.items() if i and i.role == "scale"}
    assert sorted(w.shape for w in weights) == [(8, 32), (32, 16)]
    assert sorted(b.shape for b in biases) == [(8,), (32,)]
    assert len(scales) == 4 and all(k.startswith("scale_") for k in scales)
    w = next(w for w in weights if w.shape == (32, 16))
    q = w.quantization
    assert q is not None
    assert (q.scheme, q.channel_axis, q.num_scales, q.scale_dtype) == (
        "per_channel",
        0,
        32,
        "float32",
    )
    assert q.scale_key in scales
    s = scales[q.scale_key]
    assert (s.dtype, s.shape, s.nbytes, s.scales_for) == ("float32", (32,), 128, s.scales_for)
    assert s.scales_for is not None and infos[s.scales_for] == w


def test_scale_alias_keys_are_told_apart_and_share_storage() -> None:
    m = merged("scale_alias_xnnpack")
    scale_key = next(k for k in m if k.startswith("scale_"))
    bias_key = scale_key[len("scale_") :]
    bias, scale = m.get_tensor_info(bias_key), m.get_tensor_info(scale_key)
    assert bias is not None and scale is not None
    assert (bias.dtype, bias.shape, bias.role) == ("float32", (32,), "tensor")
    assert (scale.dtype, scale.shape, scale.role) == ("float32", (32,), "scale")
    assert m.get_shared_keys(bias_key) == (scale_key,)
    assert m.get_shared_keys(scale_key) == (bias_key,)
    weight = next(k for k in m if k not in (bias_key, scale_key))
    assert m.get_shared_keys(weight) == ()
    assert m.get_tensor_info(weight).dtype == "qint8_per_channel"  # type: ignore[union-attr]


def test_external_program_tensors_and_ptd_layouts() -> None:
    m = merged("mlp_portable_ext")
    info = m.get_tensor_info("fc1.weight")
    assert info is not None
    assert (info.dtype, info.shape, info.nbytes, info.source) == (
        "float32",
        (32, 16),
        2048,
        "program",
    )
    assert info.where == "forward values[0]"
    # The .ptd layout says the same, so it is not another use.
    assert info.other_uses == ()
    # The .pte alone describes its EXTERNAL tensors (the keys its .ptd must provide).
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None
    loader = LocalFileLoader(fx.pte_path)
    alone = describe_tensors(read_container(loader), loader)
    assert sorted(alone) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert alone["fc1.weight"] == info


def test_ptd_layout_is_the_description_when_the_program_has_none() -> None:
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    ptd = read_container(LocalFileLoader(fx.ptd_path))
    # A .pte that describes nothing (an XNNPACK program with no EXTERNAL tensors) next
    # to the .ptd: the layouts answer.
    other = get_fixture("mlp_xnnpack")
    assert other.pte_path is not None
    loader = LocalFileLoader(other.pte_path)
    index = describe_tensors(read_container(loader), loader, ptd)
    info = index["fc2.bias"]
    assert (info.dtype, info.shape, info.source) == ("float32", (8,), "ptd")
    assert info.where.endswith("named_data 'fc2.bias'")


def test_keys_without_description_are_none_and_unknown_keys_raise() -> None:
    m = merged("mlp_xnnpack_ext")
    with pytest.raises(KeyError):
        m.get_tensor_info("no-such-key")
    # The .ptd of the XNNPACK model has no layouts: given with an unrelated .pte, its keys
    # are described by nothing.
    fx = get_fixture("mlp_xnnpack_ext")
    portable = get_fixture("mlp_portable")
    assert fx.ptd_path is not None and portable.pte_path is not None
    pl = LocalFileLoader(portable.pte_path)
    dl = LocalFileLoader(fx.ptd_path)
    lonely = MergedNamedDataMap(
        [
            SourceFile("pte", pl, None, read_container(pl)),  # type: ignore[arg-type]
            SourceFile("ptd", dl, None, read_container(dl)),  # type: ignore[arg-type]
        ]
    )
    assert len(lonely) == 4
    assert all(lonely.get_tensor_info(k) is None for k in lonely)
    arr = lonely.get_array(lonely.keys()[0])
    assert arr.dtype == np.uint8 and arr.shape == (lonely.stored_size(lonely.keys()[0]),)
    assert "no dtype or shape is recorded" in lonely.describe(lonely.keys()[0])


def test_conflicting_descriptions_are_kept_as_other_uses() -> None:
    a = TensorInfo("float32", (8,), 32, "xnnpack", "forward[0] xvalues[1]")
    same = TensorInfo("float32", (8,), 32, "xnnpack", "forward[1] xvalues[4]")
    b = TensorInfo("qint32_per_channel", (8,), 32, "xnnpack", "forward[0] xvalues[3]")
    index = TensorIndex([("k", a), ("k", same), ("k", b), ("j", b)])
    assert index["k"].other_uses == (b,)
    assert index["k"].dtype == "float32"
    assert index["j"].other_uses == ()
    assert len(index) == 2 and set(index) == {"k", "j"}


def test_many_descriptions_of_one_key_are_capped() -> None:
    # A key that thousands of descriptions name differently (XNNPACK graphs of one .pte
    # can) lists the first MAX_OTHER_USES of them and counts the rest: the merge used to
    # compare each with every earlier one and list them all in every report.
    descs = [
        ("k", TensorInfo("float32", (i,), 4 * i, "xnnpack", f"g xvalues[{i}]")) for i in range(3000)
    ]
    index = TensorIndex(descs + descs)
    info = index["k"]
    assert info.shape == (0,)
    assert [o.shape for o in info.other_uses] == [(i,) for i in range(1, MAX_OTHER_USES + 1)]
    assert info.more_uses == 3000 - 1 - MAX_OTHER_USES
    obj = info.to_json()
    assert len(obj["other_uses"]) == MAX_OTHER_USES and obj["more_uses"] == info.more_uses  # type: ignore[arg-type]


def test_tensor_info_json() -> None:
    m = merged("quant_xnnpack")
    info = next(i for i in map(m.get_tensor_info, m) if i and i.quantization)
    obj = json.loads(json.dumps(info.to_json()))
    assert obj["dtype"] == info.dtype and obj["shape"] == list(info.shape)
    assert obj["quantization"]["scheme"] == "per_channel"
    assert obj["quantization"]["scale_key"].startswith("scale_")


# -- get_array ----------------------------------------------------------------------


def test_get_array_float32_is_a_zero_copy_read_only_view() -> None:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    data = fx.pte_path.read_bytes()
    loader = BytesLoader(data)
    m = MergedNamedDataMap([SourceFile("pte", loader, None, read_container(loader))])  # type: ignore[arg-type]
    key = next(k for k in m if m.get_tensor_info(k).shape == (32, 16))  # type: ignore[union-attr]
    arr = m.get_array(key)
    assert arr.dtype == np.float32 and arr.shape == (32, 16)
    assert not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        arr[0, 0] = 1.0
    raw = bytes(m.get_data(key))
    assert arr.tobytes() == raw
    assert np.shares_memory(arr, np.frombuffer(data, np.uint8))


def test_get_array_quantized_and_scales() -> None:
    m = merged("quant_xnnpack")
    w = next(k for k in m if m.get_tensor_info(k).dtype == "qint8_per_channel")  # type: ignore[union-attr]
    arr = m.get_array(w)
    assert arr.dtype == np.int8 and arr.shape == m.get_tensor_info(w).shape  # type: ignore[union-attr]
    q = m.get_tensor_info(w).quantization  # type: ignore[union-attr]
    assert q is not None and q.scale_key is not None
    scales = m.get_array(q.scale_key)
    assert scales.dtype == np.float32 and scales.shape == (arr.shape[0],)
    assert (scales > 0).all()
    bias = next(k for k in m if m.get_tensor_info(k).dtype == "qint32_per_channel")  # type: ignore[union-attr]
    assert m.get_array(bias).dtype == np.int32


def test_array_view_rules() -> None:
    raw = bytes(range(24))
    # bfloat16: the bit patterns as uint16, with the shape.
    bf = array_view(raw, TensorInfo("bfloat16", (3, 4), 24, "ptd"), "k", "f")
    assert bf.dtype == np.uint16 and bf.shape == (3, 4)
    # 4-bit packed: raw bytes.
    q4 = array_view(raw, TensorInfo("qint4_per_channel", (4, 12), 24, "xnnpack"), "k", "f")
    assert q4.dtype == np.uint8 and q4.shape == (24,)
    # A dim order: a view in the logical shape over the stored (permuted) bytes.
    info = TensorInfo("uint8", (2, 3, 4), 24, "ptd", dim_order=(0, 2, 1))
    arr = array_view(raw, info, "k", "f")
    assert arr.shape == (2, 3, 4)
    stored = np.frombuffer(raw, np.uint8).reshape(2, 4, 3)
    assert (arr == stored.transpose(0, 2, 1)).all()
    assert np.shares_memory(arr, stored) or arr.base is not None
    # Trailing bytes are not part of the array; missing bytes are a FormatError.
    short = array_view(raw, TensorInfo("float32", (2,), 8, "ptd"), "k", "f")
    assert short.tolist() == np.frombuffer(raw[:8], np.float32).tolist()
    with pytest.raises(FormatError) as err:
        array_view(raw[:6], TensorInfo("float32", (2,), 8, "ptd", "x"), "k", "f.ptd")
    assert str(err.value) == (
        "f.ptd: named data 'k' (size) = 6: must be >= 8 bytes (float32 [2], described by ptd x)"
    )
    # A scalar type ptestore does not know: nbytes 0, and the array is all the bytes.
    odd_info = scalar_type_info(99, (6,), (0,), "program", "forward values[0]")
    assert (odd_info.dtype, odd_info.nbytes) == ("scalar_type_99", 0)
    odd = array_view(raw, odd_info, "k", "f")
    assert odd.dtype == np.uint8 and odd.shape == (24,)
    c64 = array_view(raw[:16], scalar_type_info(9, (2,), (0,), "ptd", ""), "k", "f")
    assert c64.dtype == np.complex64 and c64.shape == (2,)


def test_array_view_refuses_a_shape_the_array_cannot_take() -> None:
    for shape, count in (((-1, 0), 0), ((0, -3), 0), ((1,) * 65, 1), ((2**31,) * 8 + (0,), 0)):
        info = TensorInfo("uint8", shape, count, "ptd", "x")
        with pytest.raises(FormatError) as err:
            array_view(b"\0" * 8, info, "k", "f.ptd")
        value = str(list(shape))  # the message shows 80 characters of a longer one
        if len(value) > 80:
            value = f"{value[:80]}... ({len(value)} characters)"
        assert str(err.value) == (
            f"f.ptd: named data 'k' (shape) = {value}: must be at most 64 dims, each "
            f">= 0, that {count} uint8 elements can take (uint8 {list(shape)}, described by "
            "ptd x)"
        )
    assert array_view(b"\0", TensorInfo("uint8", (1,) * 64, 1, "ptd"), "k", "f").ndim == 64


def test_get_array_of_a_negative_described_dim_is_a_format_error() -> None:
    # mlp_portable_ext's EXTERNAL tensor value for fc1.weight says sizes [-1, 0].
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    pte = bytearray(fx.pte_path.read_bytes())
    view = FlatView(
        bytes(pte), "x", limit=read_container(BytesLoader(bytes(pte))).container.metadata_size
    )
    values = view.root("Program").vector(1, "plans", 4).table(0).vector(2, "values", 4)  # type: ignore[union-attr]
    for i in range(values.length):  # type: ignore[union-attr]
        t = values.table(i).table(1, "val")  # type: ignore[union-attr]
        extra = None if t is None else t.table(9, "extra_tensor_info")
        if extra is not None and extra.string(1, "fqn") == "fc1.weight":
            sizes = t.vector(2, "sizes", 4)  # type: ignore[union-attr]
            struct.pack_into("<ii", pte, sizes.start, -1, 0)  # type: ignore[union-attr]
            break
    else:
        raise AssertionError("no fc1.weight")
    files = []
    for role, data, name in (
        ("pte", bytes(pte), "m.pte"),
        ("ptd", fx.ptd_path.read_bytes(), "m.ptd"),
    ):
        loader = BytesLoader(data, name)
        files.append(SourceFile(role, loader, None, read_container(loader)))  # type: ignore[arg-type]
    m = MergedNamedDataMap(files)
    assert m.get_tensor_info("fc1.weight").shape == (-1, 0)  # type: ignore[union-attr]
    with pytest.raises(FormatError) as err:
        m.get_array("fc1.weight")
    assert str(err.value) == (
        "m.ptd: named data 'fc1.weight' (shape) = [-1, 0]: must be at most 64 dims, each >= 0, "
        "that 0 float32 elements can take (float32 [-1, 0], described by program forward "
        "values[0])"
    )


def _module_level_numpy_imports(tree: ast.Module) -> list[int]:
    lines = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                break
            names = (
                [a.name for a in sub.names]
                if isinstance(sub, ast.Import)
                else [sub.module or ""]
                if isinstance(sub, ast.ImportFrom)
                else []
            )
            if any(n == "numpy" or n.startswith("numpy.") for n in names):
                lines.append(sub.lineno)
    return lines


def test_ptestore_imports_numpy_only_where_an_array_is_made() -> None:
    # (The flatbuffers runtime itself imports numpy when it is installed; ptestore's own
    # modules do not, so get_array is the only place that needs it.)
    offenders = []
    for path in sorted((REPO / "ptestore").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        offenders += [f"{path.relative_to(REPO)}:{n}" for n in _module_level_numpy_imports(tree)]
    assert offenders == []


# -- the backend API -------------------------------------------------------------------


def test_backends_see_tensor_info_through_the_api(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def action(named: NamedDataMap, output: BackendDataWriter) -> None:
        for key in named:
            seen[key] = (named.get_tensor_info(key), named.get_array(key).shape)

    run("quant_xnnpack", action, tmp_path)
    assert len(seen) == 8
    assert {i.dtype for i, _ in seen.values()} == {
        "qint8_per_channel",
        "qint32_per_channel",
        "float32",
    }
    assert all(shape == info.shape for info, shape in seen.values())
    assert isinstance(next(iter(seen.values()))[0].quantization, QuantParams | None)


# -- problem 2: the size guard -----------------------------------------------------------


def _bias_key(m: MergedNamedDataMap) -> str:
    return next(k for k in m if m.get_tensor_info(k).shape == (32,))  # type: ignore[union-attr]


def test_a_value_that_grows_by_four_bytes_is_refused(tmp_path: Path) -> None:
    key = _bias_key(merged("mlp_xnnpack"))

    def action(named: NamedDataMap, output: BackendDataWriter) -> None:
        output.write_named_data(key, BackendData(bytes(named.get_data(key)) + b"\0" * 4))

    with pytest.raises(InvalidReplacement) as err:
        run("mlp_xnnpack", action, tmp_path)
    assert str(err.value) == (
        f"backend 'XnnpackBackend' (format.test_tensor_info:Probe), key {key!r}: size change "
        "refused: the value is "
        "float32 [32], 128 bytes (from xnnpack forward[0] xvalues[2]), the replacement 132 "
        "bytes; pass BackendData(..., allow_size_change=True) if the change is deliberate "
        "(packed or compiled data your runtime reads in its own format)"
    )
    assert not (tmp_path / "out.pte").exists()


def test_size_guard_names_what_is_known_for_an_undescribed_key(tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    portable = get_fixture("mlp_portable")
    assert fx.ptd_path is not None and portable.pte_path is not None
    key = get_fixture("mlp_xnnpack_ext").facts["ptd"]["named_data"][0]["key"]
    size = fx.facts["ptd"]["segments"][0]["size"]

    # A portable .pte has no delegate to call a backend for, so drive the session directly.
    from ptestore.coordinator.report import BackendReport
    from ptestore.coordinator.run import Run
    from ptestore.coordinator.session import Session
    from ptestore.coordinator.spool import Spool

    pl, dl = LocalFileLoader(portable.pte_path), LocalFileLoader(fx.ptd_path)
    files = [
        SourceFile("pte", pl, None, read_container(pl)),  # type: ignore[arg-type]
        SourceFile("ptd", dl, None, read_container(dl)),  # type: ignore[arg-type]
    ]
    spool = Spool(str(tmp_path))
    try:
        session = Session(Run(files, spool, None), "Any", BackendReport("Any", "*", "specialized"))
        with pytest.raises(InvalidReplacement) as err:
            session.replace_named(key, BackendData(b"\0" * 8))
        assert f"the value is {size} bytes; no dtype or shape is recorded for this key" in str(
            err.value
        )
        session.replace_named(key, BackendData(b"\0" * 8, allow_size_change=True))
        with pytest.raises(InvalidReplacement) as err:
            session.replace_named(
                next(k for k in session.named_data_map if k != key),
                BackendData(b"\0" * 8, allow_size_change="yes"),  # type: ignore[arg-type]
            )
        assert "BackendData.allow_size_change must be True or False, got 'yes'" in str(err.value)
    finally:
        spool.close()


def test_deliberate_size_change_and_processed_blobs_are_allowed(tmp_path: Path) -> None:
    key = _bias_key(merged("mlp_xnnpack"))

    class Grow(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(
            self, context: BackendDataInitContext, output: BackendDataWriter
        ) -> None:
            for item in context:
                output.write_processed_data(BackendData(bytes(item.processed) + b"x" * 12))
            output.write_named_data(key, BackendData(b"\1" * 40, allow_size_change=True))

    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    report = ptestore.specialize(fx.pte_path, tmp_path / "out.pte", backends=[Grow()])
    assert report.backends[0].keys_replaced == [key]
    out = merged_from(tmp_path / "out.pte")
    assert out.stored_size(key) == 40
    # The graph still describes the key as before: its size is the backend's business now.
    assert out.get_tensor_info(key).nbytes == 128  # type: ignore[union-attr]


def merged_from(path: Path) -> MergedNamedDataMap:
    loader = LocalFileLoader(path)
    return MergedNamedDataMap([SourceFile("pte", loader, None, read_container(loader))])  # type: ignore[arg-type]


def test_same_size_replacements_need_no_flag(tmp_path: Path) -> None:
    def action(named: NamedDataMap, output: BackendDataWriter) -> None:
        for key in named:
            output.write_named_data(key, BackendData((named.get_array(key) * 0).tobytes()))

    report = run("mlp_xnnpack", action, tmp_path)
    assert len(report.backends[0].keys_replaced) == 4


def test_the_bf16_example_rounds_only_plain_float32(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    try:
        from examples.bf16_round import Bf16Round, round_to_bf16
    finally:
        sys.path.remove(str(REPO))
    vals = np.array([1.0, 1.00390625, 1.01171875, -3.14159, 1e-30], np.float32)
    got = round_to_bf16(vals)
    assert (got.view(np.uint32) & 0xFFFF == 0).all()
    assert got.tolist()[:3] == [1.0, 1.0, 1.015625]  # ties to even, then up
    for name, expect in [("mlp_xnnpack", 4), ("quant_xnnpack", 0), ("scale_alias_xnnpack", 0)]:
        fx = get_fixture(name)
        assert fx.pte_path is not None
        report = ptestore.specialize(
            fx.pte_path,
            tmp_path / f"{name}.pte",
            backends=[Bf16Round()],
            allow_unchanged=True,
            provenance=False,
        )
        assert len(report.backends[0].keys_replaced) == expect, name
        if expect == 0:
            assert report.backends[0].status != "specialized"  # it declined
            assert (tmp_path / f"{name}.pte").read_bytes() == fx.pte_path.read_bytes()


# -- hostile XNNPACK blobs ---------------------------------------------------------------


def _blob(name: str) -> bytes:
    fx = get_fixture(name)
    assert fx.pte_path is not None
    data = fx.pte_path.read_bytes()
    c = read_container(BytesLoader(data)).container
    seg = c.segments[c.delegates[0].index]
    return data[c.absolute(seg) : c.absolute(seg) + seg.size]


def test_xnn_header() -> None:
    blob = _blob("quant_xnnpack")
    hdr = parse_xnn_header(blob[:30], len(blob), "b")
    assert hdr is not None and hdr.flatbuffer_offset == 32
    assert xnngraph_span(blob[:30], len(blob), "b") == (32, hdr.flatbuffer_size)
    assert parse_xnn_header(b"\0" * 30, 30, "b") is None  # no magic: all FlatBuffer
    assert xnngraph_span(b"\0" * 30, 99, "b") == (0, 99)
    bad = bytearray(blob[:30])
    struct.pack_into("<I", bad, 14, len(blob))
    with pytest.raises(FormatError) as err:
        parse_xnn_header(bytes(bad), len(blob), "m.pte (blob)")
    assert str(err.value) == (
        f"m.pte (blob): XNNHeader.flatbuffer_size = {len(blob)}: must be >= 8 with "
        f"flatbuffer_offset 32 + size inside the {len(blob)}-byte blob"
    )
    with pytest.raises(FormatError, match=r"XNNHeader \(blob size\) = 20: must be >= 30 bytes"):
        parse_xnn_header(blob[:20], 20, "m.pte")
    bad = bytearray(blob[:30])
    struct.pack_into("<H", bad, 8, 12)
    with pytest.raises(FormatError, match=r"XNNHeader.length = 12: must be >= 30"):
        parse_xnn_header(bytes(bad), len(blob), "m.pte")
    bad = bytearray(blob[:30])
    struct.pack_into("<I", bad, 18, 40)
    with pytest.raises(FormatError, match=r"XNNHeader.constant_data_offset = 40: must be after"):
        parse_xnn_header(bytes(bad), len(blob), "m.pte")
    bad = bytearray(blob[:30])
    struct.pack_into("<I", bad, 10, 4)
    with pytest.raises(FormatError, match=r"XNNHeader.flatbuffer_offset = 4: must be >= the"):
        parse_xnn_header(bytes(bad), len(blob), "m.pte")


def _graph(name: str) -> bytes:
    blob = _blob(name)
    off, size = xnngraph_span(blob[:30], len(blob), "b")
    return blob[off : off + size]


def test_xnngraph_errors_name_the_field() -> None:
    g = bytearray(_graph("mlp_xnnpack"))
    g[4:8] = b"ZZ99"
    with pytest.raises(FormatError) as err:
        parse_xnngraph(bytes(g), "m.pte (blob)")
    assert str(err.value) == (
        "m.pte (blob): XNNGraph file identifier (bytes 4..8) = b'ZZ99': must be b'XN01' or b'XN00'"
    )
    # A constant_buffer_idx past constant_data.
    b = flatbuffers.Builder(0)
    b.StartObject(7)
    b.PrependUint32Slot(3, 9, 0)
    tv = b.EndObject()
    b.StartObject(2)
    b.PrependUint8Slot(0, 1, 0)
    b.PrependUOffsetTRelativeSlot(1, tv, 0)
    xv = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(xv)
    vec = b.EndVector()
    b.StartObject(9)
    b.PrependUOffsetTRelativeSlot(2, vec, 0)
    b.Finish(b.EndObject(), file_identifier=b"XN01")
    with pytest.raises(FormatError) as err:
        parse_xnngraph(bytes(b.Output()), "s")
    assert str(err.value) == (
        "s: XNNGraph.xvalues[0].xvalue_union.constant_buffer_idx = 9: must be < 0 (entries in "
        "XNNGraph.constant_data)"
    )


def test_named_constant_with_an_offset_is_refused() -> None:
    b = flatbuffers.Builder(0)
    key = b.CreateString("k")
    b.StartObject(3)
    b.PrependUint64Slot(0, 16, 0)
    b.PrependUint64Slot(1, 4, 0)
    b.PrependUOffsetTRelativeSlot(2, key, 0)
    cd = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(cd)
    vec = b.EndVector()
    b.StartObject(9)
    b.PrependUOffsetTRelativeSlot(8, vec, 0)
    b.Finish(b.EndObject(), file_identifier=b"XN01")
    with pytest.raises(FormatError) as err:
        parse_xnngraph(bytes(b.Output()), "s")
    assert str(err.value) == (
        "s: XNNGraph.constant_data[0].offset = 16: must be UINT64_MAX for an entry with a "
        "named_key ('k')"
    )


GRAPHS = [_graph(n) for n in ("mlp_xnnpack", "quant_xnnpack", "scale_alias_xnnpack")]


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(GRAPHS),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 1 << 16),
)
def test_mutated_xnngraphs_raise_only_format_error(
    graph: bytes, edits: list[tuple[int, int]], cut: int
) -> None:
    g = bytearray(graph)
    for pos, val in edits:
        g[pos % len(g)] = val
    g = g[: max(8, len(g) - cut % 64)]
    try:
        for c in parse_xnngraph(bytes(g), "fuzz"):
            assert c.info.nbytes >= 0
    except FormatError:
        pass


def test_hostile_blob_surfaces_as_format_error_from_get_tensor_info() -> None:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    data = bytearray(fx.pte_path.read_bytes())
    c = read_container(BytesLoader(bytes(data))).container
    start = c.absolute(c.segments[c.delegates[0].index])
    struct.pack_into("<I", data, start + 14, 1 << 30)  # flatbuffer_size past the blob
    loader = BytesLoader(bytes(data), name="bad.pte")
    m = MergedNamedDataMap([SourceFile("pte", loader, None, read_container(loader))])  # type: ignore[arg-type]
    with pytest.raises(FormatError) as err:
        m.get_tensor_info(m.keys()[0])
    assert str(err.value).startswith(
        "bad.pte (XnnpackBackend blob of forward[0], segment 1): XNNHeader.flatbuffer_size = "
    )
    assert "tensor info unavailable: bad.pte" in m.describe(m.keys()[0])


# -- how many dims a description may have --------------------------------------------------
# A 1 MB .ptd whose one layout had 250,000 dims of 2**31-1 made inspect take 130 s (the
# element count a growing big-int product); 600 such dims made inspect --json crash.


def test_a_layout_with_too_many_dims_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = synth.flat_tensor([("w", (6, [1] * MAX_ARRAY_DIMS, []))])
    assert read_container(BytesLoader(ok)).container.named_data[0].tensor_layout.sizes == (  # type: ignore[union-attr]
        (1,) * MAX_ARRAY_DIMS
    )
    path = tmp_path / "dims.ptd"
    path.write_bytes(synth.flat_tensor([("w", (6, [2**31 - 1] * 1000, []))]))
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"ptestore inspect: error: {path}: FlatTensor.named_data[0].tensor_layout.sizes "
        "(length) = 1000: must be <= 64 dims (ptestore's limit; ExecuTorch's runtime takes "
        "at most 16)\n"
    )


def test_a_layout_larger_than_any_file_is_refused() -> None:
    ok = synth.flat_tensor([("w", (6, [2**31 - 1, 2**31 - 1, 0], []))])  # no elements
    assert read_container(BytesLoader(ok)).container.named_data[0].key == "w"
    data = synth.flat_tensor([("w", (6, [2**31 - 1] * 3, []))])
    with pytest.raises(FormatError) as err:
        read_container(BytesLoader(data, name="big.ptd"))
    assert str(err.value) == (
        "big.ptd: FlatTensor.named_data[0].tensor_layout.sizes = [2147483647, 2147483647, "
        "2147483647]: must be dims whose product (the element count) is < 2**64 (a tensor "
        "larger than any file)"
    )


def _sizes_length_at(data: bytes, external: bool) -> int:
    """Where the length of the first EXTERNAL tensor value's sizes vector of a .pte is."""
    c = read_container(BytesLoader(data)).container
    plan = FlatView(data, "x", limit=c.metadata_size).root("Program").vector(1, "p", 4)
    values = plan.table(0).vector(2, "values", 4)  # type: ignore[union-attr]
    for i in range(values.length):  # type: ignore[union-attr]
        t = values.table(i).table(1, "val")  # type: ignore[union-attr]
        extra = None if t is None else t.table(9, "extra")
        if extra is not None and extra.scalar(2, "location", "u8") == int(external):
            return t.vector(2, "sizes", 4).start - 4  # type: ignore[union-attr]
    raise AssertionError("no such tensor")


def test_program_and_xnnpack_dims_past_the_limit_are_refused() -> None:
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None
    data = bytearray(fx.pte_path.read_bytes())
    struct.pack_into("<I", data, _sizes_length_at(bytes(data), True), 65)
    loader = BytesLoader(bytes(data), name="ext.pte")
    with pytest.raises(FormatError) as err:
        describe_tensors(read_container(loader), loader)
    assert re.fullmatch(
        r"ext.pte: Program.execution_plan\[0\].values\[\d+\].val.sizes \(length\) = 65: must be "
        r"<= 64 dims \(ptestore's limit; ExecuTorch's runtime takes at most 16\)",
        str(err.value),
    ), str(err.value)
    graph = bytearray(_graph("mlp_xnnpack") + bytes(256))  # room for 65 dims
    xv = FlatView(graph, "g", limit=len(graph)).root("XNNGraph").vector(2, "xvalues", 4)
    for i in range(xv.length):  # type: ignore[union-attr]
        value = xv.table(i).table(1, "xvalue_union")  # type: ignore[union-attr]
        dims = None if value is None else value.vector(2, "dims", 4)
        if dims is not None and value is not None and value.scalar(3, "idx", "u32"):
            struct.pack_into("<I", graph, dims.start - 4, 65)
            break
    with pytest.raises(FormatError) as err:
        parse_xnngraph(bytes(graph), "m.pte (blob)")
    assert re.fullmatch(
        r"m.pte \(blob\): XNNGraph.xvalues\[\d+\].xvalue_union.dims \(length\) = 65: must be "
        r"<= 64 dims \(ptestore's limit; ExecuTorch's runtime takes at most 16\)",
        str(err.value),
    ), str(err.value)


# -- what inspect --json shows -----------------------------------------------------------


def test_named_data_json_for_inspect() -> None:
    fx = get_fixture("quant_xnnpack")
    assert fx.pte_path is not None
    loader = LocalFileLoader(fx.pte_path)
    rows = named_data_json(read_container(loader), loader)
    assert [r["key"] for r in rows] == [e["key"] for e in fx.facts["pte"]["named_data"]]
    sizes = {s["index"]: s["size"] for s in fx.facts["pte"]["segments"]}
    assert all(r["size"] == sizes[r["segment_index"]] for r in rows)  # type: ignore[index]
    assert rows[0]["tensor_info"]["dtype"] == "qint8_per_channel"  # type: ignore[index]
    json.dumps(rows)
    ext = get_fixture("mlp_portable_ext")
    assert ext.ptd_path is not None
    ptd = LocalFileLoader(ext.ptd_path)
    rows = named_data_json(read_container(ptd), ptd)
    first = rows[0]["tensor_info"]
    assert first["source"] == "ptd" and first["shape"] == [32, 16]  # type: ignore[index]
    assert first["where"].endswith("named_data 'fc1.weight'")  # type: ignore[index]
    # A .ptd without layouts (XNNPACK external weights) on its own: sizes, no info.
    x = get_fixture("mlp_xnnpack_ext")
    assert x.ptd_path is not None
    xl = LocalFileLoader(x.ptd_path)
    assert all(r["tensor_info"] is None for r in named_data_json(read_container(xl), xl))


# -- docs/backends.md's worked example, run as written ------------------------------------


def _doc_blocks() -> list[str]:
    text = (REPO / "docs" / "backends.md").read_text()
    section = text[text.index("## A worked example") : text.index("## Naming and registering")]
    return re.findall(r"```(?:python)?\n(.*?)```", section, flags=re.S)


def test_worked_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shell = next(b for b in _doc_blocks() if b.startswith("python -m ptestore specialize"))
    script = shell.replace("python ", f"{sys.executable} ")
    done = subprocess.run(
        ["bash", "-euc", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "[bf16] round 9eed8098f924a1e1efe5 (float32 [32, 16])" in done.stderr
    out = merged_from(tmp_path / "mlp_bf16.pte")
    src = merged_from(REPO / "examples" / "mlp_xnnpack.pte")
    for key in out:
        a, b = out.get_array(key), src.get_array(key)
        assert a.shape == b.shape and not np.array_equal(a, b)
        assert (a.view(np.uint32) & 0xFFFF == 0).all()
    code = next(b for b in _doc_blocks() if b.startswith("import ptestore"))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(ast.literal_eval(done.stdout)) == sorted(src.keys())


XNN_FILES = [
    get_fixture(n).pte_path.read_bytes()  # type: ignore[union-attr]
    for n in ("mlp_xnnpack", "quant_xnnpack", "scale_alias_xnnpack", "mlp_portable_ext")
]


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(XNN_FILES),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_models_describe_or_raise_format_error(
    data: bytes, edits: list[tuple[float, int]]
) -> None:
    buf = bytearray(data)
    for where, val in edits:
        buf[min(len(buf) - 1, int(where * len(buf)))] = val
    loader = BytesLoader(bytes(buf), name="fuzz.pte")
    try:
        index = describe_tensors(read_container(loader), loader)
    except FormatError:
        return
    for key, info in index.items():
        assert isinstance(key, str) and info.nbytes >= 0
        json.dumps(info.to_json())


def test_command_backend_gets_tensor_info_and_may_change_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptestore.backends.command import CommandBackend

    script = tmp_path / "pack.py"
    script.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['PTESTORE_TENSOR_INFO'])\n"
        "data = sys.stdin.buffer.read()\n"
        "log = open(os.environ['LOG'], 'a')\n"
        "print(os.environ['PTESTORE_KIND'], info and info['dtype'], info and info['shape'],"
        " file=log)\n"
        "sys.stdout.buffer.write(data + b'pad' if info else b'')\n"
    )
    log = tmp_path / "log.txt"
    backend = CommandBackend([sys.executable, str(script)], processed=False)
    backend.name = "XnnpackBackend"
    fx = get_fixture("quant_xnnpack")
    assert fx.pte_path is not None
    monkeypatch.setenv("LOG", str(log))
    report = ptestore.specialize(fx.pte_path, tmp_path / "out.pte", backends=[backend])
    lines = log.read_text().splitlines()
    assert "named_data qint8_per_channel [32, 16]" in lines
    assert len(lines) == 8 and len(report.backends[0].keys_replaced) == 8
    out = merged_from(tmp_path / "out.pte")
    assert all(out.stored_size(k) == out.get_tensor_info(k).nbytes + 3 for k in out)  # type: ignore[union-attr]
