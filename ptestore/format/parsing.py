"""Pure parsing of .pte (Program, ``ET12``) and .ptd (FlatTensor, ``FT01``) metadata.

No I/O happens here. A reader decodes the first bytes of the file once
(:class:`~ptestore.format.header.FileHead`, :data:`HEAD_BYTES` are enough), learns from
it how many bytes hold the FlatBuffer, and hands those to :func:`parse_metadata`.
:func:`parse`, :func:`parse_pte` and :func:`parse_ptd` do both steps on one buffer.

Every offset is validated before it is trusted; every malformed input raises
:class:`~ptestore.errors.FormatError` naming the source, field, value and limit.

Entries of the segments vector that point at one ``DataSegment`` table become one
physical segment (:mod:`.tables`). The bytes the patch engine writes (the header
fields, each segment table's present fields, the vector slots it redirects) must not
overlap each other nor any byte the parse read: otherwise patching one value would
change another (two tables sharing a field, a field inside a vtable or a string), and
the file is refused.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import pairwise

from .._dataclass import replace
from ..errors import FormatError
from .flatbuf import FlatView
from .header import (
    HEAD_BYTES,
    HEADER_OFFSET,
    PTD_FILE_IDENTIFIER,
    PTE_FILE_IDENTIFIER,
    Buffer,
    FileHead,
    Kind,
    detect_kind,
)
from .model import Container, Segment
from .tables import (
    read_constant_segment,
    read_inline_data,
    read_methods,
    read_mutable_data_segments,
    read_named_data,
    read_segments,
)

__all__ = [
    "HEAD_BYTES",
    "detect_kind",
    "metadata_size",
    "parse",
    "parse_metadata",
    "parse_ptd",
    "parse_pte",
]


def metadata_size(head: Buffer, file_size: int, source: str) -> int:
    """How many leading bytes hold the headers and the FlatBuffer."""
    return FileHead.from_bytes(head, file_size, source).metadata_size


def parse(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse metadata of either kind (dispatching on the file identifier)."""
    return parse_metadata(meta, FileHead.from_bytes(meta, file_size, source))


