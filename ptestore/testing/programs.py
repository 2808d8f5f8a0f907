"""Small real ExecuTorch programs shipped with ptestore, for backend tests.

Each was exported with the real exporter (torch 2.13.0, executorch 1.4.1, by ptestore's
``scripts/make_fixtures.py``) and comes with inputs and the runtime's outputs for every
method: :func:`shipped_programs` lists them, :func:`shipped_program` gets one by name.

=======================  ==============================================================
``mlp_xnnpack``          a float32 MLP on XNNPACK, weights as named data in the .pte
``quant_xnnpack``        the MLP int8-quantized (per-channel): int8 weights, int32
                         biases, ``scale_<sha256>`` keys
``scale_alias_xnnpack``  two keys naming identical bytes in one segment (a bias that is
                         also its weight's scales)
``shared_blob_xnnpack``  two methods whose delegates share one blob
``two_methods_xnnpack``  two methods, two blobs, one set of weights
``mlp_xnnpack_ext``      the MLP with its weights in a ``.ptd``
=======================  ==============================================================
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass

if TYPE_CHECKING:
    import numpy as np

__all__ = ["PROGRAMS_DIR", "Program", "shipped_program", "shipped_programs"]

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"


def _tensor(obj: dict[str, Any]) -> np.ndarray:
    import numpy as np

    array: np.ndarray = np.asarray(obj["data"], dtype=obj["dtype"]).reshape(obj["shape"])
    return array


@dataclass(frozen=True)
class Program:
    """One program: its files, and inputs and reference outputs per method."""

    name: str
    description: str
    pte: Path
    ptd: Path | None
    methods: tuple[str, ...]
    features: tuple[str, ...]
    #: method -> the inputs to run it on
    inputs: dict[str, list[np.ndarray]]
    #: method -> what the ExecuTorch runtime returns for the unspecialized program
    outputs: dict[str, list[np.ndarray]]
    atol: float
    rtol: float

    def has(self, feature: str) -> bool:
        return feature in self.features

    def __repr__(self) -> str:
        return f"Program({self.name!r})"


@lru_cache(maxsize=1)
def shipped_programs() -> tuple[Program, ...]:
    """Every shipped program."""
    doc = json.loads((PROGRAMS_DIR / "programs.json").read_text())
    out = []
    for p in doc["programs"]:
        out.append(
            Program(
                name=p["name"],
                description=p["description"],
                pte=PROGRAMS_DIR / p["pte"],
                ptd=PROGRAMS_DIR / p["ptd"] if p["ptd"] else None,
                methods=tuple(p["methods"]),
                features=tuple(p["features"]),
                inputs={m: [_tensor(t) for t in ts] for m, ts in p["inputs"].items()},
                outputs={m: [_tensor(t) for t in ts] for m, ts in p["outputs_runtime"].items()},
                atol=float(p["tolerance"]["atol"]),
                rtol=float(p["tolerance"]["rtol"]),
            )
        )
    return tuple(out)


def shipped_program(name: str) -> Program:
    """The shipped program called ``name`` (KeyError naming the known ones)."""
    for p in shipped_programs():
        if p.name == name:
            return p
    known = ", ".join(p.name for p in shipped_programs())
    raise KeyError(f"no shipped program {name!r}; known: {known}")
