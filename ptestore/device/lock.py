"""An advisory lock per cache key: ``fcntl.flock`` on a lock file in the cache directory.

The kernel releases a ``flock`` when the last descriptor of its open file is closed, so a
process that dies while holding the lock (SIGKILL included) never blocks the others. A
lock file may be removed by whoever holds it exclusively (eviction, ``cache clear``): a
waiter that then gets the lock on the removed file sees that the path now names another
file (or none) and tries again, so two processes never both believe they hold the key.
"""

from __future__ import annotations

import errno
import fcntl
import os
from types import TracebackType

from ..errors import StorageError

__all__ = ["KeyLock"]


class KeyLock:
    """``with KeyLock(path, shared=False):`` holds the lock file ``path`` (created if
    missing) shared or exclusively. ``blocking=False``: :meth:`acquire` returns False
    instead of waiting."""

    def __init__(self, path: str, *, shared: bool = False, blocking: bool = True) -> None:
        self.path = path
        self.shared = shared
        self.blocking = blocking
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        if not self.blocking:
            op |= fcntl.LOCK_NB
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StorageError(
                    f"{self.path}: cannot open the cache lock file: {exc.strerror}"
                ) from exc
            try:
                fcntl.flock(fd, op)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise StorageError(
                    f"{self.path}: cannot lock the cache lock file: {exc.strerror}"
                ) from exc
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)  # removed by its holder while we waited: lock the new one

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def remove(self) -> None:
        """Remove the lock file (only while holding it exclusively), then release."""
        if self._fd is not None and not self.shared:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.release()

    def __enter__(self) -> KeyLock:
        if not self.acquire():
            raise StorageError(f"{self.path}: lock is held by another process")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
