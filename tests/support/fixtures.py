"""Access to the committed real-exporter fixtures in ``tests/fixtures/``.

Plain Python + numpy + json: importable without torch or executorch.  The files and facts are
produced by ``scripts/make_fixtures.py``; see ``tests/fixtures/manifest.json``.

Tensors are stored in the JSON as ``{"dtype": "float32", "shape": [...], "data": [...]}``
(float32 values survive the float64 JSON round trip exactly).
"""

from __future__ import annotations

import functools
import json
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
            outputs_runtime=_decode_per_method(d["outputs_runtime"]),
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
        outputs_runtime=_decode_per_method(raw.get("outputs_runtime")),
        atol=float(tol.get("atol", 0.0)),
        rtol=float(tol.get("rtol", 0.0)),
        facts=raw["facts"],
        segment_field_presence=raw["segment_field_presence"],
        extras=raw.get("extras", {}),
        doubled=doubled,
        runtime_errors=dict(raw.get("runtime_errors", {})),
        raw=raw,
    )


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
