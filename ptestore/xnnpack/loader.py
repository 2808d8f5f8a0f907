"""Load an artifact in this process with a verified packed-weight file (tests, Python apps).

The native piece must be loaded before the bindings' extension: call :func:`load` before
anything imports ``executorch.extension.pybindings``. When the extension was imported
first, the first method run proves the options did not reach the runtime and
:class:`ConfigurationError` says so (nothing wrong was run: the method ran without the
cache, as the bindings always do).

What is checked is what the runtime gets: :func:`load` opens the ``.pte``, the ``.ptd``
and the packed-weight file before checking them, verifies those descriptors
(:mod:`.pinned`), and hands the runtime the same inodes (``/proc/self/fd/N``), held until
:meth:`XnnpackProgram.close`. The runtime opens the packed-weight file only when a method
first loads (its first run), long after the check: just before each method loads, the
inodes are checked unchanged since (device, inode, size, mtime, ctime: a write, chmod,
removal or rename changes one). A file removed, replaced or changed in between is refused
with :class:`IntegrityError`: the runtime never re-creates it, nor is handed another file.
A method already loaded holds what it was given: later runs check nothing (the file may
be released, replaced by the next version or evicted meanwhile).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, IntegrityError
from .cache import CacheFile, verify_pinned
from .native import bindings, build_shim
from .pinned import PinnedArtifact
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
    """The module and the descriptors of what was verified (the packed-weight file, the
    ``.pte`` and ``.ptd``), released in that order (by :meth:`XnnpackProgram.close`, or
    when the program is collected): the runtime keeps one weights cache per path while
    methods use it, so the number ``/proc/self/fd/N`` names must not be another file's
    while this program's methods live."""

    __slots__ = ("artifact", "fd", "module")

    def __init__(self, module: Any, fd: int | None, artifact: PinnedArtifact | None) -> None:
        self.module = module
        self.fd = fd
        self.artifact = artifact

    def release(self) -> None:
        self.module = None
        fd, self.fd = self.fd, None
        artifact, self.artifact = self.artifact, None
        try:
            if fd is not None:
                os.close(fd)
        finally:
            if artifact is not None:
                artifact.close()

    def __del__(self) -> None:
        self.release()


class XnnpackProgram:
    """A program loaded by the stock runtime, with (or without) a packed-weight file."""

    def __init__(
        self,
        module: Any,
        cache: CacheFile | None,
        lib: Any,
        held: int | None = None,
        artifact: PinnedArtifact | None = None,
    ) -> None:
        self._loaded = _Loaded(module, held, artifact)
        self._name = None if artifact is None else artifact.pte  # (for repr, once closed)
        self.cache = cache
        self._lib = lib
        self._checked = cache is None
        # the verified file's descriptor's stamp, checked before each method loads
        self._stamp = None if held is None else stamp(os.fstat(held))
        # the methods the runtime has loaded (given the file, or not: see run)
        self._methods: set[str] = set()

    def __repr__(self) -> str:
        what = "" if self._name is None else f" {self._name}"
        state = "closed" if self._loaded.module is None else f"methods={sorted(self._methods)}"
        cache = None if self.cache is None else self.cache.path
        return f"<XnnpackProgram{what} cache={cache} {state}>"

    @property
    def _module(self) -> Any:
        return self._loaded.module

    def _runtime_path(self, method: str) -> bytes:
        """The path the runtime opens as ``method`` loads: the verified inode, which,
        with the artifact's, is still unchanged."""
        fd = self._loaded.fd
        assert self.cache is not None and fd is not None
        artifact = self._loaded.artifact
        changed = [] if artifact is None else artifact.changed()
        if changed:
            raise IntegrityError(
                f"{changed[0]}: removed, replaced or changed since load() verified it; "
                f"method {method!r} not loaded (load it again)",
                published=False,
            )
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
        return os.fsencode(os.path.abspath(self.cache.path))

    @property
    def method_names(self) -> list[str]:
        return list(self._module.method_names())

    def run(self, method: str, inputs: Sequence[Any]) -> list[Any]:
        """Run ``method`` on ``inputs`` (torch tensors or numpy arrays); its outputs as
        numpy arrays. The first run of a method loads it: only then is the packed-weight
        file checked and handed to the runtime."""
        import numpy as np
        import torch

        from .child import as_array

        args = [
            torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
            for a in inputs
        ]
        with _lock:
            if self._module is None:
                raise ConfigurationError("the program was closed")
            loading = method not in self._methods
            # this thread's loads (2) and loads given the options (3), so that another
            # thread's load is never taken for this method's
            seen, added = self._lib.ptestore_xnn_count(2), self._lib.ptestore_xnn_count(3)
            configured = loading and self.cache is not None
            if configured:
                _configure(self._lib, self._runtime_path(method))
            try:
                results = self._module.run_method(method, args)
            finally:
                if configured:
                    self._lib.ptestore_xnn_configure(b"")
                if loading and self._lib.ptestore_xnn_count(2) != seen:
                    self._methods.add(method)  # loaded, even if its run failed
            if configured and not self._checked:
                if self._lib.ptestore_xnn_count(3) == added:
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


def _configure(lib: Any, path: bytes) -> None:
    """The native piece told to give the runtime ``path`` for the loads that follow in
    this thread; a path it refuses (longer than the runtime's option value) is a
    :class:`ConfigurationError`, never a load without the file."""
    if lib.ptestore_xnn_configure(path) != 0:
        limit = lib.ptestore_xnn_max_path()
        raise ConfigurationError(
            f"{os.fsdecode(path)}: too long for the runtime's packed_cache_path option "
            f"({len(path)} bytes, at most {limit})"
        )


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
    published, see :func:`verify_cache`) and only then given to the runtime.

    With ``cache``, the ``.pte``, ``.ptd`` and packed-weight file are opened before they
    are checked, and the runtime is given those inodes (descriptors held until
    :meth:`~XnnpackProgram.close`). Methods load on first run; one of these files removed,
    replaced or changed since raises :class:`IntegrityError` at the method's first run
    instead of being re-created (or read changed) by the runtime."""
    if cache is None:
        lib = _shim()
        portable_lib = bindings()
        plain = None if ptd is None else os.path.abspath(ptd)
        module = _load_module(portable_lib, os.path.abspath(pte), plain)
        return XnnpackProgram(module, None, lib)
    path = cache.path if isinstance(cache, CacheFile) else Path(cache)
    artifact = PinnedArtifact(pte, ptd)
    held: int | None = None
    try:
        held = _hold(path)
        before = None if held is None else stamp(os.fstat(held))
        verified = verify_pinned(path, artifact, pte_sha256, ptd_sha256, full)
        _same_inode(path, held, before)
        changed = artifact.changed()
        if changed:
            raise IntegrityError(
                f"{changed[0]}: removed, replaced or changed while load() verified it",
                published=False,
            )
        lib = _shim()
        portable_lib = bindings()
        module = _load_module(portable_lib, artifact.pte_path, artifact.ptd_path)
        return XnnpackProgram(module, verified, lib, held, artifact)
    except BaseException:
        if held is not None:
            os.close(held)
        artifact.close()
        raise


def _load_module(portable_lib: Any, pte: str, ptd: str | None) -> Any:
    if ptd is None:
        return portable_lib._load_for_executorch(pte)
    return portable_lib._load_for_executorch(pte, ptd)


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
