"""Copy-on-write clones of byte ranges between local files (Linux ``FICLONERANGE``).

File systems that share extents between files (XFS with ``reflink=1``, btrfs, bcachefs)
can make a range of one file part of another without copying it, as long as both
offsets and the length are multiples of the file system's block size (a range that
ends at the source's end of file may end anywhere). Elsewhere (ext4, tmpfs, another
file system) the ioctls fail with ``EOPNOTSUPP``/``EXDEV``/``EINVAL`` and callers copy.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
from typing import Protocol, runtime_checkable

from .._align import is_power_of_two

__all__ = ["CLONE_FALLBACK_ERRNOS", "HasFileno", "clone_range", "probe_clone_block_size"]

#: ``_IOW(0x94, 9, int)`` and ``_IOW(0x94, 13, struct file_clone_range)`` (linux/fs.h).
FICLONE = 0x40049409
FICLONERANGE = 0x4020940D
#: errno values that mean "no clone here": copy instead.
CLONE_FALLBACK_ERRNOS = frozenset(
    {
        errno.EOPNOTSUPP,
        errno.ENOTSUP,
        errno.EXDEV,
        errno.EINVAL,
        errno.ENOTTY,
        errno.ENOSYS,
        errno.EPERM,
        errno.EBADF,
        errno.ETXTBSY,
    }
)


@runtime_checkable
class HasFileno(Protocol):
    """A source readable through its own descriptor (local files, the spool)."""

    name: str

    def fileno(self) -> int: ...


def probe_clone_block_size(directory: str, src_fd: int, dst_fd: int) -> int | None:
    """The clone granularity for ``src_fd`` -> ``dst_fd`` (``dst_fd`` lives in
    ``directory``), or None when the two are on different file systems or the file
    system cannot clone.

    Probes with ``FICLONE`` between two unnamed (``O_TMPFILE``) empty files in
    ``directory``: nothing visible is created and nothing is left behind.
    """
    if not sys.platform.startswith("linux") or not hasattr(os, "O_TMPFILE"):
        return None
    try:
        if os.fstat(src_fd).st_dev != os.fstat(dst_fd).st_dev:
            return None
    except OSError:
        return None
    fds: list[int] = []
    try:
        for _ in range(2):
            fds.append(os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600))
        fcntl.ioctl(fds[1], FICLONE, fds[0])
        block = os.fstatvfs(fds[0]).f_bsize
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)
    return block if is_power_of_two(block) and block >= 512 else None


def clone_range(src_fd: int, src_offset: int, size: int, dst_fd: int, dst_offset: int) -> bool:
    """Share ``size`` bytes of ``src_fd`` at ``src_offset`` into ``dst_fd`` at
    ``dst_offset``. True when cloned; False when the file system refused in a way that
    means "copy instead" (see :data:`CLONE_FALLBACK_ERRNOS`); other errors raise."""
    if size <= 0:
        return True
    arg = struct.pack("qQQQ", src_fd, src_offset, size, dst_offset)
    try:
        fcntl.ioctl(dst_fd, FICLONERANGE, arg)
    except OSError as exc:
        if exc.errno in CLONE_FALLBACK_ERRNOS:
            return False
        raise
    return True
