"""Access to the committed real-exporter fixtures in ``tests/fixtures/``.

Plain Python + numpy + json: importable without torch or executorch.  The files and facts are
produced by ``scripts/make_fixtures.py``; see ``tests/fixtures/manifest.json``.

Tensors are stored in the JSON as ``{"dtype": "float32", "shape": [...], "data": [...]}``
(float32 values survive the float64 JSON round trip exactly).

Runtime outputs are bit-exact only on one kind of CPU: XNNPACK picks its micro-kernels by
the processor's features (AVX-512 or AVX2, FMA, ...), and those differ in the last bits of a
float32 sum. So ``outputs_runtime`` (of a fixture and of its doubled copy) is this
machine's answer: on first use, every runnable fixture and every doubled copy runs once in
the real runtime (one child process), each answer is checked against the stored one within
``MACHINE_RTOL``/``MACHINE_ATOL`` (a real change fails loudly), and the tests compare
ptestore's outputs bit for bit with that. Without ExecuTorch the stored answers stand.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES_DIR: Path = Path(__file__).resolve().parent.parent / "fixtures"
MANIFEST_PATH: Path = FIXTURES_DIR / "manifest.json"


def decode_tensor(obj: dict[str, Any]) -> np.ndarray:
    """Inverse of ``scripts/make_fixtures.py``'s tensor encoding."""
    arr = np.array(obj["data"], dtype=np.dtype(obj["dtype"]))
    return arr.reshape(tuple(obj["shape"]))


def _decode_per_method(obj: dict[str, list[dict[str, Any]]] | None) -> dict[str, list[np.ndarray]]:
    if not obj:
        return {}
    return {m: [decode_tensor(t) for t in ts] for m, ts in obj.items()}


MACHINE_RTOL = 1e-5
MACHINE_ATOL = 1e-6


class RuntimeOutputs(dict[str, list[np.ndarray]]):
    """method -> outputs in the real runtime; the stored ones until first read, then this
    machine's (see the module docstring). ``len``/``in``/``bool`` never run anything."""

    def __init__(self, stored: dict[str, list[np.ndarray]]) -> None:
        super().__init__(stored)
        self.stored = dict(stored)

    def __getitem__(self, method: str) -> list[np.ndarray]:
        _machine_outputs()
        return super().__getitem__(method)

    def get(self, method: str, default: Any = None) -> Any:
        _machine_outputs()
        return super().get(method, default)

    def values(self) -> Any:
        _machine_outputs()
        return super().values()

    def items(self) -> Any:
        _machine_outputs()
        return super().items()


@dataclass(frozen=True)
class Doubled:
    """The "double one weight" expectation.

    The float32 bytes at ``[offset_in_segment, offset_in_segment + nbytes)`` of segment
    ``segment_index`` of the ``file`` ("pte" or "ptd") are the portable bytes of ``param``
    (in ``layout``: "contiguous" or "channels_last").  ``key`` is the named-data key whose value
    is exactly that segment (None for a tensor inside a .pte constant segment, which has no key;
    ``keys_on_segment`` lists every key aliasing that segment).  Multiplying those float32 values
    by 2 must give ``outputs_eager`` (eager PyTorch with the weight doubled, within the fixture
    tolerance) and exactly ``outputs_runtime`` (the ExecuTorch runtime on the byte-doubled copy).
    """

    param: str
    file: str
    key: str | None
    keys_on_segment: list[str]
    segment_index: int
    offset_in_segment: int
    nbytes: int
    dtype: str
    layout: str
    outputs_eager: dict[str, list[np.ndarray]]
    outputs_runtime: dict[str, list[np.ndarray]]

    def apply(self, segment: bytes) -> bytes:
        """The segment's bytes with this weight doubled (float32 x 2)."""
        start, end = self.offset_in_segment, self.offset_in_segment + self.nbytes
        vals = np.frombuffer(segment[start:end], dtype=np.dtype(self.dtype)) * 2
        return segment[:start] + vals.astype(np.dtype(self.dtype)).tobytes() + segment[end:]

    def doubled_value(self, value: bytes) -> bytes:
        """For a keyed weight: the replacement value of ``key`` (whole segment doubled)."""
        return self.apply(value)


