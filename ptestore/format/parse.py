"""Pure parsing of .pte (Program, ``ET12``) and .ptd (FlatTensor, ``FT01``) metadata.

No I/O happens here. A reader decodes the first bytes of the file once
(:class:`~ptestore.format.header.FileHead`, :data:`HEAD_BYTES` are enough), learns from
it how many bytes hold the FlatBuffer, and hands those to :func:`parse_metadata`.
:func:`parse`, :func:`parse_pte` and :func:`parse_ptd` do both steps on one buffer.

Every offset is validated before it is trusted; every malformed input raises
:class:`~ptestore.errors.FormatError` naming the source, field, value and limit.
"""

from __future__ import annotations

from typing import Literal

from ..errors import FormatError
from .flatbuf import FlatView, TableView, Vector
from .header import (
    HEAD_BYTES,
    PTD_FILE_IDENTIFIER,
    PTE_FILE_IDENTIFIER,
    Buffer,
    FileHead,
    PtdHeader,
    PteHeader,
    detect_kind,
)
from .model import (
    CompileSpec,
    Container,
    Delegate,
    NamedDataEntry,
    Segment,
    SubsegmentOffsets,
    TensorLayout,
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

# Field ids (declaration order) of schema/program.fbs.
_PROGRAM_EXECUTION_PLAN = 1
_PROGRAM_BACKEND_DELEGATE_DATA = 3
_PROGRAM_SEGMENTS = 4
_PROGRAM_CONSTANT_SEGMENT = 5
_PROGRAM_MUTABLE_DATA_SEGMENTS = 6
_PROGRAM_NAMED_DATA = 7
_PLAN_NAME = 0
_PLAN_DELEGATES = 7
_DELEGATE_ID = 0
_DELEGATE_PROCESSED = 1
_DELEGATE_COMPILE_SPECS = 2
_REF_LOCATION = 0
_REF_INDEX = 1
_SEGMENT_OFFSET = 0
_SEGMENT_SIZE = 1
_SUBSEG_INDEX = 0
_SUBSEG_OFFSETS = 1
_NAMED_KEY = 0
_NAMED_SEGMENT_INDEX = 1
_NAMED_TENSOR_LAYOUT = 2
_SPEC_KEY = 0
_SPEC_VALUE = 1
_INLINE_DATA = 0
# flat_tensor.fbs
_FT_SEGMENTS = 1
_FT_NAMED_DATA = 2
_LAYOUT_SCALAR_TYPE = 0
_LAYOUT_SIZES = 1
_LAYOUT_DIM_ORDER = 2


def metadata_size(head: Buffer, file_size: int, source: str) -> int:
    """How many leading bytes hold the headers and the FlatBuffer."""
    return FileHead.from_bytes(head, file_size, source).metadata_size


def parse(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse metadata of either kind (dispatching on the file identifier)."""
    return parse_metadata(meta, FileHead.from_bytes(meta, file_size, source))


def parse_pte(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse a .pte from its metadata bytes ``[0, program_size)`` (more is fine)."""
    head = FileHead.from_bytes(meta, file_size, source)
    if head.kind != "pte":
        raise FormatError(
            source, "file identifier (bytes 4..8)", bytes(meta[4:8]), repr(PTE_FILE_IDENTIFIER)
        )
    return parse_metadata(meta, head)


def parse_ptd(meta: Buffer, file_size: int, source: str) -> Container:
    """Parse a .ptd from its metadata bytes ``[0, flatbuffer_offset + flatbuffer_size)``."""
    head = FileHead.from_bytes(meta, file_size, source)
    if head.kind != "ptd":
        raise FormatError(
            source, "file identifier (bytes 4..8)", bytes(meta[4:8]), repr(PTD_FILE_IDENTIFIER)
        )
    return parse_metadata(meta, head)


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
    if isinstance(head.header, PtdHeader):
        return _parse_flat_tensor(view, head, head.header)
    return _parse_program(view, head, head.header)


def _segments(root: TableView, fid: int) -> tuple[Segment, ...]:
    vec = root.vector(fid, "segments", 4)
    if vec is None:
        return ()
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        out.append(
            Segment(
                index=i,
                offset=t.scalar(_SEGMENT_OFFSET, "offset", "u64"),
                size=t.scalar(_SEGMENT_SIZE, "size", "u64"),
                slot_pos=vec.elem_pos(i),
                offset_pos=t.field_pos(_SEGMENT_OFFSET, "offset", 8),
                size_pos=t.field_pos(_SEGMENT_SIZE, "size", 8),
            )
        )
    return tuple(out)


def _named_data(
    root: TableView, fid: int, n_segments: int, with_layout: bool
) -> tuple[NamedDataEntry, ...]:
    vec = root.vector(fid, "named_data", 4)
    if vec is None:
        return ()
    source = root.view.source
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        key = t.string(_NAMED_KEY, "key")
        if key is None:
            raise FormatError(source, f"{t.field}.key", None, "present (a string)")
        idx = t.scalar(_NAMED_SEGMENT_INDEX, "segment_index", "u32")
        if idx >= n_segments:
            raise FormatError(
                source,
                f"{t.field}.segment_index",
                idx,
                f"< {n_segments} (the number of segments), for key {key!r}",
            )
        layout = None
        if with_layout:
            lt = t.table(_NAMED_TENSOR_LAYOUT, "tensor_layout")
            if lt is not None:
                sizes = lt.vector(_LAYOUT_SIZES, "sizes", 4)
                dims = lt.vector(_LAYOUT_DIM_ORDER, "dim_order", 1)
                layout = TensorLayout(
                    scalar_type=lt.scalar(_LAYOUT_SCALAR_TYPE, "scalar_type", "i8"),
                    sizes=tuple(sizes.i32s()) if sizes else (),
                    dim_order=tuple(dims.u8s()) if dims else (),
                )
        out.append(NamedDataEntry(key, idx, layout))
    return tuple(out)


def _check_segments(
    head: FileHead, segments: tuple[Segment, ...], base: int, data_size: int | None, table: str
) -> list[str]:
    source, file_size = head.source, head.file_size
    has_header = head.header is not None
    warnings: list[str] = []
    for s in segments:
        name = f"{table}.segments[{s.index}]"
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
        if data_size and s.offset + s.size > data_size:
            warnings.append(
                f"segment {s.index} ends at {s.offset + s.size}, past segment_data_size {data_size}"
            )
    return warnings


def _parse_program(view: FlatView, head: FileHead, header: PteHeader | None) -> Container:
    root = view.root("Program")
    base = 0 if header is None else header.segment_base_offset
    data_size = None if header is None else header.segment_data_size
    segments = _segments(root, _PROGRAM_SEGMENTS)
    warnings = _check_segments(head, segments, base, data_size, "Program")
    n_seg = len(segments)

    inline_vec = root.vector(_PROGRAM_BACKEND_DELEGATE_DATA, "backend_delegate_data", 4)
    inline_spans: list[tuple[int, int]] = []
    if inline_vec is not None:
        for i in range(inline_vec.length):
            dv = inline_vec.table(i).vector(_INLINE_DATA, "data", 1)
            inline_spans.append((dv.start, dv.length) if dv else (0, 0))

    methods: list[str] = []
    delegates: list[Delegate] = []
    plans = root.vector(_PROGRAM_EXECUTION_PLAN, "execution_plan", 4)
    if plans is not None:
        for p in range(plans.length):
            plan = plans.table(p)
            name = plan.string(_PLAN_NAME, "name")
            if name is None:
                raise FormatError(view.source, f"{plan.field}.name", None, "present (a string)")
            methods.append(name)
            dvec = plan.vector(_PLAN_DELEGATES, "delegates", 4)
            if dvec is None:
                continue
            for d in range(dvec.length):
                delegates.append(_delegate(dvec, d, name, n_seg, len(inline_spans)))

    named = _named_data(root, _PROGRAM_NAMED_DATA, n_seg, with_layout=False)
    const = None
    ct = root.table(_PROGRAM_CONSTANT_SEGMENT, "constant_segment")
    if ct is not None:
        const = _subsegments(ct, segments)
    mutable: list[SubsegmentOffsets] = []
    mvec = root.vector(_PROGRAM_MUTABLE_DATA_SEGMENTS, "mutable_data_segments", 4)
    if mvec is not None:
        for i in range(mvec.length):
            mutable.append(_subsegments(mvec.table(i), segments))

    return Container(
        kind="pte",
        source=view.source,
        file_size=head.file_size,
        header=header,
        metadata_size=head.metadata_size,
        segment_base_offset=base,
        segments=segments,
        named_data=named,
        methods=tuple(methods),
        delegates=tuple(delegates),
        constant_segment=const,
        mutable_data_segments=tuple(mutable),
        inline_delegate_data=tuple(inline_spans),
        warnings=tuple(warnings),
    )


def _delegate(dvec: Vector, d: int, method: str, n_seg: int, n_inline: int) -> Delegate:
    source = dvec.view.source
    t = dvec.table(d)
    bid = t.string(_DELEGATE_ID, "id")
    if bid is None:
        raise FormatError(source, f"{t.field}.id", None, "present (a backend id string)")
    ref = t.table(_DELEGATE_PROCESSED, "processed")
    if ref is None:
        raise FormatError(source, f"{t.field}.processed", None, "present")
    loc = ref.scalar(_REF_LOCATION, "location", "u8")
    index = ref.scalar(_REF_INDEX, "index", "u32")
    location: Literal["inline", "segment"]
    if loc == 0:
        location = "inline"
        if index >= n_inline:
            raise FormatError(
                source,
                f"{ref.field}.index",
                index,
                f"< {n_inline} (entries in Program.backend_delegate_data) for an INLINE "
                f"delegate of method {method!r}",
            )
    elif loc == 1:
        location = "segment"
        if index >= n_seg:
            raise FormatError(
                source,
                f"{ref.field}.index",
                index,
                f"< {n_seg} (the number of segments) for a SEGMENT delegate of method {method!r}",
            )
    else:
        raise FormatError(source, f"{ref.field}.location", loc, "0 (INLINE) or 1 (SEGMENT)")
    specs: list[CompileSpec] = []
    svec = t.vector(_DELEGATE_COMPILE_SPECS, "compile_specs", 4)
    if svec is not None:
        for s in range(svec.length):
            st = svec.table(s)
            key = st.string(_SPEC_KEY, "key") or ""
            vv = st.vector(_SPEC_VALUE, "value", 1)
            specs.append(CompileSpec(key, vv.u8s() if vv else b""))
    return Delegate(method, d, bid, location, index, tuple(specs))


def _subsegments(t: TableView, segments: tuple[Segment, ...]) -> SubsegmentOffsets:
    idx = t.scalar(_SUBSEG_INDEX, "segment_index", "u32")
    ovec = t.vector(_SUBSEG_OFFSETS, "offsets", 8)
    offsets = tuple(ovec.u64s()) if ovec else ()
    if len(offsets) > 1 or idx:
        if idx >= len(segments):
            raise FormatError(
                t.view.source,
                f"{t.field}.segment_index",
                idx,
                f"< {len(segments)} (the number of segments)",
            )
        seg_size = segments[idx].size
        for j, off in enumerate(offsets):
            if off > seg_size:
                raise FormatError(
                    t.view.source,
                    f"{t.field}.offsets[{j}]",
                    off,
                    f"<= {seg_size} (the size of segment {idx})",
                )
    return SubsegmentOffsets(idx, offsets)


def _parse_flat_tensor(view: FlatView, head: FileHead, header: PtdHeader) -> Container:
    root = view.root("FlatTensor")
    segments = _segments(root, _FT_SEGMENTS)
    base = header.segment_base_offset
    warnings = _check_segments(head, segments, base, header.segment_data_size, "FlatTensor")
    return Container(
        kind="ptd",
        source=view.source,
        file_size=head.file_size,
        header=header,
        metadata_size=head.metadata_size,
        segment_base_offset=base,
        segments=segments,
        named_data=_named_data(root, _FT_NAMED_DATA, len(segments), with_layout=True),
        warnings=tuple(warnings),
    )
