"""The replacement spool: backend output held in a temporary file until layout is known."""

from __future__ import annotations

import errno
import os
import threading
from typing import IO

from .._io import pread_all, preadinto_all, pwrite_all
from ..errors import StorageError
from ..storage.types import Buffer, strerror

__all__ = ["Buffer", "Spool"]


class Spool:
    """Append-only temporary file holding replacement bytes; a :class:`DataLoader`, so
    writers can ``copy_from`` it, and hashers read it a chunk per core."""

    #: :meth:`readinto` may be called from several threads at once (``preadv``).
    parallel_reads = True
    #: The directory the spool is in, named by a failed write (None: a journal, whose
    #: own messages name it).
    directory: str | None = None

    def __init__(self, directory: str | None) -> None:
        try:
            self._file = _unnamed_file(directory)
        except OSError as exc:
            raise StorageError(
                f"cannot create the replacement spool in {_where(directory)}: {strerror(exc)}"
            ) from exc
        self.directory = _where(directory)
        self._size = 0
        self.name = f"<replacement spool {self._file.name}>"
        self._lock = threading.Lock()

    def add(self, data: Buffer) -> int:
        """Append ``data``; returns the offset it was stored at."""
        view = memoryview(data).cast("B")
        with self._lock:
            offset = self._size
            try:
                pwrite_all(self._file.fileno(), view, offset)
            except OSError as exc:
                where = "" if self.directory is None else f" in {self.directory}{_MOVE}"
                raise StorageError(
                    f"cannot spool {view.nbytes} replacement bytes{where}: {strerror(exc)}"
                ) from exc
            self._size += view.nbytes
            return offset

    # -- DataLoader protocol -----------------------------------------------------
    def size(self) -> int:
        return self._size

    def load(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self._size:
            raise StorageError(f"{self.name}: read of {size} bytes at {offset} out of range")
        out = pread_all(self._file.fileno(), size, offset)
        if len(out) != size:
            raise StorageError(f"{self.name}: short read")
        return out

    def readinto(self, offset: int, buffer: memoryview) -> None:
        """Fill all of ``buffer`` with the bytes at ``offset``, read straight into it."""
        size = buffer.nbytes
        if offset < 0 or offset + size > self._size:
            raise StorageError(f"{self.name}: read of {size} bytes at {offset} out of range")
        try:
            got = preadinto_all(self._file.fileno(), buffer, offset)
        except OSError as exc:
            raise StorageError(
                f"{self.name}: read of {size} bytes at {offset} failed: {strerror(exc)}"
            ) from exc
        if got != size:
            raise StorageError(f"{self.name}: short read")

    def check_unchanged(self) -> None:
        """The spool is private to the run: nothing else can change it."""

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()


def _where(directory: str | None) -> str:
    """The spool's directory: ``directory``, else the system's temporary directory
    (where ``None`` puts it; :mod:`tempfile` is imported then anyway)."""
    if directory is not None:
        return directory
    import tempfile

    return tempfile.gettempdir()


#: How to put the spool elsewhere, said when a write to it fails.
_MOVE = (
    " (the replacement spool, where replaced bytes wait until the layout is known; "
    "spool_dir=, --spool-dir DIR, or TMPDIR put it on another file system)"
)

#: ``O_TMPFILE`` refused for these reasons: the file system cannot make unnamed files.
_NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


def _unnamed_file(directory: str | None) -> IO[bytes]:
    """A temporary file in ``directory`` that has no name (gone when closed, or when the
    process dies): ``O_TMPFILE`` where the system and file system have it, else
    :func:`tempfile.TemporaryFile` (which does the same, at the cost of importing
    :mod:`tempfile` and :mod:`random` on every run)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if directory is not None and flag:
        try:
            fd = os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in _NO_TMPFILE:
                raise
        else:
            return os.fdopen(fd, "r+b")
    import tempfile

    return tempfile.TemporaryFile(prefix="ptestore-spool-", dir=directory)
