"""The container model against the real fixtures' reference facts, and the patch engine."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from support.fixtures import Fixture, all_fixtures

from ptestore.errors import FormatError
from ptestore.format import parse, patch_metadata, read_container
from ptestore.format.model import Container
from ptestore.inspection import describe
from ptestore.storage.loaders import BytesLoader

REFERENCE_KEYS = ("format", "file_size", "header", "methods", "segments", "named_data", "delegates")

FILES = [
    pytest.param(fx, role, id=f"{fx.name}-{role}")
    for fx in all_fixtures()
    for role in ("pte", "ptd")
    if (fx.pte_path if role == "pte" else fx.ptd_path) is not None
]


def _path(fx: Fixture, role: str) -> Any:
    return fx.pte_path if role == "pte" else fx.ptd_path


def project(d: dict[str, Any]) -> dict[str, Any]:
    """ptestore's inspect JSON restricted to the fields the reference reader knows."""
    out = {k: d[k] for k in REFERENCE_KEYS}
    out["segments"] = [{k: s[k] for k in ("index", "offset", "size")} for s in d["segments"]]
    known = ("key", "segment_index", "tensor_layout")  # not size, tensor_info
    out["named_data"] = [{k: r[k] for k in known if k in r} for r in d["named_data"]]
    return out


def load(fx: Fixture, role: str) -> tuple[bytes, Container]:
    data = _path(fx, role).read_bytes()
    return data, parse(data, len(data), str(_path(fx, role)))


@pytest.mark.parametrize(("fx", "role"), FILES)
def test_facts_equal_executorch_reader(fx: Fixture, role: str) -> None:
    _, c = load(fx, role)
    ref = fx.facts[role]
    assert project(describe(c)) == {k: ref[k] for k in REFERENCE_KEYS}


@pytest.mark.parametrize(("fx", "role"), FILES)
def test_field_presence_equals_vtable_lookup(fx: Fixture, role: str) -> None:
    _, c = load(fx, role)
    expected = fx.segment_field_presence[role]
    got = [
        {"index": s.index, "offset_present": s.offset_present, "size_present": s.size_present}
        for s in c.segments
    ]
    assert got == [{k: e[k] for k in ("index", "offset_present", "size_present")} for e in expected]


@pytest.mark.parametrize(("fx", "role"), FILES)
def test_read_container_reads_only_metadata(fx: Fixture, role: str) -> None:
    data, c = load(fx, role)
    reads: list[tuple[int, int]] = []

    class Counting(BytesLoader):
        def load(self, offset: int, size: int) -> memoryview:
            reads.append((offset, size))
            return super().load(offset, size)

    parsed = read_container(Counting(data, "counting"))
    assert parsed.container.segments == c.segments
    assert all(off + size <= c.metadata_size for off, size in reads)
    assert len(reads) <= 2


def _moved_placements(c: Container, shift: int) -> list[tuple[int, int]]:
    """Every segment moved: a ``shift``-byte gap before each one, order kept."""
    out: list[tuple[int, int]] = [(0, 0)] * len(c.segments)
    cursor = 0
    for s in sorted(c.segments, key=lambda s: (s.offset, s.index)):
        cursor = (cursor + shift + 4095) // 4096 * 4096
        out[s.index] = (cursor, s.size)
        cursor += s.size
    return out


def rebuild(data: bytes, c: Container, placements: list[tuple[int, int]]) -> bytes:
    """A complete new file: patched metadata + every segment copied to its new place."""
    result = patch_metadata(c, data, placements, base_alignment=4096)
    out = bytearray(result.file_size)
    out[: len(result.metadata)] = result.metadata
    for s, (off, size) in zip(c.segments, placements, strict=True):
        src = c.segment_base_offset + s.offset
        dst = result.segment_base_offset + off
        out[dst : dst + size] = data[src : src + s.size]
    return bytes(out)


@pytest.mark.parametrize(("fx", "role"), FILES)
def test_patch_moves_every_segment_and_changes_nothing_else(fx: Fixture, role: str) -> None:
    data, c = load(fx, role)
    placements = _moved_placements(c, 128)
    if c.header is None and c.segments:
        # Without an extended header there is no segment base: refusing is the contract.
        with pytest.raises(FormatError, match=r"extended header = None: must be present"):
            patch_metadata(c, data, placements, base_alignment=4096)
        return
    result = patch_metadata(c, data, placements, base_alignment=4096)
    new = rebuild(data, c, placements)
    c2 = parse(new, len(new), "patched")
    assert [(s.offset, s.size) for s in c2.segments] == placements
    assert c2.named_data == c.named_data
    assert c2.methods == c.methods
    assert c2.delegates == c.delegates
    assert c2.constant_segment == c.constant_segment
    # Every byte of the original metadata is unchanged except the patched fields and
    # redirected vector slots.
    allowed: set[int] = set()
    header_fields = (16, 24, 32) if role == "pte" else (24, 32, 40)
    for pos in header_fields:
        allowed.update(range(pos, pos + 8))
    for s in c.segments:
        for pos in (s.offset_pos, s.size_pos):
            if pos is not None:
                allowed.update(range(pos, pos + 8))
        if s.index in result.redirected:
            for slot in s.slot_positions:
                allowed.update(range(slot, slot + 4))
    meta = result.metadata
    changed = {i for i in range(c.metadata_size) if meta[i] != data[i]}
    assert changed <= allowed
    # Absent fields that had to change went through the redirect path.
    for s, (off, size) in zip(c.segments, placements, strict=True):
        needs = (off != s.offset and not s.offset_present) or (
            size != s.size and not s.size_present
        )
        assert (s.index in result.redirected) == needs
    # Segment bytes are where the new metadata says.
    for s, s2 in zip(c.segments, c2.segments, strict=True):
        a = data[c.segment_base_offset + s.offset :][: s.size]
        b = new[c2.segment_base_offset + s2.offset :][: s2.size]
        assert a == b


@pytest.mark.parametrize(("fx", "role"), FILES)
def test_identity_patch_is_byte_identical(fx: Fixture, role: str) -> None:
    data, c = load(fx, role)
    placements = [(s.offset, s.size) for s in c.segments]
    result = patch_metadata(c, data, placements, base_alignment=1)
    assert result.redirected == ()
    if c.header is not None:
        # Header values as written by the exporter (base alignment aside).
        assert bytes(result.metadata[:16]) == data[:16]
        assert bytes(result.metadata[40:]) == data[40 : c.metadata_size]


def test_redirected_table_layout_is_aligned() -> None:
    fx = next(f for f in all_fixtures() if f.pte_path and "xnnpack" in f.name)
    data, c = load(fx, "pte")
    absent = [s for s in c.segments if not s.offset_present]
    assert absent, "real XNNPACK files have segments without an offset field"
    placements = [(s.offset + 4096, s.size) for s in c.segments]
    result = patch_metadata(c, data, placements, base_alignment=4096)
    meta = result.metadata
    for s in c.segments:
        if s.index not in result.redirected:
            continue
        (slot,) = s.slot_positions
        (rel,) = struct.unpack_from("<I", meta, slot)
        table = slot + rel
        assert table % 8 == 0
        assert table >= c.metadata_size
        (soff,) = struct.unpack_from("<i", meta, table)
        vtable = table - soff
        assert struct.unpack_from("<HHHH", meta, vtable) == (8, 24, 8, 16)
        assert struct.unpack_from("<QQ", meta, table + 8) == placements[s.index]
    assert struct.unpack_from("<Q", meta, 16)[0] == len(meta)
