"""The replacement spool: backend output held in a temporary file until layout is known."""

from __future__ import annotations

import tempfile
import threading

from .._io import pread_all, pwrite_all
from ..errors import StorageError
from ..storage.types import Buffer, strerror

__all__ = ["Buffer", "Spool"]


class Spool:
    """Append-only temporary file holding replacement bytes; a :class:`DataLoader`, so
    writers can ``copy_from`` it."""

    def __init__(self, directory: str | None) -> None:
        try:
            self._file = tempfile.TemporaryFile(prefix="ptestore-spool-", dir=directory)
        except OSError as exc:
            where = directory or tempfile.gettempdir()
            raise StorageError(
                f"cannot create the replacement spool in {where}: {strerror(exc)}"
            ) from exc
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
                raise StorageError(
                    f"cannot spool {view.nbytes} replacement bytes: {strerror(exc)}"
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

    def check_unchanged(self) -> None:
        """The spool is private to the run: nothing else can change it."""

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()
