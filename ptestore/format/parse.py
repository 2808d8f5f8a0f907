"""Pure parsing of .pte (Program, ``ET12``) and .ptd (FlatTensor, ``FT01``) metadata.

No I/O happens here: callers hand in the first bytes of the file (enough for the
headers, :data:`HEAD_BYTES`), learn from :func:`metadata_size` how many bytes hold the
FlatBuffer, then hand those to :func:`parse_pte` / :func:`parse_ptd`.

Every offset is validated before it is trusted; every malformed input raises
:class:`~ptestore.errors.FormatError` naming the source, field, value and limit.
"""

from __future__ import annotations

import struct
from typing import Literal

from ..errors import FormatError
from .flatbuf import FlatView, TableView, Vector
from .model import (
    CompileSpec,
    Container,
    Delegate,
    NamedDataEntry,
    PtdHeader,
    PteHeader,
    Segment,
    SubsegmentOffsets,
    TensorLayout,
)

__all__ = [
    "HEAD_BYTES",
    "PTD_FILE_IDENTIFIER",
    "PTD_HEADER_MAGIC",
    "PTE_FILE_IDENTIFIER",
    "PTE_HEADER_MAGIC",
    "detect_kind",
    "metadata_size",
    "parse",
    "parse_ptd",
    "parse_pte",
    "parse_ptd_header",
    "parse_pte_header",
]

#: Bytes needed to read either header (the C++ runtime also reads 64).
HEAD_BYTES = 64
PTE_FILE_IDENTIFIER = b"ET12"
PTE_HEADER_MAGIC = b"eh00"
PTE_HEADER_MIN_LENGTH = 24
PTD_FILE_IDENTIFIER = b"FT01"
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_MIN_LENGTH = 40

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

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


def _u32(head: bytes | bytearray | memoryview, pos: int) -> int:
    return int(_U32.unpack_from(head, pos)[0])


def _u64(head: bytes | bytearray | memoryview, pos: int) -> int:
    return int(_U64.unpack_from(head, pos)[0])


def detect_kind(head: bytes | bytearray | memoryview, file_size: int, source: str) -> str:
    """Return ``"pte"`` or ``"ptd"`` from the FlatBuffer file identifier at bytes 4..8."""
    if file_size < 8 or len(head) < 8:
        raise FormatError(source, "file size", file_size, ">= 8 bytes (root offset + identifier)")
    ident = bytes(head[4:8])
    if ident == PTE_FILE_IDENTIFIER:
        return "pte"
    if ident == PTD_FILE_IDENTIFIER:
        return "ptd"
    raise FormatError(
        source,
        "file identifier (bytes 4..8)",
        ident,
        "b'ET12' (.pte Program) or b'FT01' (.ptd FlatTensor)",
    )


def _need_head(head: bytes | bytearray | memoryview, file_size: int, source: str) -> None:
    want = min(HEAD_BYTES, file_size)
    if len(head) < want:
        raise ValueError(f"{source}: parse needs the first {want} bytes, got {len(head)}")


def parse_pte_header(
    head: bytes | bytearray | memoryview, file_size: int, source: str
) -> PteHeader | None:
    """Parse the .pte extended header; None when the file has none."""
    _need_head(head, file_size, source)
    if len(head) < 16 or bytes(head[8:12]) != PTE_HEADER_MAGIC:
        return None
    length = _u32(head, 12)
    if length < PTE_HEADER_MIN_LENGTH:
        raise FormatError(
            source, "extended header length", length, f">= {PTE_HEADER_MIN_LENGTH} bytes"
        )
    if 8 + length > file_size or len(head) < 8 + min(length, 32):
        raise FormatError(
            source,
            "extended header length",
            length,
            f"<= {file_size - 8} (the header must fit inside the {file_size}-byte file)",
        )
    program_size = _u64(head, 16)
    base = _u64(head, 24)
    data_size = _u64(head, 32) if length >= 32 else None
    if program_size < 8 + length or program_size > file_size:
        raise FormatError(
            source,
            "extended header program_size",
            program_size,
            f"in [{8 + length}, {file_size}] (after the header and inside the file)",
        )
    if base != 0 and (base < program_size or base > file_size):
        raise FormatError(
            source,
            "extended header segment_base_offset",
            base,
            f"0 or in [{program_size}, {file_size}] (after the program, inside the file)",
        )
    if data_size is not None and base + data_size > file_size:
        raise FormatError(
            source,
            "extended header segment_data_size",
            data_size,
            f"<= {file_size - base} (segment_base_offset {base} + size must not pass the end "
            f"of the {file_size}-byte file)",
        )
    return PteHeader(length, program_size, base, data_size)


