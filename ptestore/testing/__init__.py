"""Test kit shipped with ptestore: the writer and backend contract suites, small real
programs, a read-only named data reader, a runtime runner, and two S3 test servers
(moto, SeaweedFS).

- Writers: subclass :class:`WriterContract` (:mod:`.writer_contract`).
- Backends: subclass :class:`BackendContract` (:mod:`.backend_contract`), read a model's
  named data with :func:`open_named_data`, run a program in the ExecuTorch runtime and
  compare its outputs with :func:`assert_outputs_match` (:mod:`.runtime`).

Both kits come with a pytest plugin (:mod:`.pytest_plugin`, a ``pytest11`` entry point
that pytest loads wherever ptestore is installed): the markers the kits use,
the S3 test servers as fixtures (``s3_server``, ``moto_s3``, ``seaweedfs_s3``) and the
kits' asserts rewritten, so a vendor's test file needs only the import of its kit.

Exports load lazily (the contracts import pytest).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees (``__getattr__`` below gives it Any)
    from .backend_contract import BackendContract
    from .named_data import NamedData, open_named_data
    from .programs import Program, shipped_program, shipped_programs
    from .runtime import (
        assert_outputs_match,
        compare_outputs,
        run_in_runtime,
        runtime_unavailable,
    )
    from .writer_contract import WriterContract

__all__ = [
    "BackendContract",
    "NamedData",
    "Program",
    "assert_outputs_match",
    "backend_contract",
    "compare_outputs",
    "moto",
    "named_data",
    "open_named_data",
    "programs",
    "pytest_plugin",
    "run_in_runtime",
    "runtime",
    "runtime_unavailable",
    "s3server",
    "seaweedfs",
    "shipped_program",
    "shipped_programs",
    "WriterContract",
    "writer_contract",
]

_EXPORTS = {
    "BackendContract": ".backend_contract",
    "WriterContract": ".writer_contract",
    "NamedData": ".named_data",
    "open_named_data": ".named_data",
    "Program": ".programs",
    "shipped_program": ".programs",
    "shipped_programs": ".programs",
    "assert_outputs_match": ".runtime",
    "compare_outputs": ".runtime",
    "run_in_runtime": ".runtime",
    "runtime_unavailable": ".runtime",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
