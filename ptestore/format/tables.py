"""Decoders for the schema tables ptestore reads, one function per root field.

Field ids follow the declaration order of ExecuTorch's schema/program.fbs (``Program``)
and extension/flat_tensor/serialize/flat_tensor.fbs (``FlatTensor``); none of these
tables has a union. Every read goes through :mod:`.flatbuf`, which checks positions
first; indices into other tables are checked here.

Indices into the segments vector are checked against its length and then mapped to
physical segment indices (:class:`~ptestore.format.model.Segment`): entries that point
at one ``DataSegment`` table are one segment.
"""

from __future__ import annotations

from typing import Literal

from ..errors import FormatError
from .flatbuf import TableView, Vector
from .header import Kind
from .model import CompileSpec, Delegate, NamedDataEntry, Segment, SubsegmentOffsets, TensorLayout

__all__ = [
    "MAX_NAMED_DATA",
    "MAX_SEGMENTS",
    "SegmentMap",
    "read_constant_segment",
    "read_inline_data",
    "read_methods",
    "read_mutable_data_segments",
    "read_named_data",
    "read_segments",
]

#: The most named-data entries (keys) one container may have. Every entry costs work and
#: memory downstream (inspection, the merged named-data map, the layout, the report):
#: about 25 microseconds and a few hundred bytes each, so this bounds a hostile
#: container's cost to seconds; real models have a few thousand at most.
MAX_NAMED_DATA = 1 << 16
#: The most segments one container may have (the same reasoning: one per weight at most).
MAX_SEGMENTS = 1 << 16

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


#: Vector index -> physical segment index, for every entry of the segments vector.
SegmentMap = tuple[int, ...]


def read_segments(root: TableView, kind: Kind) -> tuple[tuple[Segment, ...], SegmentMap]:
    """``Program.segments`` / ``FlatTensor.segments`` as physical segments (one per
    distinct table, with the positions of its present fields and of every slot that
    points at it: the patch engine writes there), and the vector index -> segment map.

    The fields and slots are read untracked (see :mod:`.flatbuf`): they are what the
    patch engine rewrites."""
    vec = root.vector(_PROGRAM_SEGMENTS if kind == "pte" else _FT_SEGMENTS, "segments", 4)
    if vec is None:
        return (), ()
    _check_count(root, vec.length, "segments", MAX_SEGMENTS)
    by_table: dict[int, int] = {}  # table position -> physical index
    first: list[TableView] = []
    entries: list[list[int]] = []
    seg_of: list[int] = []
    for i in range(vec.length):
        t = vec.table(i, track=False)
        index = by_table.setdefault(t.pos, len(first))
        if index == len(first):
            first.append(t)
            entries.append([])
        entries[index].append(i)
        seg_of.append(index)
    out = []
    for index, t in enumerate(first):
        out.append(
            Segment(
                index=index,
                offset=t.scalar(_SEGMENT_OFFSET, "offset", "u64", track=False),
                size=t.scalar(_SEGMENT_SIZE, "size", "u64", track=False),
                offset_pos=t.field_pos(_SEGMENT_OFFSET, "offset", 8),
                size_pos=t.field_pos(_SEGMENT_SIZE, "size", 8),
                entries=tuple(entries[index]),
                slot_positions=tuple(vec.elem_pos(i) for i in entries[index]),
            )
        )
    return tuple(out), tuple(seg_of)


def _check_count(root: TableView, n: int, name: str, limit: int) -> None:
    """Refuse, before any per-entry work, a vector longer than ``limit`` entries."""
    if n > limit:
        raise FormatError(
            root.view.source,
            f"{root.field}.{name} (entries)",
            n,
            f"<= {limit}",
            "ptestore's limit on the entries of one container; each costs work and memory",
        )


def read_named_data(root: TableView, kind: Kind, seg_of: SegmentMap) -> tuple[NamedDataEntry, ...]:
    """``Program.named_data`` / ``FlatTensor.named_data``: key -> segment index (and, in a
    .ptd, the tensor layout). A key listed twice is refused (:class:`FormatError`
    naming both entries)."""
    n_segments = len(seg_of)
    fid = _PROGRAM_NAMED_DATA if kind == "pte" else _FT_NAMED_DATA
    vec = root.vector(fid, "named_data", 4)
    if vec is None:
        return ()
    _check_count(root, vec.length, "named_data", MAX_NAMED_DATA)
    source = root.view.source
    out = []
    first: dict[str, int] = {}  # key -> index of the entry that has it
    for i in range(vec.length):
        t = vec.table(i)
        key = t.string(_NAMED_KEY, "key")
        if key is None:
            raise FormatError(source, f"{t.field}.key", None, "present (a string)")
        j = first.setdefault(key, i)
        if j != i:
            # Exporters write each key once (NamedDataStore keys a dict); the runtime
            # would read the first entry only, and every later one is a second meaning
            # of the key that ptestore would have to describe and keep apart.
            raise FormatError(
                source,
                f"{t.field}.key",
                key,
                f"a key no other entry has ({vec.field}[{j}] has it too)",
                "a named-data key is listed once in a container",
            )
        idx = t.scalar(_NAMED_SEGMENT_INDEX, "segment_index", "u32")
        if idx >= n_segments:
            raise FormatError(
                source,
                f"{t.field}.segment_index",
                idx,
                f"< {n_segments} (the number of segments), for key {key!r}",
            )
        layout = None
        if kind == "ptd":
            lt = t.table(_NAMED_TENSOR_LAYOUT, "tensor_layout")
            if lt is not None:
                from .tensorinfo import read_dims  # a .ptd's layouts only: start-up

                sizes = read_dims(lt.vector(_LAYOUT_SIZES, "sizes", 4))
                dims = lt.vector(_LAYOUT_DIM_ORDER, "dim_order", 1)
                layout = TensorLayout(
                    scalar_type=lt.scalar(_LAYOUT_SCALAR_TYPE, "scalar_type", "i8"),
                    sizes=sizes,
                    dim_order=tuple(dims.u8s()) if dims else (),
                )
        out.append(NamedDataEntry(key, seg_of[idx], layout))
    return tuple(out)