@dataclass(frozen=True)
class Fixture:
    name: str
    description: str
    features: list[str]
    thirdparty: bool
    pte_path: Path | None
    ptd_path: Path | None
    methods: list[str]
    inputs: dict[str, list[np.ndarray]]
    outputs_eager: dict[str, list[np.ndarray]]
    outputs_runtime: dict[str, list[np.ndarray]]
    atol: float
    rtol: float
    facts: dict[str, Any]  # {"pte": reference_facts, "ptd": reference_facts or absent}
    segment_field_presence: dict[str, list[dict[str, Any]]]
    extras: dict[str, Any]  # reference_program_extras of the .pte (constant segment, ...)
    doubled: Doubled | None
    # method -> error string for files the runtime refuses (thirdparty only), e.g. missing kernels
    runtime_errors: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def main_path(self) -> Path:
        """The .pte (or, for a thirdparty .ptd-only fixture, the .ptd)."""
        p = self.pte_path or self.ptd_path
        assert p is not None
        return p

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def runnable(self) -> bool:
        return bool(self.outputs_runtime)


@functools.lru_cache(maxsize=1)
def load_manifest() -> dict[str, Any]:
    with MANIFEST_PATH.open() as f:
        manifest: dict[str, Any] = json.load(f)
    return manifest


def fixture_names(*, include_thirdparty: bool = True) -> list[str]:
    return [
        e["name"]
        for e in load_manifest()["fixtures"]
        if include_thirdparty or not e.get("thirdparty", False)
    ]


@functools.cache
def get_fixture(name: str) -> Fixture:
    entry = next((e for e in load_manifest()["fixtures"] if e["name"] == name), None)
    if entry is None:
        raise KeyError(f"no fixture named {name!r} in {MANIFEST_PATH}")
    with (FIXTURES_DIR / entry["json"]).open() as f:
        raw: dict[str, Any] = json.load(f)
    base = FIXTURES_DIR
    d = raw.get("doubled")
    doubled = None
    if d is not None:
        doubled = Doubled(
            param=d["param"],
            file=d["file"],
            key=d["key"],
            keys_on_segment=list(d["keys_on_segment"]),
            segment_index=d["segment_index"],
            offset_in_segment=d["offset_in_segment"],
            nbytes=d["nbytes"],
            dtype=d["dtype"],
            layout=d["layout"],
            outputs_eager=_decode_per_method(d["outputs_eager"]),
            outputs_runtime=RuntimeOutputs(_decode_per_method(d["outputs_runtime"])),
        )
    tol = raw.get("tolerance", {})
    return Fixture(
        name=raw["name"],
        description=raw["description"],
        features=list(raw["features"]),
        thirdparty=bool(raw.get("thirdparty", False)),
        pte_path=base / raw["pte"] if raw.get("pte") else None,
        ptd_path=base / raw["ptd"] if raw.get("ptd") else None,
        methods=list(raw["methods"]),
        inputs=_decode_per_method(raw.get("inputs")),
        outputs_eager=_decode_per_method(raw.get("outputs_eager")),
        outputs_runtime=RuntimeOutputs(_decode_per_method(raw.get("outputs_runtime"))),
        atol=float(tol.get("atol", 0.0)),
        rtol=float(tol.get("rtol", 0.0)),
        facts=raw["facts"],
        segment_field_presence=raw["segment_field_presence"],
        extras=raw.get("extras", {}),
        doubled=doubled,
        runtime_errors=dict(raw.get("runtime_errors", {})),
        raw=raw,
    )


