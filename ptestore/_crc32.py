"""CRC-32 (zlib's: the one S3 calls ``CRC32``) of a buffer, by libdeflate where the
system has it, else by :mod:`zlib`.

Every chunk of every output is hashed with SHA-256 and CRC-32 (the provenance record,
:mod:`ptestore.provenance.crcs`). zlib's CRC-32 runs at about 2.2 GB/s per core here,
libdeflate's (carry-less multiplication: PCLMULQDQ on x86-64, PMULL on Arm) at about
8 GB/s, both releasing the GIL; on a 1 GiB file the difference is about 0.35 s of CPU
(``docs/benchmarks.md``, stop 46). libdeflate is a small C library most Linux
distributions install (Debian and Ubuntu: ``libdeflate0``, which libtiff needs); it is
found by its soname through :mod:`ctypes` (no ``find_library``, which runs
``ldconfig`` in a subprocess), imported on the first CRC of a large buffer only, and
checked against a known value once before it is trusted. Where it is missing, or
``PTESTORE_CRC32=zlib`` is set, zlib does the work: the values are the same.

Only buffers the C function can be handed without a copy go to libdeflate: ``bytes``
and writable contiguous buffers (a ``bytearray``, a slice of one, a writable
``mmap``); a read-only view (of ``bytes`` sliced, of a read-only ``mmap``) and
buffers under :data:`_SMALL` bytes go to zlib.
"""

from __future__ import annotations

import os
import threading
import zlib
from typing import Any

__all__ = ["crc32", "implementation"]

#: Below this many bytes zlib is faster than a call through ctypes.
_SMALL = 16 << 10
#: The shared library's names, tried in order (Linux, macOS).
_NAMES = ("libdeflate.so.0", "libdeflate.0.dylib")

_state: dict[str, Any] = {}
_lock = threading.Lock()


def _load() -> Any:
    """libdeflate's ``libdeflate_crc32`` (argument types set), or None."""
    if os.environ.get("PTESTORE_CRC32", "").lower() == "zlib":
        return None
    import ctypes

    for name in _NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = getattr(lib, "libdeflate_crc32", None)
        if fn is None:
            continue
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint32
        probe = bytes(range(256)) * 256  # large enough to take its vector path
        if fn(0, probe, len(probe)) == zlib.crc32(probe) and fn(7, b"", 0) == 7:
            return fn
    return None


def _fast() -> Any:
    """``(function, ctypes)`` of libdeflate, or None; looked up once per process."""
    if "fn" not in _state:
        with _lock:
            if "fn" not in _state:
                fn = _load()
                import sys

                _state["ctypes"] = sys.modules.get("ctypes")
                _state["fn"] = fn
    return _state["fn"]


def implementation() -> str:
    """``"libdeflate"`` or ``"zlib"``: what computes the CRC-32 of a large buffer here."""
    return "zlib" if _fast() is None else "libdeflate"


def crc32(data: Any, value: int = 0) -> int:
    """The CRC-32 of ``data`` (any buffer) continuing from ``value``, as
    :func:`zlib.crc32` gives it."""
    if isinstance(data, bytes):
        if len(data) < _SMALL or (fn := _fast()) is None:
            return zlib.crc32(data, value)
        return int(fn(value, data, len(data)))
    view = data if isinstance(data, memoryview) else memoryview(data)
    n = view.nbytes
    if n < _SMALL or view.readonly or not view.c_contiguous or (fn := _fast()) is None:
        return zlib.crc32(data, value)
    ctypes = _state["ctypes"]
    first = ctypes.c_char.from_buffer(view)  # no copy: the buffer's own first byte
    try:
        return int(fn(value, ctypes.addressof(first), n))
    finally:
        del first
