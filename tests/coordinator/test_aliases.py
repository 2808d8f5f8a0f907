"""Shared FlatBuffer tables (issue 13, item 2).

FlatBuffers let several vector entries point at one table. Entries of the segments
vector that share a ``DataSegment`` table are one physical segment: keys and delegates
on them are aliases (replaced consistently or refused), the table is written once, a
redirected table takes every slot with it, and the layout places the bytes once. Fields
the patch engine writes may not overlap anything else it read or writes.

Every hostile file is built from a real fixture: its segments vector is rewritten (in
place, or appended after the FlatBuffer with tables of our own) and read back through
the raw FlatBuffer view, entry by entry, independently of the physical model.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
)
from ptestore.errors import FormatError, InvalidReplacement
from ptestore.format import align_up, parse
from ptestore.format.flatbuf import FlatView
from ptestore.format.header import (
    PTD_FLATBUFFER_SIZE_POS,
    PTD_SEGMENT_BASE_OFFSET_POS,
    PTE_PROGRAM_SIZE_POS,
    PTE_SEGMENT_BASE_OFFSET_POS,
)
from ptestore.format.layout import layout_file
from ptestore.format.model import Container

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
TWO = get_fixture("two_methods_xnnpack")
assert MLP.pte_path is not None and EXT.pte_path is not None and EXT.ptd_path is not None
assert TWO.pte_path is not None

# Field ids of Program (schema/program.fbs) and FlatTensor (flat_tensor.fbs).
_SEGMENTS = {"pte": 4, "ptd": 1}
_NAMED = {"pte": 7, "ptd": 2}


# ----------------------------------------------------------------- raw reading
def _root(data: bytes) -> tuple[Container, Any]:
    c = parse(data, len(data), "raw")
    view = FlatView(data, "raw", limit=c.metadata_size)
    return c, view.root("Program" if c.kind == "pte" else "FlatTensor")


def raw_entries(data: bytes) -> list[tuple[int, int, int]]:
    """``(table position, offset, size)`` of every entry of the segments vector."""
    c, root = _root(data)
    vec = root.vector(_SEGMENTS[c.kind], "segments", 4)
    assert vec is not None
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        out.append((t.pos, t.scalar(0, "offset", "u64"), t.scalar(1, "size", "u64")))
    return out


def raw_named(data: bytes) -> list[tuple[str, int]]:
    """``(key, segments vector index)`` of every named-data entry."""
    c, root = _root(data)
    vec = root.vector(_NAMED[c.kind], "named_data", 4)
    assert vec is not None
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        key = t.string(0, "key")
        assert key is not None
        out.append((key, t.scalar(1, "segment_index", "u32")))
    return out


def all_entry_bytes(data: bytes) -> list[bytes]:
    """The bytes each entry of the segments vector describes."""
    base = parse(data, len(data), "raw").segment_base_offset
    return [data[base + off :][:size] for _, off, size in raw_entries(data)]


def entry_bytes(data: bytes, entry: int) -> bytes:
    return all_entry_bytes(data)[entry]


def key_bytes(data: bytes) -> dict[str, bytes]:
    """What the runtime reads for each key: its entry's table, followed raw."""
    entries = all_entry_bytes(data)
    return {k: entries[i] for k, i in raw_named(data)}


def slots(data: bytes) -> list[int]:
    """Position of each slot of the segments vector."""
    c, root = _root(data)
    vec = root.vector(_SEGMENTS[c.kind], "segments", 4)
    assert vec is not None
    return [vec.elem_pos(i) for i in range(vec.length)]


# ----------------------------------------------------------------- hostile builders
def point(data: bytes, entry: int, at: int) -> bytes:
    """The file with segments entry ``entry`` pointing at the table of entry ``at``."""
    out = bytearray(data)
    pos = slots(data)
    (rel,) = struct.unpack_from("<I", data, pos[at])
    target = pos[at] + rel
    assert target > pos[entry]
    struct.pack_into("<I", out, pos[entry], target - pos[entry])
    return bytes(out)