def parse_ptd_header(
    head: bytes | bytearray | memoryview, file_size: int, source: str
) -> PtdHeader:
    """Parse the .ptd FlatTensor header (always present)."""
    _need_head(head, file_size, source)
    if len(head) < 16 or bytes(head[8:12]) != PTD_HEADER_MAGIC:
        raise FormatError(
            source, "FlatTensor header magic (bytes 8..12)", bytes(head[8:12]), "b'FH01'"
        )
    length = _u32(head, 12)
    if length < PTD_HEADER_MIN_LENGTH:
        raise FormatError(
            source, "FlatTensor header length", length, f">= {PTD_HEADER_MIN_LENGTH} bytes"
        )
    if 8 + length > file_size or len(head) < 48:
        raise FormatError(
            source,
            "FlatTensor header length",
            length,
            f"<= {file_size - 8} (the header must fit inside the {file_size}-byte file)",
        )
    fb_off = _u64(head, 16)
    fb_size = _u64(head, 24)
    base = _u64(head, 32)
    data_size = _u64(head, 40)
    if fb_off < 8 + length or fb_off > file_size:
        raise FormatError(
            source,
            "FlatTensor header flatbuffer_offset",
            fb_off,
            f"in [{8 + length}, {file_size}] (after the header, inside the file)",
        )
    if fb_off + fb_size > file_size:
        raise FormatError(
            source,
            "FlatTensor header flatbuffer_size",
            fb_size,
            f"<= {file_size - fb_off} (flatbuffer_offset {fb_off} + size must fit in the "
            f"{file_size}-byte file)",
        )
    meta_end = fb_off + fb_size
    if base < meta_end or base > file_size:
        raise FormatError(
            source,
            "FlatTensor header segment_base_offset",
            base,
            f"in [{meta_end}, {file_size}] (after the FlatBuffer, inside the file)",
        )
    if base + data_size > file_size:
        raise FormatError(
            source,
            "FlatTensor header segment_data_size",
            data_size,
            f"<= {file_size - base} (segment_base_offset {base} + size must not pass the end "
            f"of the {file_size}-byte file)",
        )
    return PtdHeader(length, fb_off, fb_size, base, data_size)


def metadata_size(head: bytes | bytearray | memoryview, file_size: int, source: str) -> int:
    """How many leading bytes hold the headers and the FlatBuffer."""
    kind = detect_kind(head, file_size, source)
    if kind == "pte":
        hdr = parse_pte_header(head, file_size, source)
        return file_size if hdr is None else hdr.program_size
    ptd = parse_ptd_header(head, file_size, source)
    return ptd.flatbuffer_offset + ptd.flatbuffer_size


def parse(meta: bytes | bytearray | memoryview, file_size: int, source: str) -> Container:
    """Parse metadata of either kind (dispatching on the file identifier)."""
    kind = detect_kind(meta, file_size, source)
    return (
        parse_pte(meta, file_size, source) if kind == "pte" else parse_ptd(meta, file_size, source)
    )


def _check_meta(meta: bytes | bytearray | memoryview, size: int, source: str, what: str) -> None:
    if len(meta) < size:
        raise FormatError(
            source,
            what,
            size,
            f"<= {len(meta)} (bytes available)",
            "the file is truncated",
        )


def _segments(view: FlatView, root: TableView, fid: int, where: str) -> tuple[Segment, ...]:
    vec = root.vector(fid, "segments", 4)
    if vec is None:
        return ()
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        off_pos = t.field_pos(_SEGMENT_OFFSET, "offset", 8)
        size_pos = t.field_pos(_SEGMENT_SIZE, "size", 8)
        out.append(
            Segment(
                index=i,
                offset=t.scalar(_SEGMENT_OFFSET, "offset", "u64"),
                size=t.scalar(_SEGMENT_SIZE, "size", "u64"),
                table_pos=t.pos,
                slot_pos=vec.elem_pos(i),
                offset_pos=off_pos,
                size_pos=size_pos,
            )
        )
    return tuple(out)


