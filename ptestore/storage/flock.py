"""Exclusive ``flock`` locks held on a lock file beside what they protect: the maker of
an XNNPACK packed-weight file and its installer (:mod:`ptestore.xnnpack`), a delivery
of one (:mod:`ptestore.fleet.packed`), a ``fetch`` into one destination
(:mod:`ptestore.fleet.fetch`) and a compare-and-swap of a local file
(:mod:`ptestore.writers._local_cas`). Advisory, between processes (and threads: each
holder opens the file itself); released when the holder's descriptor closes, so a
process that dies holds nothing."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["locked", "still_at", "try_lock"]


@contextlib.contextmanager
def locked(
    lock_path: str | os.PathLike[str], *, remove: bool = False, mode: int = 0o644
) -> Iterator[None]:
    """The exclusive ``flock`` on the file at ``lock_path`` (made when missing, with
    ``mode`` less the umask; never through a symbolic link: ``O_NOFOLLOW``). Whoever
    holds it may remove the lock file (``remove=True`` on the way out, or by hand while
    holding it): a process that was waiting on the removed file finds the path gone or
    another file there once it gets the lock, and tries again, so two never hold the
    lock of one path at once."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            here = still_at(fd, lock_path)
        except BaseException:
            os.close(fd)
            raise
        if here:
            break
        os.close(fd)  # removed while this process waited: lock the file there now
    try:
        yield
    finally:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
        os.close(fd)


def still_at(fd: int, lock_path: str | os.PathLike[str]) -> bool:
    """Whether the lock file open as ``fd`` is still the file at ``lock_path`` (same
    device and inode, the path not followed): a holder may have removed it while this
    process waited for its lock, and then the lock guards nothing."""
    try:
        there = os.stat(lock_path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def try_lock(lock_path: str | os.PathLike[str]) -> int | None:
    """The exclusive ``flock`` on the existing lock file at ``lock_path``, taken without
    waiting (never made, never through a link): its descriptor (closing it releases the
    lock), or None when it is missing, held by another, or was removed meanwhile."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if still_at(fd, lock_path):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None
