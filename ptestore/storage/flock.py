"""Exclusive ``flock`` locks held on a lock file beside what they protect: the maker of
an XNNPACK packed-weight file and its installer (:mod:`ptestore.xnnpack`), a delivery
of one (:mod:`ptestore.fleet.packed`) and a ``fetch`` into one destination
(:mod:`ptestore.fleet.fetch`). Advisory, between processes (and threads: each holder
opens the file itself); released when the holder's descriptor closes, so a process
that dies holds nothing."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["locked"]


@contextlib.contextmanager
def locked(lock_path: str | os.PathLike[str], *, remove: bool = False) -> Iterator[None]:
    """The exclusive ``flock`` on the file at ``lock_path`` (made when missing; never
    through a symbolic link: ``O_NOFOLLOW``). Whoever holds it may remove the lock file
    (``remove=True`` on the way out, or by hand while holding it): a process that was
    waiting on the removed file finds the path gone or another file there once it gets
    the lock, and tries again, so two never hold the lock of one path at once."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                there = os.stat(lock_path)
            except FileNotFoundError:
                there = None
        except BaseException:
            os.close(fd)
            raise
        if there is not None and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # removed while this process waited: lock the file there now
    try:
        yield
    finally:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
        os.close(fd)
