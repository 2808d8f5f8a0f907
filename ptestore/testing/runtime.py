"""Run a program in the real ExecuTorch runtime and compare its outputs with a reference.

This is test tooling: it imports ``executorch`` (and ``torch``) lazily, inside these
functions, and only here; the library itself never does. Install them with the
``interop`` extra (``pip install ptestore[interop]``). :func:`runtime_unavailable` says
why the runtime cannot be used (None when it can), for a ``pytest.skip`` reason.

Programs run in this process (the import costs a few seconds once; each load is fast).
A program the runtime cannot load raises :class:`RuntimeFailure`; one that crashes the
runtime (a native fault) ends the process, as it would in an app.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "RuntimeFailure",
    "assert_outputs_match",
    "compare_outputs",
    "run_in_runtime",
    "runtime_unavailable",
]

Source = str | os.PathLike[str] | bytes | bytearray | memoryview


class RuntimeFailure(AssertionError):
    """The ExecuTorch runtime refused to load or run a program (its message is kept)."""


def runtime_unavailable() -> str | None:
    """Why the ExecuTorch runtime cannot be used here, or None when it can."""
    for module in ("torch", "executorch"):
        if importlib.util.find_spec(module) is None:
            return (
                f"the ExecuTorch runtime is not installed (no {module!r} module); "
                "install ptestore[interop]"
            )
    try:
        from executorch.extension.pybindings import (  # type: ignore[import-untyped]
            portable_lib,  # noqa: F401
        )
    except Exception as exc:  # a broken install: say what broke
        return f"the ExecuTorch runtime cannot be imported: {type(exc).__name__}: {exc}"
    return None


def _bytes(src: Source) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    return Path(src).read_bytes()


def run_in_runtime(
    pte: Source,
    ptd: Source | None = None,
    *,
    inputs: Mapping[str, Sequence[np.ndarray]],
) -> dict[str, list[np.ndarray]]:
    """Load ``pte`` (with its ``ptd``) once and run each method of ``inputs`` on its
    inputs; the outputs per method, as numpy arrays.

    ``pte``/``ptd`` are paths or bytes. Raises :class:`RuntimeFailure` with the
    runtime's message when it refuses the program or a method."""
    import numpy as np
    import torch

    from ..xnnpack.native import bindings

    portable_lib = bindings()
    pte_bytes = _bytes(pte)
    ptd_bytes = None if ptd is None else _bytes(ptd)
    name = os.fspath(pte) if not isinstance(pte, (bytes, bytearray, memoryview)) else "<bytes>"
    try:
        if ptd_bytes is None:
            module = portable_lib._load_for_executorch_from_buffer(pte_bytes)
        else:
            module = portable_lib._load_for_executorch_from_buffer(pte_bytes, ptd_bytes)
    except Exception as exc:
        raise RuntimeFailure(f"{name}: the ExecuTorch runtime cannot load it: {exc}") from exc
    out: dict[str, list[np.ndarray]] = {}
    for method, args in inputs.items():
        tensors = tuple(torch.from_numpy(np.array(a, copy=True)) for a in args)
        try:
            results: Any = module.run_method(method, tensors)
        except Exception as exc:
            raise RuntimeFailure(f"{name}: method {method!r} failed in the runtime: {exc}") from exc
        out[method] = [
            r.detach().cpu().clone().numpy() if isinstance(r, torch.Tensor) else np.asarray(r)
            for r in results
        ]
    del module  # the buffers must outlive the module: drop it first
    return out


def compare_outputs(
    actual: Mapping[str, Sequence[np.ndarray]],
    reference: Mapping[str, Sequence[np.ndarray]],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    values: bool = True,
) -> list[str]:
    """What differs between two sets of outputs (method -> arrays), ``[]`` when every
    output of every reference method has the same shape and dtype and (unless
    ``values=False``) is within ``atol + rtol * |reference|``."""
    import numpy as np

    problems: list[str] = []
    for method, want in reference.items():
        got = actual.get(method)
        if got is None:
            problems.append(f"method {method!r}: no outputs")
            continue
        if len(got) != len(want):
            problems.append(f"method {method!r}: {len(got)} outputs, expected {len(want)}")
            continue
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            where = f"method {method!r} output {i}"
            if g.shape != w.shape or g.dtype != w.dtype:
                problems.append(
                    f"{where}: {g.dtype} {list(g.shape)}, expected {w.dtype} {list(w.shape)}"
                )
            elif values and not np.allclose(g, w, atol=atol, rtol=rtol):
                err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
                problems.append(
                    f"{where}: max abs difference {err:.3g} exceeds atol={atol} rtol={rtol}"
                )
    return problems


def assert_outputs_match(
    pte: Source,
    ptd: Source | None = None,
    *,
    inputs: Mapping[str, Sequence[np.ndarray]],
    reference: Mapping[str, Sequence[np.ndarray]],
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> dict[str, list[np.ndarray]]:
    """Run the program (:func:`run_in_runtime`) and raise ``AssertionError`` listing every
    output that differs from ``reference`` (:func:`compare_outputs`); the outputs."""
    outputs = run_in_runtime(pte, ptd, inputs=inputs)
    problems = compare_outputs(outputs, reference, atol=atol, rtol=rtol)
    if problems:
        raise AssertionError("outputs differ from the reference: " + "; ".join(problems))
    return outputs