class Asm:
    """Bytes assembled at a known absolute position."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.buf = bytearray()

    def here(self) -> int:
        return self.start + len(self.buf)

    def align(self, n: int) -> None:
        self.buf += b"\0" * (align_up(self.here(), n) - self.here())

    def put(self, fmt: str, *values: int) -> int:
        pos = self.here()
        self.buf += struct.pack(fmt, *values)
        return pos

    def set(self, pos: int, fmt: str, *values: int) -> None:
        struct.pack_into(fmt, self.buf, pos - self.start, *values)


def vtable(asm: Asm, offset: bool, size: bool) -> int:
    """A DataSegment vtable for a 24-byte table (offset at +8, size at +16)."""
    return asm.put("<HHHH", 8, 24, 8 if offset else 0, 16 if size else 0)


def datasegment(asm: Asm, vt: int, offset: int, size: int) -> int:
    asm.align(8)
    pos = asm.here()
    asm.put("<iIQQ", pos - vt, 0, offset, size)
    return pos


def splice(data: bytes, build: Callable[[Asm, Container], int]) -> bytes:
    """The file with a new segments vector: ``build`` appends the vector and its tables
    after the FlatBuffer and returns the vector's position; the segment base moves past
    them (congruent to the old base mod 64 KiB, so every segment keeps its alignment)."""
    c, root = _root(data)
    asm = Asm(align_up(c.metadata_size, 8))
    vec = build(asm, c)
    field = root.field_pos(_SEGMENTS[c.kind], "segments", 4)
    assert field is not None
    meta = bytearray(data[: c.metadata_size]) + b"\0" * (asm.start - c.metadata_size) + asm.buf
    struct.pack_into("<I", meta, field, vec - field)
    end = len(meta)
    old_base = c.segment_base_offset
    base = end + (old_base - end) % (1 << 16)
    if c.kind == "pte":
        struct.pack_into("<QQ", meta, PTE_PROGRAM_SIZE_POS, end, base)
        assert PTE_SEGMENT_BASE_OFFSET_POS == PTE_PROGRAM_SIZE_POS + 8
    else:
        struct.pack_into("<Q", meta, PTD_FLATBUFFER_SIZE_POS, end - c.header.flatbuffer_offset)  # type: ignore[union-attr]
        struct.pack_into("<Q", meta, PTD_SEGMENT_BASE_OFFSET_POS, base)
    return bytes(meta) + b"\0" * (base - end) + data[old_base:]


def with_entries(
    data: bytes, entries: list[int], tables: list[tuple[int, int]] | None = None
) -> bytes:
    """A segments vector of ``entries``, each an index into the original segments (with
    their fields' presence) followed by ``tables``, extra ``(offset, size)`` tables."""

    def build(asm: Asm, c: Container) -> int:
        vts = {(o, s): vtable(asm, o, s) for o in (False, True) for s in (False, True)}
        vec = asm.put("<I", len(entries))
        first = asm.here()
        asm.buf += b"\0" * 4 * len(entries)
        positions = [
            datasegment(asm, vts[s.offset_present, s.size_present], s.offset, s.size)
            for s in c.segments
        ]
        positions += [datasegment(asm, vts[True, True], o, s) for o, s in tables or []]
        for k, t in enumerate(entries):
            asm.set(first + 4 * k, "<I", positions[t] - (first + 4 * k))
        return vec

    return splice(data, build)


# ----------------------------------------------------------------- backends
class Writes(BackendInterface):
    """Writes the given named data and, per delegate input, ``processed(input)``."""

    def __init__(
        self,
        name: str = "XnnpackBackend",
        named: dict[str, BackendData] | None = None,
        processed: Callable[[Any], BackendData] | None = None,
    ) -> None:
        self.name = name
        self.named = named or {}
        self.processed = processed
        self.inputs: list[Any] = []

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for item in context:
            self.inputs.append(item)
            if self.processed is not None:
                output.write_processed_data(self.processed(item))
        if self.named:
            output.write_named_data(self.named)


def files(tmp_path: Path, pte: bytes, ptd: bytes | None = None) -> dict[str, Path]:
    out = {"src": tmp_path / "in.pte", "dst": tmp_path / "out.pte"}
    out["src"].write_bytes(pte)
    out["dst"].write_bytes(b"previous content")
    if ptd is not None:
        out["src_ptd"] = tmp_path / "in.ptd"
        out["dst_ptd"] = tmp_path / "out.ptd"
        out["src_ptd"].write_bytes(ptd)
        out["dst_ptd"].write_bytes(b"previous ptd")
    return out


def run(p: dict[str, Path], *backends: Any) -> ptestore.SpecializationReport:
    ptd = (p["src_ptd"], p["dst_ptd"]) if "src_ptd" in p else None
    return ptestore.specialize(
        p["src"], p["dst"], ptd=ptd, backends=list(backends), allow_unchanged=True, provenance=False
    )


# ----------------------------------------------------------------- the model
def test_entries_sharing_a_table_are_one_physical_segment() -> None:
    data = point(MLP.pte_path.read_bytes(), 3, 2)  # type: ignore[union-attr]
    c = parse(data, len(data), "shared.pte")
    assert len(c.segments) == 5
    assert c.segment_entries == 6
    shared = c.segments[2]
    assert (shared.entries, shared.shared) == ((2, 3), True)
    assert shared.slot_positions == tuple(slots(MLP.pte_path.read_bytes())[2:4])  # type: ignore[union-attr]
    # Entries after the shared one are renumbered; keys follow their tables.
    assert [s.entries for s in c.segments] == [(0,), (1,), (2, 3), (4,), (5,)]
    raw = raw_named(data)
    assert [e.segment_index for e in c.named_data] == [2, 2, 3, 4]
    assert [i for _, i in raw] == [2, 3, 4, 5]
    assert c.delegates[0].index == 1


def test_layout_places_a_shared_table_once() -> None:
    data = point(MLP.pte_path.read_bytes(), 3, 2)  # type: ignore[union-attr]
    c = parse(data, len(data), "shared.pte")
    placements, patched = layout_file(c, data, {2: (4096, 64)})
    assert len(placements) == len(c.segments)
    new = bytearray(patched.file_size)
    new[: len(patched.metadata)] = patched.metadata
    # Both entries read the one placement.
    entries = raw_entries(bytes(new))
    assert entries[2] == entries[3]
    assert entries[2][1:] == placements[2]


# ----------------------------------------------------------------- aliases on one table
def _two_keys(tmp_path: Path) -> tuple[dict[str, Path], str, str]:
    data = point(MLP.pte_path.read_bytes(), 3, 2)  # type: ignore[union-attr]
    (k2, _), (k3, _) = raw_named(data)[:2]
    return files(tmp_path, data), k2, k3


def test_two_keys_on_one_table_with_different_bytes_are_refused(tmp_path: Path) -> None:
    p, k2, k3 = _two_keys(tmp_path)
    before = p["src"].read_bytes()
    backend = Writes(
        named={
            k2: BackendData(b"\1" * 64, allow_size_change=True),
            k3: BackendData(b"\2" * 64, allow_size_change=True),
        }
    )
    with pytest.raises(InvalidReplacement) as info:
        run(p, backend)
    assert re.fullmatch(
        r"backend 'XnnpackBackend' \(coordinator\.test_aliases:Writes\), key '[0-9a-f]+': "
        r"segment 2 of .*in\.pte is shared by "
        rf"key '{k2}', key '{k3}'; replaced with different bytes: replace every alias with "
        r"identical bytes",
        str(info.value),
    ), str(info.value)
    assert p["dst"].read_bytes() == b"previous content"
    assert p["src"].read_bytes() == before


def test_one_key_of_a_shared_table_alone_is_refused(tmp_path: Path) -> None:
    p, k2, k3 = _two_keys(tmp_path)
    with pytest.raises(InvalidReplacement, match=rf"key '{k3}' not replaced: replace every"):
        run(p, Writes(named={k2: BackendData(b"\1" * 64, allow_size_change=True)}))
    assert p["dst"].read_bytes() == b"previous content"


def test_two_keys_on_one_table_with_identical_bytes_publish_them_for_both(
    tmp_path: Path,
) -> None:
    p, k2, k3 = _two_keys(tmp_path)
    before = key_bytes(p["src"].read_bytes())
    new = bytes(range(256)) * 12
    report = run(
        p,
        Writes(
            named={
                k2: BackendData(new, alignment=64, allow_size_change=True),
                k3: BackendData(new, allow_size_change=True),
            }
        ),
    )
    out = p["dst"].read_bytes()
    got = key_bytes(out)
    assert got[k2] == got[k3] == new
    assert {k: v for k, v in got.items() if k not in (k2, k3)} == {
        k: v for k, v in before.items() if k not in (k2, k3)
    }
    entries = raw_entries(out)
    assert entries[2] == entries[3]  # still one table
    assert report.files[0].segments_replaced == 1
    assert out.count(new) == 1  # the shared bytes are placed once


def test_ptd_keys_on_one_table_with_an_absent_offset_redirect_together(tmp_path: Path) -> None:
    """The first .ptd segment sits at offset 0 with no offset field: moving it re-emits
    its table, and both entries that shared the old table share the new one."""
    ptd = point(EXT.ptd_path.read_bytes(), 1, 0)  # type: ignore[union-attr]
    c = parse(ptd, len(ptd), "in.ptd")
    assert raw_entries(ptd)[0] == raw_entries(ptd)[1] and not c.segments[0].offset_present
    (k0, _), (k1, _) = raw_named(ptd)[:2]
    p = files(tmp_path, EXT.pte_path.read_bytes(), ptd)  # type: ignore[union-attr]
    new = b"\7" * 3000
    grow = {"alignment": 1 << 16, "allow_size_change": True}
    data = {k0: BackendData(new, **grow), k1: BackendData(new, **grow)}
    report = run(p, Writes(named=data))
    out = p["dst_ptd"].read_bytes()
    entries = raw_entries(out)
    assert entries[0] == entries[1]
    assert entries[0][1] != 0  # moved, through a re-emitted table
    assert entries[0][0] >= c.metadata_size
    got = key_bytes(out)
    assert got[k0] == got[k1] == new
    (ptd_report,) = [f for f in report.files if f.role == "ptd"]
    assert ptd_report.redirected_tables == 1
    # One copy of the new bytes, the other segments once each, 64 KiB of padding at most.
    assert len(out) <= len(ptd) + len(new) + (1 << 16)


def test_ptd_keys_on_one_table_with_different_bytes_are_refused(tmp_path: Path) -> None:
    ptd = point(EXT.ptd_path.read_bytes(), 1, 0)  # type: ignore[union-attr]
    (k0, _), (k1, _) = raw_named(ptd)[:2]
    p = files(tmp_path, EXT.pte_path.read_bytes(), ptd)  # type: ignore[union-attr]
    with pytest.raises(InvalidReplacement, match=r"segment 0 of .*in\.ptd is shared by"):
        run(
            p,
            Writes(
                named={
                    k0: BackendData(b"\1" * 8, allow_size_change=True),
                    k1: BackendData(b"\2" * 8, allow_size_change=True),
                }
            ),
        )
    assert p["dst_ptd"].read_bytes() == b"previous ptd"
    assert p["dst"].read_bytes() == b"previous content"


def test_delegates_on_one_table_are_one_input(tmp_path: Path) -> None:
    """forward_relu's blob entry pointed at forward's blob table: one blob, one input,
    one replacement that both delegates read."""
    data = point(TWO.pte_path.read_bytes(), 2, 1)  # type: ignore[union-attr]
    c = parse(data, len(data), "in.pte")
    assert [d.index for d in c.delegates] == [1, 1]
    p = files(tmp_path, data)
    backend = Writes(processed=lambda item: BackendData(item.method.encode() * 100))
    run(p, backend)
    assert [len(i.delegates) for i in backend.inputs] == [2]
    out = p["dst"].read_bytes()
    assert entry_bytes(out, 1) == entry_bytes(out, 2) == b"forward" * 100


def _repoint(data: bytes, vec: Any, entry: int, at: int) -> bytes:
    """``vec[entry]`` pointing at the table of ``vec[at]``."""
    out = bytearray(data)
    slot, target = vec.elem_pos(entry), vec.table(at).pos
    assert target > slot
    struct.pack_into("<I", out, slot, target - slot)
    return bytes(out)


def test_named_data_entries_on_one_table_are_refused(tmp_path: Path) -> None:
    # Two entries on one NamedData table list one key twice: refused as any repeated key
    # is (exporters write each key once; the runtime would read the first entry only).
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    _, root = _root(src)
    data = _repoint(src, root.vector(_NAMED["pte"], "named_data", 4), 1, 0)
    k0 = raw_named(src)[0][0]
    p = files(tmp_path, data)
    with pytest.raises(FormatError) as err:
        run(p, Writes(named={k0: BackendData(b"\5" * 100, allow_size_change=True)}))
    assert str(err.value) == (
        f"{p['src']}: Program.named_data[1].key = {k0!r}: must be a key no other entry has "
        "(Program.named_data[0] has it too) (a named-data key is listed once in a container)"
    )
    assert p["dst"].read_bytes() == b"previous content"  # nothing published


def test_delegates_on_one_delegate_table_are_one_input(tmp_path: Path) -> None:
    """forward_relu's delegates vector pointed at forward's BackendDelegate table."""
    src = TWO.pte_path.read_bytes()  # type: ignore[union-attr]
    _, root = _root(src)
    plans = root.vector(1, "execution_plan", 4)
    assert plans is not None
    first, second = (plans.table(i).vector(7, "delegates", 4) for i in range(2))
    assert first is not None and second is not None
    out = bytearray(src)
    slot, target = second.elem_pos(0), first.table(0).pos
    assert target > slot
    struct.pack_into("<I", out, slot, target - slot)
    p = files(tmp_path, bytes(out))
    backend = Writes(processed=lambda item: BackendData(b"\6" * 300))
    run(p, backend)
    assert [[d.method for d in i.delegates] for i in backend.inputs] == [
        ["forward", "forward_relu"]
    ]
    assert entry_bytes(p["dst"].read_bytes(), 1) == b"\6" * 300


# ----------------------------------------------------------------- growth
def test_passthrough_of_20000_entries_on_a_few_tables_does_not_grow(tmp_path: Path) -> None:
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    entries = list(range(6)) + [1 + i % 5 for i in range(20_000 - 6)]
    data = with_entries(src, entries)
    assert len({pos for pos, _, _ in raw_entries(data)}) == 6
    p = files(tmp_path, data)
    report = run(p, "passthrough")
    out = p["dst"].read_bytes()
    assert len(out) <= len(data)
    c = parse(data, len(data), "in.pte")
    assert (len(c.segments), c.segment_entries) == (6, 20_000)
    (f,) = report.files
    assert f.size_after == len(out)
    assert all_entry_bytes(out)[:6] == all_entry_bytes(src)
    got = raw_entries(out)
    assert len({pos for pos, _, _ in got}) == 6  # still six tables


def test_distinct_tables_on_the_same_bytes_are_placed_once(tmp_path: Path) -> None:
    """2,000 distinct tables describing one range: the bytes are copied once."""
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    seg = parse(src, len(src), "mlp").segments[2]
    data = with_entries(
        src, list(range(6)) + [6 + i for i in range(2000)], [(seg.offset, seg.size)] * 2000
    )
    c = parse(data, len(data), "in.pte")
    assert len(c.segments) == 2006
    p = files(tmp_path, data)
    run(p, "passthrough")
    out = p["dst"].read_bytes()
    assert len(out) <= len(data)
    assert set(all_entry_bytes(out)[6:]) == {entry_bytes(src, 2)}


def test_replacement_on_a_shared_table_with_an_absent_offset(tmp_path: Path) -> None:
    """The delegate blob (offset 0, no offset field) shared by 5,000 entries: a larger
    alignment moves it; one re-emitted table takes all 5,000 slots, the bytes are once."""
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    data = with_entries(src, list(range(6)) + [1] * 4994)
    c = parse(data, len(data), "in.pte")
    before = raw_entries(data)
    assert len({before[i] for i in [1, *range(6, 5000)]}) == 1
    assert not c.segments[1].offset_present
    p = files(tmp_path, data)
    blob = entry_bytes(src, 1) + b"\0" * 64
    report = run(p, Writes(processed=lambda item: BackendData(blob, alignment=1 << 16)))
    out = p["dst"].read_bytes()
    got = raw_entries(out)
    blob_entries = [got[1], *got[6:]]
    assert len(set(blob_entries)) == 1  # one table for all of them
    assert got[1][1] % (1 << 16) == (-parse(out, len(out), "o").segment_base_offset) % (1 << 16)
    assert entry_bytes(out, 1) == blob
    assert report.files[0].redirected_tables == 1
    assert len(out) <= len(data) + len(blob) + (1 << 16)


# ----------------------------------------------------------------- overlapping fields
def test_distinct_tables_sharing_a_field_are_refused() -> None:
    """Table Y's offset field is table X's size field: patching one changes the other."""
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    where: dict[str, int] = {}

    def build(asm: Asm, c: Container) -> int:
        vt = vtable(asm, True, True)
        vty = asm.put("<HHHH", 8, 32, 24, 0)  # offset at +24, no size
        vec = asm.put("<I", 8)
        first = asm.here()
        asm.buf += b"\0" * 32
        tables = [datasegment(asm, vt, s.offset, s.size) for s in c.segments]
        asm.align(8)
        y = asm.put("<iI", 0, 0)
        x = datasegment(asm, vt, 1280, 2048)
        assert x == y + 8
        asm.set(y, "<i", y - vty)
        where["field"] = x + 16
        for k, t in enumerate([*tables, x, y]):
            asm.set(first + 4 * k, "<I", t - (first + 4 * k))
        return vec

    data = splice(src, build)
    pos = where["field"]
    with pytest.raises(FormatError) as info:
        parse(data, len(data), "hostile.pte")
    assert str(info.value) == (
        f"hostile.pte: Program.segments[7].offset (position) = {pos}: must be >= {pos + 8} "
        f"(past Program.segments[6].size at [{pos}, {pos + 8})) "
        "(two values the patch engine writes share bytes)"
    )


def test_a_field_inside_another_structure_is_refused() -> None:
    """Table Y's offset field covers table Z's vtable offset (it reads as 8)."""
    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    where: dict[str, int] = {}

    def build(asm: Asm, c: Container) -> int:
        vt = vtable(asm, True, True)
        vty = asm.put("<HHHH", 8, 24, 16, 0)  # offset at +16, no size
        vec = asm.put("<I", 8)
        first = asm.here()
        asm.buf += b"\0" * 32
        tables = [datasegment(asm, vt, s.offset, s.size) for s in c.segments]
        asm.align(8)
        y = asm.put("<iI", asm.here() - vty, 0)
        vtz = vtable(asm, True, True)
        z = asm.put("<iIQQ", 8, 0, 1280, 2048)
        assert (vtz, z) == (y + 8, y + 16)
        where.update(z=z, vtz=vtz)
        for k, t in enumerate([*tables, z, y]):
            asm.set(first + 4 * k, "<I", t - (first + 4 * k))
        return vec

    data = splice(src, build)
    z = where["z"]
    with pytest.raises(FormatError) as info:
        parse(data, len(data), "hostile.pte")
    assert str(info.value) == (
        f"hostile.pte: Program.segments[7].offset (position) = {z}: must be outside every "
        f"other FlatBuffer structure (bytes [{where['vtz']}, {z + 4}) are read as something "
        "else) (patching this value would change another field, vtable, vector or string)"
    )


# ----------------------------------------------------------------- the real runtime
@pytest.mark.interop
def test_outputs_with_shared_tables_run_identically(tmp_path: Path) -> None:
    """Files whose segments vectors share tables, and ptestore's outputs for them
    (passthrough; keys and the delegate blob moved, through in-place writes and one
    redirected table each), run in the ExecuTorch runtime with the original outputs."""
    from support.et_runtime import Job, run_programs

    src = MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    shared = with_entries(src, list(range(6)) + [1 + i % 5 for i in range(20_000 - 6)])
    same = {k: BackendData(v, alignment=4096) for k, v in key_bytes(src).items()}
    blob = entry_bytes(src, 1)
    variants: dict[str, Any] = {
        "passthrough": "passthrough",
        "keys-moved": Writes(named=same),
        "blob-moved": Writes(processed=lambda item: BackendData(blob, alignment=1 << 16)),
    }
    paths = {"input": tmp_path / "shared.pte"}
    paths["input"].write_bytes(shared)
    for name, backend in variants.items():
        (tmp_path / name).mkdir()
        p = files(tmp_path / name, shared)
        report = run(p, backend)
        out = p["dst"].read_bytes()
        assert len(out) <= len(shared) + (1 << 16)
        assert len({pos for pos, _, _ in raw_entries(out)}) == 6
        if name == "blob-moved":
            assert report.files[0].redirected_tables == 1
        paths[name] = p["dst"]
    jobs = [
        Job(pte=path, method="forward", inputs=MLP.inputs["forward"], label=label)
        for label, path in paths.items()
    ]
    want = MLP.outputs_runtime["forward"]
    for result in run_programs(jobs):
        assert result.outputs is not None, result.describe()
        assert len(result.outputs) == len(want)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(result.outputs, want, strict=True))
