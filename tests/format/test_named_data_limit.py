"""A container may have at most ``MAX_NAMED_DATA`` named-data keys and ``MAX_SEGMENTS``
segments: beyond, it is refused with a FormatError before any per-entry work, so a
hostile .ptd with hundreds of thousands of keys costs milliseconds, not minutes."""

from __future__ import annotations

import struct
from pathlib import Path

import flatbuffers
import pytest

import ptestore
from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.format.tables import MAX_NAMED_DATA, MAX_SEGMENTS

HEADER = 40


def hostile_ptd(keys: int, segments: int = 1) -> bytes:
    """A valid FlatTensor .ptd with ``keys`` named-data entries (``k0``, ``k1``, ...) and
    ``segments`` segments, all pointing at 16 bytes of data."""
    b = flatbuffers.Builder(1024 + 32 * (keys + segments))
    tables = []
    for i in range(keys):
        key = b.CreateString(f"k{i}")
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, key, 0)
        b.PrependUint32Slot(1, 0, 1)
        tables.append(b.EndObject())
    b.StartVector(4, keys, 4)
    for t in reversed(tables):
        b.PrependUOffsetTRelative(t)
    named = b.EndVector()
    segs = []
    for _ in range(segments):
        b.StartObject(2)
        b.PrependUint64Slot(0, 0, 1)
        b.PrependUint64Slot(1, 16, 0)
        segs.append(b.EndObject())
    b.StartVector(4, segments, 4)
    for t in reversed(segs):
        b.PrependUOffsetTRelative(t)
    seg_vec = b.EndVector()
    b.StartObject(3)
    b.PrependUint32Slot(0, 0, 1)
    b.PrependUOffsetTRelativeSlot(1, seg_vec, 0)
    b.PrependUOffsetTRelativeSlot(2, named, 0)
    b.Finish(b.EndObject(), file_identifier=b"FT01")
    fb = bytes(b.Output())
    # The FH01 header goes after the first 8 bytes (the root offset moves by its size).
    meta_len = 8 + HEADER + len(fb) - 8
    base = (meta_len + 15) // 16 * 16
    head = struct.pack("<I", struct.unpack_from("<I", fb)[0] + HEADER) + fb[4:8]
    header = b"FH01" + struct.pack("<IQQQQ", HEADER, 48, meta_len - 48, base, 16)
    out = head + header + fb[8:]
    return out + bytes(base - len(out)) + bytes(range(16))


def test_a_container_at_a_small_count_parses(tmp_path: Path) -> None:
    path = tmp_path / "ok.ptd"
    path.write_bytes(hostile_ptd(100))
    assert len(ptestore.describe(path)["named_data"]) == 100


@pytest.mark.parametrize("what", ["named_data", "segments"])
def test_beyond_the_limit_is_refused_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    n = (MAX_NAMED_DATA if what == "named_data" else MAX_SEGMENTS) + 1
    path = tmp_path / "hostile.ptd"
    path.write_bytes(hostile_ptd(n, 1) if what == "named_data" else hostile_ptd(1, n))
    with pytest.raises(FormatError) as info:
        ptestore.describe(path)
    assert str(info.value) == (
        f"{path}: FlatTensor.{what} (entries) = {n}: must be <= {n - 1} (ptestore's limit "
        "on the entries of one container; each costs work and memory)"
    )
    assert main(["inspect", str(path)]) == 2
    assert f"FlatTensor.{what} (entries) = {n}: must be <= {n - 1}" in capsys.readouterr().err