def _named_data(
    view: FlatView, root: TableView, fid: int, n_segments: int, with_layout: bool
) -> tuple[NamedDataEntry, ...]:
    vec = root.vector(fid, "named_data", 4)
    if vec is None:
        return ()
    out = []
    for i in range(vec.length):
        t = vec.table(i)
        key = t.string(_NAMED_KEY, "key")
        if key is None:
            raise FormatError(view.source, f"{t.field}.key", None, "present (a string)")
        idx = t.scalar(_NAMED_SEGMENT_INDEX, "segment_index", "u32")
        if idx >= n_segments:
            raise FormatError(
                view.source,
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
    source: str,
    segments: tuple[Segment, ...],
    base: int,
    file_size: int,
    data_size: int | None,
    has_header: bool,
    table: str,
) -> list[str]:
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


def parse_pte(meta: bytes | bytearray | memoryview, file_size: int, source: str) -> Container:
    """Parse a .pte from its metadata bytes ``[0, program_size)`` (more is fine)."""
    if detect_kind(meta, file_size, source) != "pte":
        raise FormatError(source, "file identifier (bytes 4..8)", bytes(meta[4:8]), "b'ET12'")
    header = parse_pte_header(meta[:HEAD_BYTES], file_size, source)
    program_size = file_size if header is None else header.program_size
    _check_meta(meta, program_size, source, "program_size")
    base = 0 if header is None else header.segment_base_offset
    data_size = None if header is None else header.segment_data_size

    view = FlatView(meta, source, limit=program_size)
    root = view.root("Program")

    segments = _segments(view, root, _PROGRAM_SEGMENTS, "Program")
    warnings = _check_segments(
        source, segments, base, file_size, data_size, header is not None, "Program"
    )
    n_seg = len(segments)

    inline_vec = root.vector(_PROGRAM_BACKEND_DELEGATE_DATA, "backend_delegate_data", 4)
    inline_spans: list[tuple[int, int]] = []
    if inline_vec is not None:
        for i in range(inline_vec.length):
            t = inline_vec.table(i)
            dv = t.vector(_INLINE_DATA, "data", 1)
            inline_spans.append((dv.start, dv.length) if dv else (0, 0))

    methods: list[str] = []
    delegates: list[Delegate] = []
    plans = root.vector(_PROGRAM_EXECUTION_PLAN, "execution_plan", 4)
    if plans is not None:
        for p in range(plans.length):
            plan = plans.table(p)
            name = plan.string(_PLAN_NAME, "name")
            if name is None:
                raise FormatError(source, f"{plan.field}.name", None, "present (a string)")
            methods.append(name)
            dvec = plan.vector(_PLAN_DELEGATES, "delegates", 4)
            if dvec is None:
                continue
            for d in range(dvec.length):
                delegates.append(_delegate(view, dvec, d, name, n_seg, len(inline_spans)))

    named = _named_data(view, root, _PROGRAM_NAMED_DATA, n_seg, with_layout=False)

    const = None
    ct = root.table(_PROGRAM_CONSTANT_SEGMENT, "constant_segment")
    if ct is not None:
        const = _subsegments(view, ct, segments)
    mutable: list[SubsegmentOffsets] = []
    mvec = root.vector(_PROGRAM_MUTABLE_DATA_SEGMENTS, "mutable_data_segments", 4)
    if mvec is not None:
        for i in range(mvec.length):
            mutable.append(_subsegments(view, mvec.table(i), segments))

    return Container(
        kind="pte",
        source=source,
        file_size=file_size,
        header=header,
        metadata_size=program_size,
        segment_base_offset=base,
        segments=segments,
        named_data=named,
        methods=tuple(methods),
        delegates=tuple(delegates),
        constant_segment=const,
        mutable_data_segments=tuple(mutable),
        inline_delegate_data=tuple(inline_spans),
        root_pos=root.pos,
        warnings=tuple(warnings),
    )


