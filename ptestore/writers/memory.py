"""In memory, over fsspec's ``memory://`` filesystem: a faithful, fast fake.

Guarantees (within one process, which is the whole world of ``memory://``):

- **Atomic**: staging is a private ``bytearray``; publish installs one complete
  ``MemoryFile`` into ``MemoryFileSystem.store`` with a single assignment. Readers that
  opened the previous object keep it.
- **Durable**: no (memory).
- **Isolated**: nothing is visible under the destination before publish; the live store
  is never opened for writing.
- **No-clobber**: ``mode="create"`` checks and installs under a module-level lock shared
  by every :class:`MemoryWriter`, so concurrent ptestore publishers see exactly one
  winner. (Other code writing the store directly does not take that lock.)
- **Compare-and-swap**: an object's version token is ``"sha256:<hex>"`` of its bytes,
  as for local files, computed when asked: a change made in place (fsspec's own
  ``open(path, "ab")`` or ``"r+b"`` hand out the stored ``MemoryFile`` itself) is a new
  version, and equal bytes are the same version (republished, or deleted and made
  again), as they are locally and for S3's ETag. ``mode="if-match"`` compares and
  installs under the same lock.
- **Cleanup**: discard and garbage collection drop the buffer.
"""

from __future__ import annotations

import hashlib
import threading
from typing import ClassVar

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from ..errors import StorageError
from ..storage.types import StorageURL
from .base import (
    DataWriter,
    PublishMode,
    PublishResult,
    Versioned,
    WriterGuarantees,
    already_exists,
    version_conflict,
)

__all__ = ["MemoryWriter", "memory_current_version", "memory_read_versioned"]

#: Serializes every MemoryWriter publish (check + install) in this process.
_PUBLISH_LOCK = threading.Lock()


def _token(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _key(fs: MemoryFileSystem, url: str) -> str:
    """The store key of ``url`` as the loader reads it: the path
    :func:`~ptestore.storage.types.split_url` gives (``MEMORY://x/m.pte`` is
    ``/x/m.pte`` in any letter case, where fsspec's ``_strip_protocol`` strips a
    lower-case ``memory://`` only), as fsspec's methods then take it; a bare path as
    fsspec takes it."""
    u = StorageURL.of(url)
    key: str = fs._strip_protocol(u.path if u.protocol == "memory" else url)
    return key


def _version_locked(fs: MemoryFileSystem, path: str) -> str | None:
    """The version token of the object at ``path`` (lock held; None: no object)."""
    obj = fs.store.get(path)
    if obj is None:
        return None
    with obj.getbuffer() as view:  # released at once: the object stays resizable
        return _token(view)


def memory_read_versioned(
    url: str, fs: MemoryFileSystem | None = None, max_bytes: int | None = None
) -> Versioned:
    """The bytes at ``memory://`` ``url`` and their version token, read at once (none
    of them past ``max_bytes``: its ``oversize``)."""
    fs = fs if fs is not None else MemoryFileSystem()
    with _PUBLISH_LOCK:
        obj = fs.store.get(_key(fs, url))
        data = None if obj is None else bytes(obj.getvalue())
    if data is None:
        return Versioned(b"", None)
    if max_bytes is not None and len(data) > max_bytes:
        return Versioned(b"", _token(data), len(data))
    return Versioned(data, _token(data))


def memory_current_version(url: str, fs: MemoryFileSystem | None = None) -> str | None:
    """The version token of the object at ``memory://`` ``url`` (None: no object)."""
    fs = fs if fs is not None else MemoryFileSystem()
    with _PUBLISH_LOCK:
        return _version_locked(fs, _key(fs, url))


class _MemoryStaging:
    def __init__(self) -> None:
        self.buf = bytearray()

    def cleanup(self) -> None:
        self.buf = bytearray()


class MemoryWriter(DataWriter):
    """Writer for ``memory://`` URLs.

    Parameters
    ----------
    url:
        ``memory://path`` (or a bare path inside the memory filesystem).
    fs:
        The :class:`~fsspec.implementations.memory.MemoryFileSystem` to publish into
        (default: fsspec's shared instance; all instances share one class-level store).
    """

    guarantees: ClassVar[WriterGuarantees] = WriterGuarantees(
        atomic_publish=True, exclusive_create=True, durable=False, conditional_update=True
    )
    options: ClassVar[frozenset[str]] = frozenset({"fs"})

    def __init__(self, url: str, *, fs: MemoryFileSystem | None = None) -> None:
        self.fs: MemoryFileSystem = fs if fs is not None else MemoryFileSystem()
        self.path: str = _key(self.fs, url)
        super().__init__(url if "://" in url else f"memory://{self.path.lstrip('/')}")
        self._st = _MemoryStaging()
        self._track_staging(self._st)

    @property
    def staged_size(self) -> int:
        """Bytes held in the private staging buffer (for tests and diagnostics)."""
        return len(self._st.buf)

    def _write(self, data: memoryview, offset: int) -> None:
        buf = self._st.buf
        end = offset + data.nbytes
        try:
            if end > len(buf):
                buf.extend(bytes(end - len(buf)))
            buf[offset:end] = data
        except MemoryError:
            raise StorageError(
                f"{self.url}: cannot hold {end} bytes in memory (write of {data.nbytes} bytes "
                f"at offset {offset})"
            ) from None

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        fs, path = self.fs, self.path
        obj = MemoryFile(fs, path, bytes(self._st.buf))
        version = _token(self._st.buf)
        self._commit_point()  # outside the lock: a paused writer must not block the others
        with _PUBLISH_LOCK:
            if path in fs.pseudo_dirs or any(k.startswith(path + "/") for k in fs.store):
                raise StorageError(f"{self.url}: is a directory, not an object")
            parent = path
            while len(parent) > 1:
                parent = fs._parent(parent)
                if parent in fs.store:
                    raise StorageError(f"{self.url}: parent {parent} is an object, not a directory")
            if mode == "create" and path in fs.store:
                raise already_exists(self.url)
            if mode == "if-match":
                found = _version_locked(fs, path)
                if found != self._expected:
                    assert self._expected is not None
                    raise version_conflict(self.url, self._expected, found)
            fs.store[path] = obj  # the one step that makes the object visible
        self._st.cleanup()
        return PublishResult(url=self.url, size=size, etag=version)
