"""A staging file (descriptor and path) shared by the local and the generic writer."""

from __future__ import annotations

import os
import threading

from .._oserror import local_error
from ..errors import StorageError
from ..storage.types import strerror

__all__ = ["FileStaging", "current_umask"]

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask (from ``/proc``, else read by setting it, under a lock)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


class FileStaging:
    """A staging file: its descriptor and name. Knows nothing of the writer.

    ``cleanup()`` unlinks the file unless it was :meth:`mark_published` (renamed or
    linked into place) and closes the descriptor; it is idempotent.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd: int | None = fd
        self.published = False

    def fileno(self) -> int:
        """The open descriptor (raises once closed)."""
        if self.fd is None:
            raise StorageError(f"{self.path}: staging file is closed")
        return self.fd

    def close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def mark_published(self) -> None:
        """The file now lives under the destination name: never unlink it."""
        self.published = True
        self.close_fd()

    def cleanup(self) -> None:
        try:
            if not self.published:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise local_error(
                        exc, f"{self.path}: cannot remove staging file: {strerror(exc)}"
                    ) from exc
        finally:
            self.published = True
            self.close_fd()