def _delegate(
    view: FlatView, dvec: Vector, d: int, method: str, n_seg: int, n_inline: int
) -> Delegate:
    t = dvec.table(d)
    bid = t.string(_DELEGATE_ID, "id")
    if bid is None:
        raise FormatError(view.source, f"{t.field}.id", None, "present (a backend id string)")
    ref = t.table(_DELEGATE_PROCESSED, "processed")
    if ref is None:
        raise FormatError(view.source, f"{t.field}.processed", None, "present")
    loc = ref.scalar(_REF_LOCATION, "location", "u8")
    index = ref.scalar(_REF_INDEX, "index", "u32")
    location: Literal["inline", "segment"]
    if loc == 0:
        location = "inline"
        if index >= n_inline:
            raise FormatError(
                view.source,
                f"{ref.field}.index",
                index,
                f"< {n_inline} (entries in Program.backend_delegate_data) for an INLINE "
                f"delegate of method {method!r}",
            )
    elif loc == 1:
        location = "segment"
        if index >= n_seg:
            raise FormatError(
                view.source,
                f"{ref.field}.index",
                index,
                f"< {n_seg} (the number of segments) for a SEGMENT delegate of method {method!r}",
            )
    else:
        raise FormatError(view.source, f"{ref.field}.location", loc, "0 (INLINE) or 1 (SEGMENT)")
    specs: list[CompileSpec] = []
    svec = t.vector(_DELEGATE_COMPILE_SPECS, "compile_specs", 4)
    if svec is not None:
        for s in range(svec.length):
            st = svec.table(s)
            key = st.string(_SPEC_KEY, "key") or ""
            vv = st.vector(_SPEC_VALUE, "value", 1)
            specs.append(CompileSpec(key, vv.u8s() if vv else b""))
    return Delegate(method, d, bid, location, index, tuple(specs))


def _subsegments(view: FlatView, t: TableView, segments: tuple[Segment, ...]) -> SubsegmentOffsets:
    idx = t.scalar(_SUBSEG_INDEX, "segment_index", "u32")
    ovec = t.vector(_SUBSEG_OFFSETS, "offsets", 8)
    offsets = tuple(ovec.u64s()) if ovec else ()
    if (offsets and len(offsets) > 1) or idx:
        if idx >= len(segments):
            raise FormatError(
                view.source,
                f"{t.field}.segment_index",
                idx,
                f"< {len(segments)} (the number of segments)",
            )
        seg_size = segments[idx].size
        for j, off in enumerate(offsets):
            if off > seg_size:
                raise FormatError(
                    view.source,
                    f"{t.field}.offsets[{j}]",
                    off,
                    f"<= {seg_size} (the size of segment {idx})",
                )
    return SubsegmentOffsets(idx, offsets)


def parse_ptd(meta: bytes | bytearray | memoryview, file_size: int, source: str) -> Container:
    """Parse a .ptd from its metadata bytes ``[0, flatbuffer_offset + flatbuffer_size)``."""
    if detect_kind(meta, file_size, source) != "ptd":
        raise FormatError(source, "file identifier (bytes 4..8)", bytes(meta[4:8]), "b'FT01'")
    header = parse_ptd_header(meta[:HEAD_BYTES], file_size, source)
    end = header.flatbuffer_offset + header.flatbuffer_size
    _check_meta(meta, end, source, "flatbuffer_offset + flatbuffer_size")
    view = FlatView(meta, source, limit=end)
    root = view.root("FlatTensor")
    segments = _segments(view, root, _FT_SEGMENTS, "FlatTensor")
    warnings = _check_segments(
        source,
        segments,
        header.segment_base_offset,
        file_size,
        header.segment_data_size,
        True,
        "FlatTensor",
    )
    named = _named_data(view, root, _FT_NAMED_DATA, len(segments), with_layout=True)
    return Container(
        kind="ptd",
        source=source,
        file_size=file_size,
        header=header,
        metadata_size=end,
        segment_base_offset=header.segment_base_offset,
        segments=segments,
        named_data=named,
        root_pos=root.pos,
        warnings=tuple(warnings),
    )
