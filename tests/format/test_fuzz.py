"""Property tests: hostile inputs raise only FormatError, never anything else.

1. Mutated real fixtures: bit flips, byte and word overwrites with hostile values
   (concentrated in the metadata, where they matter), and truncations.
2. Short files (0..200 bytes) built field by field: real or wrong identifiers and
   magics (also cut short), header lengths and sizes near 0, near the file size and near
   2**64, offsets past the end. Each is parsed whole, through a loader (the way
   ``ptestore inspect`` reads, header first), and from a buffer cut shorter than the file.

Whatever parses must also describe, render, lay out and patch without any other
exception.

3. Shared segment tables: entries of a real segments vector re-pointed at other
   entries' tables are patched consistently (every entry of one table reads one
   placement) and never make a layout larger than the input.

``PTESTORE_FUZZ_EXAMPLES`` sets the number of mutation cases (10,000 by
default, as CI runs it); the short-file test runs a fifth of that.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures import all_fixtures

from ptestore.errors import FormatError
from ptestore.format import Container, parse, patch_metadata, read_container
from ptestore.format.flatbuf import FlatView
from ptestore.format.layout import layout_file
from ptestore.inspection import describe, render_table
from ptestore.storage.loaders import BytesLoader

EXAMPLES = int(os.environ.get("PTESTORE_FUZZ_EXAMPLES", "10000"))

FILES: list[bytes] = []
for fx in all_fixtures():
    for path in (fx.pte_path, fx.ptd_path):
        if path is not None:
            FILES.append(path.read_bytes())

HOSTILE_U32 = [0, 1, 3, 4, 7, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFC, 0xFFFFFFFF, 0x10000]
HOSTILE_U64 = [0, 1, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 32, 1 << 40]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(FILES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "u32", "u64", "truncate", "header"]))
        hot = draw(st.booleans())
        if len(data) < 16:
            break
        limit = min(len(data), 4096) if hot else len(data)
        if kind == "flip":
            pos = draw(st.integers(0, limit - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            pos = draw(st.integers(0, limit - 1))
            data[pos] = draw(st.integers(0, 255))
        elif kind == "u32":
            pos = draw(st.integers(0, limit - 4)) & ~3
            value = draw(st.one_of(st.sampled_from(HOSTILE_U32), st.integers(0, 0xFFFFFFFF)))
            struct.pack_into("<I", data, pos, value)
        elif kind == "u64":
            pos = draw(st.integers(0, limit - 8)) & ~3
            value = draw(st.one_of(st.sampled_from(HOSTILE_U64), st.integers(0, (1 << 64) - 1)))
            struct.pack_into("<Q", data, pos, value)
        elif kind == "header":
            pos = draw(st.sampled_from([0, 12, 16, 24, 32, 40]))
            if pos + 8 <= len(data):
                value = draw(st.one_of(st.sampled_from(HOSTILE_U64), st.integers(0, len(data) * 2)))
                if pos >= 16:
                    struct.pack_into("<Q", data, pos, value & ((1 << 64) - 1))
                else:
                    struct.pack_into("<I", data, pos, value & 0xFFFFFFFF)
        else:
            data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


NEAR_2_64 = [(1 << 64) - 1, (1 << 64) - 8, (1 << 64) - 64, 1 << 63, (1 << 63) - 1]
MAGICS = [b"ET12", b"FT01", b"eh00", b"FH01", b"ET1", b"FH", b"e", b"", b"XXXX", b"\0\0\0\0"]


@st.composite
def short_file(draw: st.DrawFn) -> bytes:
    """0..200 bytes: root offset, identifier, header magic, length and u64 fields,
    each drawn from hostile values (or random), then cut to a drawn length."""
    n = draw(st.integers(0, 200))

    def u32() -> bytes:
        near = [0, 1, 8, 16, 23, 24, 31, 32, 39, 40, 48, n - 8, n - 4, n, n + 1, 0xFFFFFFFF]
        value = draw(st.one_of(st.sampled_from(near), st.integers(0, 0xFFFFFFFF)))
        return struct.pack("<I", value & 0xFFFFFFFF)

    def u64() -> bytes:
        near = [0, 1, 8, 39, 40, 47, 48, 56, 63, 64, 128, n - 1, n, n + 1, *NEAR_2_64]
        values = st.one_of(st.sampled_from(near), st.integers(0, 2 * n + 8))
        value = draw(st.one_of(values, st.integers(0, (1 << 64) - 1)))
        return struct.pack("<Q", value % (1 << 64))

    def magic() -> bytes:
        return draw(st.one_of(st.sampled_from(MAGICS), st.binary(min_size=4, max_size=4)))

    data = u32() + magic() + magic() + u32() + u64() + u64() + u64() + u64()
    data += draw(st.one_of(st.just(b"\0" * 200), st.binary(min_size=200, max_size=200)))
    return data[:n]


def _exercise(c: Container, data: bytes) -> None:
    describe(c)
    render_table(c)
    try:
        placements, _ = layout_file(c, data, {})
        moved = [(off + 64, size) for off, size in placements]
        if c.header is not None:
            patch_metadata(c, data, moved, base_alignment=128)
    except FormatError:
        pass


def _outcome(read: Callable[[], Container]) -> Container | str:
    """The container ``read`` returns, or the message of the FormatError it raises."""
    try:
        return read()
    except FormatError as exc:
        assert str(exc).startswith("fuzz.pte: ")
        return str(exc)


def _only_format_errors(data: bytes, cut: int) -> None:
    """Parse ``data`` whole, through a loader (same outcome), and from ``data[:cut]``."""
    whole = _outcome(lambda: parse(data, len(data), "fuzz.pte"))
    loaded = _outcome(lambda: read_container(BytesLoader(data, "fuzz.pte")).container)
    assert loaded == whole
    _outcome(lambda: parse(data[:cut], len(data), "fuzz.pte"))
    if isinstance(whole, Container):
        _exercise(whole, data)


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ_SETTINGS
@given(mutated(), st.integers(0, 4096))
def test_mutations_raise_only_format_errors(data: bytes, cut: int) -> None:
    _only_format_errors(data, cut)


@settings(FUZZ_SETTINGS, max_examples=max(100, EXAMPLES // 5))
@given(short_file(), st.integers(0, 200))
def test_short_hostile_files_raise_only_format_errors(data: bytes, cut: int) -> None:
    _only_format_errors(data, cut)


# ------------------------------------------------------- shared segment tables
def _entries(data: bytes, c: Container) -> list[tuple[int, int]]:
    """``(offset, size)`` of every entry of the segments vector, read raw."""
    view = FlatView(data, "raw", limit=c.metadata_size)
    root = view.root("Program" if c.kind == "pte" else "FlatTensor")
    vec = root.vector(4 if c.kind == "pte" else 1, "segments", 4)
    if vec is None:
        return []
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        out.append((t.scalar(0, "offset", "u64"), t.scalar(1, "size", "u64")))
    return out


SHAREABLE = [d for d in FILES if len(parse(d, len(d), "x").segments) > 1]


@settings(max_examples=max(50, EXAMPLES // 50), deadline=None, database=None)
@given(st.sampled_from(SHAREABLE), st.data())
def test_shared_segment_tables_are_patched_consistently(data: bytes, draw: st.DataObject) -> None:
    """Random entries of a real segments vector re-pointed at other entries' tables:
    the file parses (or raises FormatError), and after moving every segment each entry
    reads its physical segment's placement, the same for every entry of one table."""
    c0 = parse(data, len(data), "fuzz.pte")
    out = bytearray(data)
    for s in c0.segments:
        slot = s.slot_positions[0]
        target = draw.draw(st.sampled_from(c0.segments))
        t_slot = target.slot_positions[0]
        table = t_slot + struct.unpack_from("<I", data, t_slot)[0]
        if draw.draw(st.booleans()) and table > slot:
            struct.pack_into("<I", out, slot, table - slot)
    hostile = bytes(out)
    try:
        c = parse(hostile, len(hostile), "fuzz.pte")
    except FormatError as exc:
        assert str(exc).startswith("fuzz.pte: ")
        return
    _exercise(c, hostile)
    if c.header is None:
        return
    placements, patched = layout_file(c, hostile, {})
    assert patched.file_size <= len(hostile)  # never more than the input's bytes
    moved = [
        (off + 64 * (1 + s.index), size)
        for s, (off, size) in zip(c.segments, placements, strict=True)
    ]
    result = patch_metadata(c, hostile, moved, base_alignment=128)
    new = bytes(result.metadata) + bytes(max(0, result.file_size - len(result.metadata)))
    c2 = parse(new, len(new), "patched")
    entries = _entries(new, c2)
    for s in c.segments:
        for e in s.entries:
            assert entries[e] == moved[s.index]
