"""Load an artifact in this process with a verified packed-weight file (tests, Python apps).

The native piece must be loaded before the bindings' extension: call :func:`load` before
anything imports ``executorch.extension.pybindings``. When the extension was imported
first, the first method run proves the options did not reach the runtime and
:class:`ConfigurationError` says so (nothing wrong was run: the method ran without the
cache, as the bindings always do).

The runtime opens the packed-weight file only when a method first runs, long after the
check: :func:`load` keeps a read-only descriptor of the file it verified and points the
runtime at that inode (``/proc/self/fd/N``), after checking at each first run that the
inode is unchanged since (device, inode, size, mtime, ctime: a write, chmod, removal or
rename changes one). A file removed, replaced or changed in between is refused with
:class:`IntegrityError`: the runtime never re-creates it, nor is handed another file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, IntegrityError
from .cache import CacheFile, verify_cache
from .native import bindings, build_shim
from .record import stamp

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


class _Loaded:
    """The module and the verified file's descriptor, released in that order (by
    :meth:`XnnpackProgram.close`, or when the program is collected): the runtime keeps
    one weights cache per path while methods use it, so the number ``/proc/self/fd/N``
    names must not be another file's while this program's methods live."""

    __slots__ = ("fd", "module")

    def __init__(self, module: Any, fd: int | None) -> None:
        self.module = module
        self.fd = fd

    def release(self) -> None:
        self.module = None
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


class XnnpackProgram:
    """A program loaded by the stock runtime, with (or without) a packed-weight file."""

    def __init__(
        self, module: Any, cache: CacheFile | None, lib: Any, held: int | None = None
    ) -> None:
        self._loaded = _Loaded(module, held)
        self.cache = cache
        self._lib = lib
        self._checked = cache is None
        # the verified file's descriptor's stamp, checked before each first run
        self._stamp = None if held is None else stamp(os.fstat(held))

    @property
    def _module(self) -> Any:
        return self._loaded.module

    def _runtime_path(self) -> bytes:
        """The path the runtime opens: the verified inode, still unchanged."""
        fd = self._loaded.fd
        assert self.cache is not None and fd is not None
        if stamp(os.fstat(fd)) != self._stamp:  # a write, chmod, unlink, rename
            raise IntegrityError(
                f"{self.cache.path}: removed, replaced or changed since load() verified it; "
                "not handed to the runtime (load it again)",
                published=False,
            )
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc):
            return os.fsencode(proc)
        try:  # no /proc: the path, while it still names the verified inode
            now = stamp(os.stat(self.cache.path, follow_symlinks=False))
        except FileNotFoundError:
            now = None
        if now != self._stamp:
            raise IntegrityError(
                f"{self.cache.path}: removed, replaced or changed since load() verified it; "
                "not handed to the runtime (load it again)",
                published=False,
            )
        return os.fsencode(self.cache.path)

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
            if self._module is None:
                raise ConfigurationError("the program was closed")
            if self.cache is not None:
                self._lib.ptestore_xnn_configure(self._runtime_path())
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
        self._loaded.release()

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
    on first run, from the inode verified here (a descriptor held until :meth:`close`);
    a file removed, replaced or changed since raises :class:`IntegrityError` at the
    method's first run instead of being re-created by the runtime."""
    verified: CacheFile | None = None
    held: int | None = None
    if cache is not None:
        path = cache.path if isinstance(cache, CacheFile) else Path(cache)
        held = _hold(path)
        try:
            before = None if held is None else stamp(os.fstat(held))
            verified = verify_cache(
                path, pte=pte, ptd=ptd, pte_sha256=pte_sha256, ptd_sha256=ptd_sha256, full=full
            )
            _same_inode(path, held, before)
        except BaseException:
            if held is not None:
                os.close(held)
            raise
    lib = _shim()
    portable_lib = bindings()
    pte_path = os.path.abspath(os.fspath(pte))
    if ptd is None:
        module = portable_lib._load_for_executorch(pte_path)
    else:
        module = portable_lib._load_for_executorch(pte_path, os.path.abspath(os.fspath(ptd)))
    return XnnpackProgram(module, verified, lib, held)


def _hold(path: Path) -> int | None:
    """A read-only descriptor of ``path`` taken before the check (None when it cannot be
    opened: the check then says what is wrong)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None


def _same_inode(path: Path, held: int | None, before: dict[str, int] | None) -> None:
    """The descriptor held is the file the check just verified, unchanged while it ran."""
    try:
        now = stamp(os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        now = None
    if held is None or not before == now == stamp(os.fstat(held)):
        raise IntegrityError(
            f"{path}: removed, replaced or changed while load() verified it", published=False
        )