def read_inline_data(root: TableView) -> tuple[tuple[int, int], ...]:
    """``(position, size)`` of each ``Program.backend_delegate_data`` blob."""
    vec = root.vector(_PROGRAM_BACKEND_DELEGATE_DATA, "backend_delegate_data", 4)
    if vec is None:
        return ()
    spans = []
    for i in range(vec.length):
        dv = vec.table(i).vector(_INLINE_DATA, "data", 1)
        spans.append((dv.start, dv.length) if dv else (0, 0))
    return tuple(spans)


def read_methods(
    root: TableView, seg_of: SegmentMap, n_inline: int
) -> tuple[tuple[str, ...], tuple[Delegate, ...]]:
    """Method names (``ExecutionPlan.name``) and every method's delegates."""
    methods: list[str] = []
    delegates: list[Delegate] = []
    plans = root.vector(_PROGRAM_EXECUTION_PLAN, "execution_plan", 4)
    if plans is None:
        return (), ()
    for p in range(plans.length):
        plan = plans.table(p)
        name = plan.string(_PLAN_NAME, "name")
        if name is None:
            raise FormatError(root.view.source, f"{plan.field}.name", None, "present (a string)")
        methods.append(name)
        dvec = plan.vector(_PLAN_DELEGATES, "delegates", 4)
        if dvec is None:
            # The runtime refuses to load such a method (method.cpp: "Missing delegates
            # field", 0x23); exporters write an empty vector for a method without any.
            raise FormatError(
                root.view.source,
                f"{plan.field}.delegates",
                None,
                f"present (an empty vector when method {name!r} has no delegate)",
            )
        for d in range(dvec.length):
            delegates.append(_delegate(dvec, d, name, seg_of, n_inline))
    return tuple(methods), tuple(delegates)


def _delegate(dvec: Vector, d: int, method: str, seg_of: SegmentMap, n_inline: int) -> Delegate:
    """One ``BackendDelegate``; its processed-data index is checked against its target."""
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
        if index >= len(seg_of):
            raise FormatError(
                source,
                f"{ref.field}.index",
                index,
                f"< {len(seg_of)} (the number of segments) for a SEGMENT delegate of "
                f"method {method!r}",
            )
        index = seg_of[index]
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


def read_constant_segment(
    root: TableView, segments: tuple[Segment, ...], seg_of: SegmentMap
) -> SubsegmentOffsets | None:
    """``Program.constant_segment``, None when absent."""
    t = root.table(_PROGRAM_CONSTANT_SEGMENT, "constant_segment")
    return None if t is None else _subsegment_offsets(t, segments, seg_of)


def read_mutable_data_segments(
    root: TableView, segments: tuple[Segment, ...], seg_of: SegmentMap
) -> tuple[SubsegmentOffsets, ...]:
    """``Program.mutable_data_segments``."""
    vec = root.vector(_PROGRAM_MUTABLE_DATA_SEGMENTS, "mutable_data_segments", 4)
    if vec is None:
        return ()
    return tuple(_subsegment_offsets(vec.table(i), segments, seg_of) for i in range(vec.length))


def _subsegment_offsets(
    t: TableView, segments: tuple[Segment, ...], seg_of: SegmentMap
) -> SubsegmentOffsets:
    idx = t.scalar(_SUBSEG_INDEX, "segment_index", "u32")
    ovec = t.vector(_SUBSEG_OFFSETS, "offsets", 8)
    offsets = tuple(ovec.u64s()) if ovec else ()
    if len(offsets) > 1 or idx:
        if idx >= len(seg_of):
            raise FormatError(
                t.view.source,
                f"{t.field}.segment_index",
                idx,
                f"< {len(seg_of)} (the number of segments)",
            )
        idx = seg_of[idx]
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
