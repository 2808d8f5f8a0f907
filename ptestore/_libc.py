"""The C library calls :mod:`os` and :mod:`signal` lack, through :mod:`ctypes` (imported
on first use, never by a run that does not need them).

- :func:`fallocate`: reserve or release a range of a file (the in-place journal);
- :func:`start_writeback`: ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, start writing a
  range of a file to disk now, without waiting (the local writer's large copies);
- :func:`get_sigaction`/:func:`set_sigaction`: the process's real handler of a signal,
  saved and put back (``ptestore._signals``): :func:`signal.signal` only knows the
  handlers Python installed, and reports ``None`` for one native code installed before
  Python started, and a stale value for one installed since; :func:`signal_masks`
  reads which signals are caught or ignored from ``/proc/self/status`` without ctypes.

The C library is the process's own (``CDLL(None)``: no ``ctypes.util.find_library``,
which runs ``ldconfig`` in a subprocess). Where a call does not exist (not Linux, or a C
library without it) the functions say so by returning False (None for the signal
functions).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

__all__ = [
    "action_handler",
    "fallocate",
    "get_sigaction",
    "set_sigaction",
    "signal_masks",
    "start_writeback",
]

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
            ("sigaction", [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
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


#: Room for any ``struct sigaction`` (152 bytes with glibc and musl on 64-bit machines, 16
#: on macOS): the action is kept as these opaque bytes, read and written back whole.
SIGACTION_BYTES = 256

#: The machines whose ``struct sigaction`` starts with its handler, with glibc or musl
#: (MIPS puts its flags first, Android's 64-bit bionic too: not read there).
_HANDLER_FIRST = frozenset(
    {
        "x86_64",
        "aarch64",
        "arm64",
        "i386",
        "i486",
        "i586",
        "i686",
        "riscv64",
        "ppc64le",
        "ppc64",
        "s390x",
        "armv6l",
        "armv7l",
        "armv8l",
    }
)


def _sigaction_known() -> bool:
    """Whether this platform's ``struct sigaction`` starts with its handler (Linux with
    glibc or musl on the machines above, macOS): :func:`action_handler` reads it there."""
    if sys.platform == "darwin":
        return True
    if not sys.platform.startswith("linux") or hasattr(sys, "getandroidapilevel"):
        return False
    return os.uname().machine in _HANDLER_FIRST


def _sigaction_fn() -> Any:
    if not _sigaction_known():
        return None
    try:
        lib = _lib()
    except (ImportError, OSError):  # a Python built without ctypes
        return None
    return getattr(lib, "sigaction", None)


def get_sigaction(signum: int) -> bytes | None:
    """The process's action for ``signum`` (``sigaction(2)``), as opaque bytes for
    :func:`set_sigaction` and :func:`action_handler`; None where it cannot be read
    (another platform, no ctypes, the call failed)."""
    fn = _sigaction_fn()
    if fn is None:
        return None
    import ctypes

    out = ctypes.create_string_buffer(SIGACTION_BYTES)
    if fn(signum, None, out) != 0:
        return None
    return out.raw


def set_sigaction(signum: int, action: bytes) -> None:
    """Install ``action`` (from :func:`get_sigaction`) for ``signum``; ``OSError`` if the
    call fails."""
    fn = _sigaction_fn()
    if fn is None:
        raise OSError(errno.ENOSYS, f"sigaction of signal {signum}: not available here")
    import ctypes

    if fn(signum, ctypes.create_string_buffer(action, SIGACTION_BYTES), None) != 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise OSError(err, f"sigaction of signal {signum}: {os.strerror(err)}")


def action_handler(action: bytes) -> int:
    """The handler's address in ``action``: 0 is ``SIG_DFL``, 1 ``SIG_IGN``."""
    import ctypes

    size = ctypes.sizeof(ctypes.c_void_p)
    return int.from_bytes(action[:size], sys.byteorder)


def signal_masks() -> tuple[int, int] | None:
    """The signals this process ignores and catches, as bit masks (bit ``n - 1`` for
    signal ``n``), from ``/proc/self/status`` (``SigIgn``, ``SigCgt``); None where it
    cannot be read. Cheaper than :func:`get_sigaction` (no ctypes): enough to confirm
    that a signal Python says is at its default (or ignored) really is."""
    try:
        with open("/proc/self/status", "rb") as f:
            text = f.read(16384)
    except OSError:
        return None
    masks: dict[bytes, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"SigIgn", b"SigCgt"):
            try:
                masks[name] = int(value.strip(), 16)
            except ValueError:
                return None
    if len(masks) != 2:
        return None
    return masks[b"SigIgn"], masks[b"SigCgt"]
