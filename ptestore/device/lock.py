"""An advisory lock per cache key: ``fcntl.flock`` on a lock file in the cache directory.

The kernel releases a ``flock`` when the last descriptor of its open file is closed, so a
process that dies while holding the lock (SIGKILL included) never blocks the others. A
lock file may be removed by whoever holds it exclusively (eviction, ``cache clear``): a
waiter that then gets the lock on the removed file sees that the path now names another
file (or none) and tries again, so two processes never both believe they hold the key.

How long a blocking lock waits is unbounded unless a caller set a limit for its context
(:func:`wait_limit`, what ``ensure(lock_timeout=...)`` does): then it retries a
non-blocking lock until the limit and raises :class:`~ptestore.errors.LockTimeout`
naming the lock file and, where ``/proc/locks`` shows it, the holder's pid.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import ParamSpec, TypeVar

from ..errors import ConfigurationError, LockTimeout, StorageError
from ..storage.flock import still_at

__all__ = ["KeyLock", "check_timeout", "holder_pid", "wait_limit", "with_lock_timeout"]

P = ParamSpec("P")
R = TypeVar("R")

#: The limit of this context, seconds and the deadline (``time.monotonic``) every
#: blocking :class:`KeyLock` in it shares (None: wait forever).
_LIMIT: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "ptestore_lock_timeout", default=None
)
#: Pause between tries of a lock with a time limit (growing to the last).
_PAUSES = (0.001, 0.005, 0.02, 0.05, 0.1)


def check_timeout(value: object, name: str = "lock_timeout") -> float | None:
    """``value`` as a lock-wait limit in seconds: None (wait forever) or a finite
    number >= 0; else :class:`~ptestore.errors.ConfigurationError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number of seconds or None, got {value!r}")
    if not (0 <= value < float("inf")):
        raise ConfigurationError(f"{name} must be >= 0 seconds (or None), got {value!r}")
    return float(value)


@contextlib.contextmanager
def wait_limit(seconds: float | None) -> Iterator[None]:
    """Within the block, blocking :class:`KeyLock` waits end ``seconds`` after it
    starts, all of them together (None: wait forever, the default outside any block)."""
    limit = check_timeout(seconds)
    token = _LIMIT.set(None if limit is None else (limit, time.monotonic() + limit))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def with_lock_timeout(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` under :func:`wait_limit` of its ``lock_timeout=`` keyword argument
    (when it is given; a call without it keeps the limit of its context)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if "lock_timeout" not in kwargs:
            return func(*args, **kwargs)
        with wait_limit(check_timeout(kwargs["lock_timeout"])):
            return func(*args, **kwargs)

    return wrapper


def holder_pid(path: str, *, others: bool = True) -> int | None:
    """The pid of a process holding a ``flock`` on the file ``path``, from
    ``/proc/locks`` (Linux); None when unknown (not Linux, no such line, gone).
    ``others=False``: this process too (another of its threads, or a call of it that
    holds the key)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (blocked waiters: "->")
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:
            continue
        if found == want and (pid != os.getpid() or not others):
            return pid
    return None


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
        limited = _LIMIT.get() if self.blocking else None
        if not self.blocking or limited is not None:
            op |= fcntl.LOCK_NB
        limit, deadline = limited if limited is not None else (None, None)
        tries = 0
        while True:
            fd = self._open()
            if fd is None:  # a read-only cache without this lock file: nothing to hold
                self._fd = -1
                return True
            try:
                fcntl.flock(fd, op)
                if still_at(fd, self.path):
                    self._fd = fd
                    return True
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    if deadline is None:
                        return False
                    if time.monotonic() >= deadline:
                        self._timed_out(limit)
                    time.sleep(_PAUSES[min(tries, len(_PAUSES) - 1)])
                    tries += 1
                    continue
                raise StorageError(
                    f"{self.path}: cannot lock the cache lock file: {exc.strerror}"
                ) from exc
            except BaseException:  # Ctrl-C while waiting, or once held: nothing kept
                self._fd = None
                os.close(fd)
                raise
            os.close(fd)  # removed by its holder while we waited: lock the new one

    def _open(self) -> int | None:
        """The lock file opened (created where missing, never through a symbolic link).
        On a read-only file system a shared lock opens it read-only (``flock`` needs no
        write access), and holds nothing when it is missing: no process can make or
        remove the entry through a read-only mount, so a hit is served."""
        flags = os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | flags, 0o644)
        except OSError as exc:
            error = exc
        if self.shared and error.errno in (errno.EROFS, errno.EACCES):
            try:
                return os.open(self.path, os.O_RDONLY | flags)
            except FileNotFoundError:
                if error.errno == errno.EROFS:
                    return None
            except OSError:
                pass
        why = "it is a symbolic link" if error.errno == errno.ELOOP else error.strerror
        raise StorageError(f"{self.path}: cannot open the cache lock file: {why}") from error

    def _timed_out(self, limit: float | None) -> None:
        pid = holder_pid(self.path)
        if pid is not None:
            who = f"process {pid}"
        elif holder_pid(self.path, others=False) is not None:
            pid = os.getpid()
            who = f"this process ({pid}: another of its threads, or a call of it that holds "
            who += "the key)"
        else:
            who = "another process (pid unknown)"
        raise LockTimeout(
            f"{self.path}: the cache lock was not free after {limit:g} s "
            f"(lock_timeout, --lock-timeout): held by {who}",
            path=self.path,
            holder=pid,
        )

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if fd >= 0:  # -1: a read-only cache's missing lock file, nothing held
                os.close(fd)  # closing the only descriptor releases the flock

    def remove(self) -> None:
        """Remove the lock file (only while holding it exclusively), then release; a
        lock file that cannot be removed (its directory not writable) is a
        :class:`~ptestore.errors.StorageError` naming it, raised once released."""
        error = None
        if self._fd is not None and self._fd >= 0 and not self.shared:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                error = exc
        self.release()
        if error is not None:
            raise StorageError(
                f"{self.path}: cannot remove the cache lock file: {error.strerror}",
                errno=error.errno,
            ) from error

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
