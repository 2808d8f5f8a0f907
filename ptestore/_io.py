"""Small POSIX I/O helpers shared by writers and the coordinator."""

from __future__ import annotations

import os

__all__ = ["pwrite_all"]


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less); raises
    ``OSError`` as the system reports it."""
    done, n = 0, data.nbytes
    while done < n:
        done += os.pwrite(fd, data[done:], offset + done)
