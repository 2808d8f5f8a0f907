"""The two Linux system calls :mod:`os` lacks, through :mod:`ctypes` (imported on first
use, never by a run that does not need them).

- :func:`fallocate`: reserve or release a range of a file (the in-place journal);
- :func:`start_writeback`: ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, start writing a
  range of a file to disk now, without waiting (the local writer's large copies).

The C library is the process's own (``CDLL(None)``: no ``ctypes.util.find_library``,
which runs ``ldconfig`` in a subprocess). Where a call does not exist (not Linux, or a C
library without it) the functions say so by returning False.
"""

from __future__ import annotations

import errno
import os
from typing import Any

__all__ = ["fallocate", "start_writeback"]

#: ``sync_file_range`` flag: start writing out the dirty pages of the range, no wait.
SYNC_FILE_RANGE_WRITE = 2

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        for name, argtypes in (
            ("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
            ("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]),
        ):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
        _libc = lib
    return _libc


def _call(name: str, *args: int) -> int | None:
    """``name(*args)``: 0 on success, the errno on failure, None where it does not exist."""
    fn = getattr(_lib(), name, None)
    if fn is None:
        return None
    if fn(*args) == 0:
        return 0
    import ctypes

    return ctypes.get_errno() or errno.EIO


def fallocate(fd: int, mode: int, offset: int, size: int) -> bool:
    """``fallocate(2)``; False where the file system or system cannot (EOPNOTSUPP,
    ENOSYS, EINVAL, or no such call); raises ``OSError`` for any other failure."""
    if size <= 0:
        return True
    err = _call("fallocate", fd, mode, offset, size)
    if err == 0:
        return True
    if err is None or err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def start_writeback(fd: int, offset: int, size: int) -> bool:
    """Start writing ``[offset, offset + size)`` of the file to disk, without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``): a large copy then overlaps with its own
    writeback, and the ``fsync`` that makes it durable has little left to do. Only a
    hint: False where it cannot be given (never an error; ``fsync`` still decides)."""
    if size <= 0:
        return True
    return _call("sync_file_range", fd, offset, size, SYNC_FILE_RANGE_WRITE) == 0
