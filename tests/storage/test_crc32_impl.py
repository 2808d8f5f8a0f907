"""``ptestore._crc32``: CRC-32 by libdeflate where the system has it, the values zlib's."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptestore import _crc32, checksums

ROOT = Path(__file__).resolve().parents[2]


def _system_has_libdeflate() -> bool:
    for name in _crc32._NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "libdeflate_crc32"):
            return True
    return False


def test_implementation_is_libdeflate_exactly_where_the_system_has_it() -> None:
    expected = "libdeflate" if _system_has_libdeflate() else "zlib"
    assert _crc32.implementation() == expected


def _implementation_in_child(env: dict[str, str]) -> str:
    code = "from ptestore import _crc32; print(_crc32.implementation())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    return out.stdout.strip()


def test_ptestore_crc32_zlib_switches_libdeflate_off() -> None:
    assert _implementation_in_child({"PTESTORE_CRC32": "zlib"}) == "zlib"
    expected = "libdeflate" if _system_has_libdeflate() else "zlib"
    assert _implementation_in_child({"PTESTORE_CRC32": ""}) == expected


def test_a_library_giving_a_wrong_value_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    class Wrong:
        argtypes: object = None
        restype: object = None

        def __call__(self, value: int, data: object, n: int) -> int:
            return 0x12345678

    class Lib:
        libdeflate_crc32 = Wrong()

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Lib())
    assert _crc32._load() is None


def test_a_missing_library_leaves_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert _crc32._load() is None


_SIZES = st.sampled_from([0, 1, 100, (16 << 10) - 1, 16 << 10, (16 << 10) + 5, 200_000])


@settings(max_examples=60, deadline=None)
@given(
    size=_SIZES,
    start=st.integers(0, 31),
    value=st.integers(0, 0xFFFFFFFF),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_kind_of_buffer_gives_zlibs_value(
    size: int, start: int, value: int, seed: int
) -> None:
    import random

    data = random.Random(seed).randbytes(size + start)
    expected = zlib.crc32(data[start:], value)
    writable = bytearray(data)
    kinds = [
        data[start:],  # bytes
        bytearray(data[start:]),
        memoryview(writable)[start:],  # a writable slice (its own first byte)
        memoryview(data)[start:],  # read-only: zlib
    ]
    if (size + start) % 4 == 0 and start == 0:
        kinds.append(memoryview(writable).cast("I"))  # not bytes by format
    for buffer in kinds:
        assert _crc32.crc32(buffer, value) == expected
        assert checksums.crc("CRC32", buffer, value) == expected


def test_mmaps_writable_and_read_only(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    with path.open("r+b") as f:
        rw = mmap.mmap(f.fileno(), 0)
        ro = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            for m in (rw, ro):
                view = memoryview(m)
                assert _crc32.crc32(view[7:], 5) == zlib.crc32(data[7:], 5)
                view.release()
        finally:
            rw.close()
            ro.close()


def test_continuing_across_pieces_is_the_whole_value() -> None:
    data = bytearray(os.urandom(1 << 20))
    view = memoryview(data)
    value = 0
    for offset in range(0, len(data), 100_000):
        value = _crc32.crc32(view[offset : offset + 100_000], value)
    assert value == zlib.crc32(data)
