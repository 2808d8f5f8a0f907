"""Run a function where permission bits apply, even as root."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["unprivileged"]


def _drop_dac_capabilities() -> None:
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from this process: root then meets
    permission bits like anyone else (what a container with dropped capabilities sees)."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    mask = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0].effective &= mask
    data[0].permitted &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def unprivileged(fn: Callable[[], int]) -> int:
    """``fn()``'s return value, computed where permission bits apply (as root: in a
    forked child without the capabilities that bypass them)."""
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(r)
            _drop_dac_capabilities()
            code = fn()
        except BaseException as exc:
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            os.write(w, bytes([code & 0xFF]))
            os._exit(0)
    os.close(w)
    out = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return out[0] if out else 98