def parse_pte(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse a .pte from its metadata bytes ``[0, program_size)`` (more is fine)."""
    return _parse_as("pte", meta, file_size, source)


def parse_ptd(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse a .ptd from its metadata bytes ``[0, flatbuffer_offset + flatbuffer_size)``."""
    return _parse_as("ptd", meta, file_size, source)


def _parse_as(kind: Kind, meta: Buffer, file_size: int, source: str) -> Container:
    if detect_kind(meta, file_size, source) != kind:
        ident = PTE_FILE_IDENTIFIER if kind == "pte" else PTD_FILE_IDENTIFIER
        raise FormatError(source, "file identifier (bytes 4..8)", bytes(meta[4:8]), repr(ident))
    return parse(meta, file_size, source)


def parse_metadata(meta: Buffer, head: FileHead) -> Container:
    """Parse the FlatBuffer of a file whose first bytes decoded to ``head``.

    ``meta`` holds the file's bytes ``[0, head.metadata_size)`` (more is fine); the
    header is not decoded again.
    """
    if len(meta) < head.metadata_size:
        field = "program_size" if head.kind == "pte" else "flatbuffer_offset + flatbuffer_size"
        raise FormatError(
            head.source,
            field,
            head.metadata_size,
            f"<= {len(meta)} (bytes available)",
            "the buffer handed to the parser is truncated",
        )
    view = FlatView(meta, head.source, limit=head.metadata_size)
    table = "Program" if head.kind == "pte" else "FlatTensor"
    root = view.root(table)
    header = head.header
    base = 0 if header is None else header.segment_base_offset
    segments, seg_of = read_segments(root, head.kind)
    container = Container(
        kind=head.kind,
        source=head.source,
        file_size=head.file_size,
        header=header,
        metadata_size=head.metadata_size,
        segment_base_offset=base,
        segments=segments,
        named_data=read_named_data(root, head.kind, seg_of),
        warnings=_check_segments(head, segments, base, table),
    )
    if head.kind == "pte":
        inline = read_inline_data(root)
        methods, delegates = read_methods(root, seg_of, len(inline))
        container = replace(
            container,
            methods=methods,
            delegates=delegates,
            constant_segment=read_constant_segment(root, segments, seg_of),
            mutable_data_segments=read_mutable_data_segments(root, segments, seg_of),
            inline_delegate_data=inline,
        )
    _check_write_targets(head, view, segments, table)
    return container


def _check_write_targets(
    head: FileHead, view: FlatView, segments: tuple[Segment, ...], table: str
) -> None:
    """The bytes the patch engine may write overlap neither each other nor a byte read."""
    writes: list[tuple[int, int, str]] = []
    if head.header is not None:
        size = len(head.header.to_bytes())
        writes.append((HEADER_OFFSET, size, f"the {head.header.NAME} fields"))
    for s in segments:
        name = f"{table}.segments[{s.entries[0]}]"
        if s.offset_pos is not None:
            writes.append((s.offset_pos, 8, f"{name}.offset"))
        if s.size_pos is not None:
            writes.append((s.size_pos, 8, f"{name}.size"))
        for entry, slot in zip(s.entries, s.slot_positions, strict=True):
            writes.append((slot, 4, f"{table}.segments[{entry}] (vector slot)"))
    writes.sort()
    for (pos0, size0, what0), (pos1, _, what1) in pairwise(writes):
        if pos1 < pos0 + size0:
            raise FormatError(
                head.source,
                f"{what1} (position)",
                pos1,
                f">= {pos0 + size0} (past {what0} at [{pos0}, {pos0 + size0}))",
                "two values the patch engine writes share bytes",
            )
    starts, ends = _merged(view.read_spans)
    for pos, size, what in writes:
        # The last read span starting before the write's end is the one reaching furthest.
        i = bisect_left(starts, pos + size) - 1
        if i >= 0 and ends[i] > pos:
            raise FormatError(
                head.source,
                f"{what} (position)",
                pos,
                f"outside every other FlatBuffer structure (bytes [{starts[i]}, {ends[i]}) are "
                "read as something else)",
                "patching this value would change another field, vtable, vector or string",
            )


def _merged(spans: set[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted, disjoint ``[start, end)`` intervals covering ``spans``."""
    starts: list[int] = []
    ends: list[int] = []
    for pos, size in sorted(spans):
        if starts and pos <= ends[-1]:
            ends[-1] = max(ends[-1], pos + size)
        else:
            starts.append(pos)
            ends.append(pos + size)
    return starts, ends


def _check_segments(
    head: FileHead, segments: tuple[Segment, ...], base: int, table: str
) -> tuple[str, ...]:
    """Every segment inside the file, and a .ptd's inside its segment_data_size;
    warnings for a .pte's segments past segment_data_size."""
    source, file_size = head.source, head.file_size
    has_header = head.header is not None
    data_size = None if head.header is None else head.header.segment_data_size
    warnings: list[str] = []
    for s in segments:
        name = f"{table}.segments[{s.entries[0]}]"
        if not has_header and s.size:
            raise FormatError(
                source,
                f"{name}.size",
                s.size,
                "0 (a file without an extended header has no segment data)",
            )
        if has_header and base == 0 and s.size:
            raise FormatError(
                source,
                f"{name}.size",
                s.size,
                "0 when segment_base_offset is 0 (the header places no segment data)",
            )
        if base + s.offset + s.size > file_size:
            raise FormatError(
                source,
                f"{name}.offset + size",
                s.offset + s.size,
                f"<= {file_size - base} (segment_base_offset {base} + offset + size must not "
                f"pass the end of the {file_size}-byte file)",
            )
        if head.kind == "ptd" and data_size is not None and s.offset + s.size > base + data_size:
            # The runtime refuses it (flat_tensor_data_map.cpp: "Invalid segment offset
            # ... malformed PTD file", 0x24 when a key in it is read), comparing the
            # segment's end with base + segment_data_size (measured: a .ptd whose
            # segment_data_size is 32 bytes short loads); a .pte's segment_data_size it
            # does not check, hence only the warning below.
            raise FormatError(
                source,
                f"{name}.offset + size",
                s.offset + s.size,
                f"<= {base + data_size} (segment_base_offset {base} + the header's "
                f"segment_data_size {data_size}: the runtime's bound for a .ptd segment)",
            )
        if data_size and s.offset + s.size > data_size:
            warnings.append(
                f"segment {s.index} ends at {s.offset + s.size}, past segment_data_size {data_size}"
            )
    return tuple(warnings)
