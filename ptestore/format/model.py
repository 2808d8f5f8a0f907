"""The container model: what ptestore knows about a parsed .pte or .ptd.

Everything here is immutable and carries the byte positions the patch engine needs
(where each ``DataSegment`` table lives, whether its ``offset`` / ``size`` fields are
physically present, and where the vector slots that point at the table are).

Segments are *physical*: entries of ``Program.segments`` / ``FlatTensor.segments`` that
point at one ``DataSegment`` table (FlatBuffers allow a table to be referenced many
times) are one :class:`Segment`, numbered by the first entry that references it. Every
segment index in the model (named data, delegates, constant and mutable data) is such a
physical index; for a file without shared tables it equals the vector index.
"""

from __future__ import annotations

from typing import Literal

from .._dataclass import dataclass, field
from .header import Kind, PtdHeader, PteHeader

__all__ = [
    "MAX_INFERRED_ALIGNMENT",
    "CompileSpec",
    "Container",
    "Delegate",
    "NamedDataEntry",
    "PtdHeader",
    "PteHeader",
    "Segment",
    "SubsegmentOffsets",
    "TensorLayout",
    "inferred_alignment",
]

#: The largest alignment ever inferred from an offset. Alignment is not recorded in the
#: file; it is recovered as the largest power of two dividing a segment's absolute
#: offset, capped here so that a segment at, say, 1 GiB does not demand 1 GiB padding.
MAX_INFERRED_ALIGNMENT = 1 << 16


def inferred_alignment(absolute_offset: int) -> int:
    """Largest power of two dividing ``absolute_offset`` (capped), 1 for odd offsets."""
    if absolute_offset <= 0:
        return MAX_INFERRED_ALIGNMENT
    return min(absolute_offset & -absolute_offset, MAX_INFERRED_ALIGNMENT)


@dataclass(frozen=True)
class Segment:
    """One ``DataSegment`` table and where its fields live in the FlatBuffer."""

    #: Physical index: the position of this table among the distinct tables of the
    #: segments vector, in the order of their first reference.
    index: int
    #: Offset relative to ``segment_base_offset``.
    offset: int
    size: int
    #: Positions of the physically present fields; None when the field is absent
    #: (FlatBuffers omit fields equal to their default, 0).
    offset_pos: int | None
    size_pos: int | None
    #: Indices in the segments vector whose slots point at this table (ascending; more
    #: than one when the table is shared).
    entries: tuple[int, ...]
    #: Position of each of those vector slots (a uoffset), in the same order.
    slot_positions: tuple[int, ...]

    @property
    def shared(self) -> bool:
        """True when several entries of the segments vector point at this table."""
        return len(self.entries) > 1

    @property
    def offset_present(self) -> bool:
        return self.offset_pos is not None

    @property
    def size_present(self) -> bool:
        return self.size_pos is not None


@dataclass(frozen=True)
class TensorLayout:
    scalar_type: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "scalar_type": self.scalar_type,
            "sizes": list(self.sizes),
            "dim_order": list(self.dim_order),
        }


@dataclass(frozen=True)
class NamedDataEntry:
    key: str
    segment_index: int
    tensor_layout: TensorLayout | None = None


@dataclass(frozen=True)
class CompileSpec:
    key: str
    value: bytes


@dataclass(frozen=True)
class Delegate:
    """One ``BackendDelegate`` of one method."""

    method: str
    #: Position of this delegate in its method's ``delegates`` vector.
    position: int
    id: str
    location: Literal["inline", "segment"]
    #: Index into ``Program.segments`` (segment) or ``backend_delegate_data`` (inline).
    index: int
    compile_specs: tuple[CompileSpec, ...]


@dataclass(frozen=True)
class SubsegmentOffsets:
    segment_index: int
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class Container:
    """A parsed .pte (``kind == "pte"``) or .ptd (``kind == "ptd"``)."""

    kind: Kind
    source: str
    file_size: int
    header: PteHeader | PtdHeader | None
    #: Bytes ``[0, metadata_size)`` hold the FlatBuffer (headers included).
    metadata_size: int
    #: Absolute offset that segment offsets are relative to (0 when there is none).
    segment_base_offset: int
    #: The physical segments (see the module docstring), by index.
    segments: tuple[Segment, ...]
    named_data: tuple[NamedDataEntry, ...]
    # .pte only
    methods: tuple[str, ...] = ()
    delegates: tuple[Delegate, ...] = ()
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: tuple[SubsegmentOffsets, ...] = ()
    #: ``(position, size)`` in the metadata of each ``backend_delegate_data`` blob.
    inline_delegate_data: tuple[tuple[int, int], ...] = ()
    #: Non-fatal oddities worth showing a user (e.g. segments past segment_data_size).
    warnings: tuple[str, ...] = field(default=())

    @property
    def segment_entries(self) -> int:
        """Length of the segments vector (entries sharing a table counted each)."""
        return sum(len(s.entries) for s in self.segments)

    def segment_end(self) -> int:
        """Relative end of the furthest segment."""
        return max((s.offset + s.size for s in self.segments), default=0)

    def absolute(self, seg: Segment) -> int:
        """Absolute file offset of ``seg``'s data."""
        return self.segment_base_offset + seg.offset
