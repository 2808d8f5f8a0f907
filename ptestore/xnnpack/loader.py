"""Load an artifact in this process with a verified packed-weight file (tests, Python apps).

The native piece must be loaded before the bindings' extension: call :func:`load` before
anything imports ``executorch.extension.pybindings``. When the extension was imported
first, the first method run proves the options did not reach the runtime and
:class:`ConfigurationError` says so (nothing wrong was run: the method ran without the
cache, as the bindings always do).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .cache import CacheFile, verify_cache
from .native import bindings, build_shim

__all__ = ["XnnpackProgram", "load"]

_lock = threading.Lock()
_lib: Any = None


def _shim() -> Any:
    global _lib
    with _lock:
        if _lib is None:
            import torch  # noqa: F401  (the bindings' libraries come with it)

            from .child import open_shim

            shim = build_shim()
            _lib = open_shim(str(shim.path), str(shim.build.runtime_library))
        return _lib


class XnnpackProgram:
    """A program loaded by the stock runtime, with (or without) a packed-weight file."""

    def __init__(self, module: Any, cache: CacheFile | None, lib: Any) -> None:
        self._module = module
        self.cache = cache
        self._lib = lib
        self._checked = cache is None

    @property
    def method_names(self) -> list[str]:
        return list(self._module.method_names())

    def run(self, method: str, inputs: Sequence[Any]) -> list[Any]:
        """Run ``method`` on ``inputs`` (torch tensors or numpy arrays); its outputs as
        numpy arrays."""
        import numpy as np
        import torch

        from .child import as_array

        args = [
            torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
            for a in inputs
        ]
        with _lock:
            before = self._lib.ptestore_xnn_count(1)
            if self.cache is not None:
                self._lib.ptestore_xnn_configure(os.fsencode(self.cache.path))
            try:
                results = self._module.run_method(method, args)
            finally:
                self._lib.ptestore_xnn_configure(b"")
            if not self._checked:
                if self._lib.ptestore_xnn_count(1) == before:
                    raise ConfigurationError(
                        "the XNNPACK options did not reach the runtime: "
                        "executorch.extension.pybindings was imported before "
                        "ptestore.xnnpack.load (call load first, in a fresh process)"
                    )
                self._checked = True
        return [as_array(r) for r in results]

    def close(self) -> None:
        self._module = None

    def __enter__(self) -> XnnpackProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    pte: str | os.PathLike[str],
    *,
    ptd: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | CacheFile | None = None,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    full: bool = True,
) -> XnnpackProgram:
    """Load ``pte`` (with ``ptd``) through the stock runtime; with ``cache`` (a path or a
    :class:`CacheFile`) the file is verified first (:func:`verify_cache`: record, size,
    SHA-256, identity; ``full=False`` skips the SHA-256 of a file unchanged since it was
    published, see :func:`verify_cache`) and only then given to the runtime. Methods load
    on first run."""
    verified: CacheFile | None = None
    if cache is not None:
        path = cache.path if isinstance(cache, CacheFile) else Path(cache)
        verified = verify_cache(
            path, pte=pte, ptd=ptd, pte_sha256=pte_sha256, ptd_sha256=ptd_sha256, full=full
        )
    lib = _shim()
    portable_lib = bindings()
    pte_path = os.path.abspath(os.fspath(pte))
    if ptd is None:
        module = portable_lib._load_for_executorch(pte_path)
    else:
        module = portable_lib._load_for_executorch(pte_path, os.path.abspath(os.fspath(ptd)))
    return XnnpackProgram(module, verified, lib)