def copy_pte(dst: Path, name: str = "mlp_xnnpack") -> Path:
    """``dst``, a copy of fixture ``name``'s .pte (a source a test may change or delete)."""
    fx = get_fixture(name)
    assert fx.pte_path is not None
    shutil.copyfile(fx.pte_path, dst)
    return dst


def all_fixtures(*, include_thirdparty: bool = True) -> list[Fixture]:
    return [get_fixture(n) for n in fixture_names(include_thirdparty=include_thirdparty)]


def fixtures_with(feature: str) -> list[Fixture]:
    return [f for f in all_fixtures() if f.has(feature)]


def runnable_fixtures() -> list[Fixture]:
    """Fixtures with stored inputs and runtime outputs (all own fixtures, some thirdparty)."""
    return [f for f in all_fixtures() if f.runnable]


def refused_fixtures() -> list[Fixture]:
    """Fixtures the pip runtime refuses cleanly (stored ``runtime_errors``)."""
    return [f for f in all_fixtures() if f.runtime_errors]


def doubled_fixtures() -> list[Fixture]:
    return [f for f in all_fixtures() if f.doubled is not None]


def doubled_files(f: Fixture) -> tuple[bytes, bytes | None]:
    """(pte bytes, ptd bytes) of ``f`` with its doubled weight applied, located through the
    stored facts (which tests/interop/test_fixtures_sanity.py checks against ExecuTorch)."""
    assert f.doubled is not None
    d = f.doubled
    target = f.pte_path if d.file == "pte" else f.ptd_path
    assert target is not None
    data = target.read_bytes()
    facts = f.facts[d.file]
    base = facts["header"]["segment_base_offset"] if facts["header"] else 0
    seg = facts["segments"][d.segment_index]
    start = base + seg["offset"]
    new = data[:start] + d.apply(data[start : start + seg["size"]]) + data[start + seg["size"] :]
    pte = new if d.file == "pte" else (f.pte_path.read_bytes() if f.pte_path else b"")
    ptd = new if d.file == "ptd" else (f.ptd_path.read_bytes() if f.ptd_path else None)
    return pte, ptd


_MACHINE_DONE: list[bool] = []


def _machine_outputs() -> None:
    """Replace every stored runtime answer by this machine's, once per process."""
    if _MACHINE_DONE:
        return
    _MACHINE_DONE.append(True)
    import importlib.util

    if importlib.util.find_spec("executorch") is None:
        return
    from support.et_runtime import Job, run_programs

    jobs: list[Job] = []
    targets: list[tuple[str, RuntimeOutputs, str]] = []
    for f in all_fixtures():
        if not f.outputs_runtime or f.pte_path is None:
            continue
        assert isinstance(f.outputs_runtime, RuntimeOutputs)
        for m in f.outputs_runtime.stored:
            jobs.append(Job(f.pte_path, m, f.inputs[m], ptd=f.ptd_path, label=f.name))
            targets.append((f.name, f.outputs_runtime, m))
        if f.doubled is not None:
            assert isinstance(f.doubled.outputs_runtime, RuntimeOutputs)
            pte, ptd = doubled_files(f)
            for m in f.doubled.outputs_runtime.stored:
                jobs.append(Job(pte, m, f.inputs[m], ptd=ptd, load_mode="bytes", label=f.name))
                targets.append((f"{f.name} (doubled)", f.doubled.outputs_runtime, m))
    for (label, outputs, m), result in zip(targets, run_programs(jobs), strict=True):
        if result.outputs is None:
            _MACHINE_DONE.clear()
            raise AssertionError(f"{label}/{m}: {result.describe()}")
        stored = outputs.stored[m]
        assert len(result.outputs) == len(stored), f"{label}/{m}"
        for got, want in zip(result.outputs, stored, strict=True):
            np.testing.assert_allclose(
                got,
                want,
                rtol=MACHINE_RTOL,
                atol=MACHINE_ATOL,
                err_msg=f"{label}/{m}: this machine's runtime vs the stored outputs",
            )
        dict.__setitem__(outputs, m, result.outputs)
