"""The patch engine: new segment offsets/sizes and header sizes, every other byte unchanged.

Given a parsed container, its metadata bytes and a new ``(offset, size)`` for every
physical segment, :func:`patch_metadata` produces the new metadata region. A
``DataSegment`` table that several entries of the segments vector point at is one
physical segment (:mod:`.model`): its fields are written once, with one value, so
every entry keeps reading the same bytes.

- a ``DataSegment`` field that is physically present is overwritten in place (the
  vtable is never touched: vtables are shared between tables);
- a field that is absent because it held the default 0 (the empty constant segment
  and the first delegate blob both sit at offset 0 in real XNNPACK files) cannot be
  written in place. That table is re-emitted after the end of the FlatBuffer with both
  fields present, and every vector slot that pointed at the old table is redirected to
  the one new table (FlatBuffer offsets point forward, so this is valid). The old table
  stays where it was, unreferenced; the FlatBuffer grows by 24 bytes per redirected
  table plus one shared 8-byte vtable and alignment padding;
- the header sizes (.pte ``program_size``, ``segment_base_offset``,
  ``segment_data_size``; .ptd ``flatbuffer_size``, ``segment_base_offset``,
  ``segment_data_size``) are rewritten in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._dataclass import dataclass, replace
from ..errors import ConfigurationError, FormatError
from .header import (
    HEADER_OFFSET,
    I32,
    SEGMENT_BASE_ALIGNMENT,
    U16,
    U32,
    U64,
    Buffer,
    PtdHeader,
    PteHeader,
    align_up,
    is_power_of_two,
)
from .model import Container

__all__ = ["PatchResult", "align_up", "metadata_growth_bound", "patch_metadata"]

# A re-emitted DataSegment: [soffset i32][pad 4][offset u64][size u64].
_TABLE_SIZE = 24
_VTABLE = U16.pack(8) + U16.pack(_TABLE_SIZE) + U16.pack(8) + U16.pack(16)


@dataclass(frozen=True)
class PatchResult:
    """The new metadata region and the header values written into it."""

    metadata: bytearray
    #: Absolute offset where segment data must start (relative offsets count from here).
    segment_base_offset: int
    segment_data_size: int
    #: Indexes of the (physical) segments whose tables were re-emitted (absent fields).
    redirected: tuple[int, ...]

    @property
    def file_size(self) -> int:
        """Size of the complete new file (no trailing padding)."""
        if self.segment_data_size == 0:
            return max(len(self.metadata), self.segment_base_offset)
        return self.segment_base_offset + self.segment_data_size


def patch_metadata(
    container: Container,
    metadata: Buffer,
    placements: Sequence[tuple[int, int]],
    *,
    base_alignment: int = SEGMENT_BASE_ALIGNMENT,
    segment_base_offset: int | None = None,
) -> PatchResult:
    """Return new metadata where (physical) segment ``i`` is at relative
    ``placements[i] = (offset, size)``.

    The new ``segment_base_offset`` is the one given (it must not be inside the new
    metadata; :func:`metadata_growth_bound` says how much the metadata can grow), or else
    the end of the new metadata aligned up to ``base_alignment``.
    """
    src = container.source
    if len(placements) != len(container.segments):
        raise ConfigurationError(
            f"{src}: {len(placements)} placements for {len(container.segments)} segments"
        )
    if not is_power_of_two(base_alignment):
        raise ConfigurationError(f"base_alignment must be a power of two, got {base_alignment}")
    if len(metadata) < container.metadata_size:
        raise FormatError(src, "metadata", len(metadata), f">= {container.metadata_size} bytes")
    out = bytearray(metadata[: container.metadata_size])

    redirect: list[tuple[int, int, int]] = []  # (segment index, offset, size)
    for seg, (new_off, new_size) in zip(container.segments, placements, strict=True):
        if new_off < 0 or new_size < 0 or new_off >= 1 << 64 or new_size >= 1 << 64:
            raise ConfigurationError(
                f"{src}: segment {seg.index}: bad placement ({new_off}, {new_size})"
            )
        needs_table = (new_off != seg.offset and seg.offset_pos is None) or (
            new_size != seg.size and seg.size_pos is None
        )
        if needs_table:
            redirect.append((seg.index, new_off, new_size))
            continue
        if seg.offset_pos is not None:
            U64.pack_into(out, seg.offset_pos, new_off)
        if seg.size_pos is not None:
            U64.pack_into(out, seg.size_pos, new_size)

    if redirect:
        # One shared vtable, then the re-emitted tables, all 8-aligned so the u64
        # fields are naturally aligned relative to the buffer start.
        out.extend(b"\0" * (align_up(len(out), 8) - len(out)))
        vt_pos = len(out)
        out.extend(_VTABLE)
        for index, new_off, new_size in redirect:
            seg = container.segments[index]
            table_pos = len(out)
            out.extend(I32.pack(table_pos - vt_pos) + b"\0" * 4)
            out.extend(U64.pack(new_off) + U64.pack(new_size))
            for entry, slot in zip(seg.entries, seg.slot_positions, strict=True):
                rel = table_pos - slot
                if rel <= 0 or rel >= 1 << 32:
                    raise FormatError(
                        src, f"segments[{entry}] (vector slot)", slot, f"< {table_pos}"
                    )
                U32.pack_into(out, slot, rel)

    data_size = max((off + size for off, size in placements), default=0)
    header = container.header
    moved = tuple(i for i, _, _ in redirect)
    if segment_base_offset is None:
        base = align_up(len(out), base_alignment)
    elif segment_base_offset < len(out) and header is not None:
        raise ConfigurationError(
            f"{src}: segment_base_offset {segment_base_offset} is inside the new "
            f"{len(out)}-byte metadata"
        )
    else:
        base = segment_base_offset
    if isinstance(header, PtdHeader):
        return _finish_ptd(header, out, data_size, base, moved)
    return _finish_pte(container, header, out, data_size, base, moved)


def metadata_growth_bound(container: Container) -> int:
    """The most bytes :func:`patch_metadata` can add to the metadata (every segment
    table re-emitted, plus alignment padding and the shared vtable)."""
    return 8 + len(_VTABLE) + _TABLE_SIZE * len(container.segments)


def _write_header(out: bytearray, header: PteHeader | PtdHeader) -> None:
    encoded = header.to_bytes()
    out[HEADER_OFFSET : HEADER_OFFSET + len(encoded)] = encoded


def _finish_pte(
    container: Container,
    header: PteHeader | None,
    out: bytearray,
    data_size: int,
    base: int,
    redirected: tuple[int, ...],
) -> PatchResult:
    program_size = len(out)
    if header is None:
        if data_size or redirected or program_size != container.metadata_size:
            raise FormatError(
                container.source,
                "extended header",
                None,
                "present to place non-empty segments",
                "the program has no extended header (all its segments are empty); "
                "ptestore does not add one",
            )
        return PatchResult(out, 0, 0, ())
    if data_size == 0 and header.segment_base_offset == 0:
        base = 0
    new = replace(
        header,
        program_size=program_size,
        segment_base_offset=base,
        segment_data_size=None if header.segment_data_size is None else data_size,
    )
    _write_header(out, new)
    return PatchResult(out, base, data_size, redirected)


def _finish_ptd(
    header: PtdHeader,
    out: bytearray,
    data_size: int,
    base: int,
    redirected: tuple[int, ...],
) -> PatchResult:
    new = replace(
        header,
        flatbuffer_size=len(out) - header.flatbuffer_offset,
        segment_base_offset=base,
        segment_data_size=data_size,
    )
    _write_header(out, new)
    return PatchResult(out, base, data_size, redirected)
