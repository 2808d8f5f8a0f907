"""Tiny builders for synthetic Program FlatBuffers (forms no exporter produces).

Field ids follow schema/program.fbs declaration order.
"""

from __future__ import annotations

import struct

import flatbuffers


def offsets_vector(b: flatbuffers.Builder, items: list[int]) -> int:
    """A vector of table offsets (may repeat one table: aliasing)."""
    b.StartVector(4, len(items), 4)
    for item in reversed(items):
        b.PrependUOffsetTRelative(item)
    return int(b.EndVector())


def delegate(
    b: flatbuffers.Builder, backend_id: str, *, segment: bool, specs: int | None = None
) -> int:
    """A BackendDelegate whose processed data is SEGMENT 0 or INLINE 0 (index absent)."""
    bid = b.CreateString(backend_id)
    b.StartObject(2)  # BackendDelegateDataReference
    if segment:
        b.PrependUint8Slot(0, 1, 0)
    ref = b.EndObject()
    b.StartObject(3)  # BackendDelegate
    b.PrependUOffsetTRelativeSlot(0, bid, 0)
    b.PrependUOffsetTRelativeSlot(1, ref, 0)
    if specs is not None:
        b.PrependUOffsetTRelativeSlot(2, specs, 0)
    return int(b.EndObject())


def plan(b: flatbuffers.Builder, name: str, delegates: int) -> int:
    """An ExecutionPlan with a name and a delegates vector."""
    name_off = b.CreateString(name)
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(0, name_off, 0)
    b.PrependUOffsetTRelativeSlot(7, delegates, 0)
    return int(b.EndObject())


def finish_program(
    b: flatbuffers.Builder, plans: int, *, segments: int | None = None, inline: int | None = None
) -> bytes:
    """The Program root (no extended header: all segments must be empty)."""
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    if inline is not None:
        b.PrependUOffsetTRelativeSlot(3, inline, 0)
    if segments is not None:
        b.PrependUOffsetTRelativeSlot(4, segments, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"ET12")
    return bytes(b.Output())


def xnngraph(k: int) -> bytes:
    """An XNNGraph FlatBuffer whose ``xvalues`` are k references to one tensor value
    (no constant: nothing named)."""
    b = flatbuffers.Builder(0)
    b.StartObject(7)  # XNNTensorValue
    b.PrependUint32Slot(6, 1, 0)  # id_out
    tv = b.EndObject()
    b.StartObject(2)  # XValue
    b.PrependUint8Slot(0, 1, 0)  # xvalue_union_type = XNNTensorValue
    b.PrependUOffsetTRelativeSlot(1, tv, 0)
    xv = b.EndObject()
    xvalues = offsets_vector(b, [xv] * k)
    b.StartObject(9)  # XNNGraph
    b.PrependUOffsetTRelativeSlot(2, xvalues, 0)
    b.Finish(b.EndObject(), file_identifier=b"XN01")
    return bytes(b.Output())


def overlapping_xnnpack(
    n: int,
    k: int,
    *,
    stride: int = 0,
    backend: str = "XnnpackBackend",
    graph: bytes | None = None,
) -> bytes:
    """A .pte with n XNNPACK delegates, delegate i in segment i, all over one k-xvalue
    graph (or over ``graph``, an XNNGraph FlatBuffer). ``stride`` 0: every segment
    describes the same bytes. ``stride`` 8: segment i starts 8*i bytes later, at a
    FlatBuffer prefix (root offset, identifier) of its own that leads to the same root
    table, so the n graphs are distinct byte ranges.
    ``backend``: the delegates' id (another one's blobs are not read as graphs)."""
    graph = xnngraph(k) if graph is None else graph
    if stride:
        assert stride == 8
        root = 8 * n + struct.unpack_from("<I", graph)[0]
        blob = b"".join(struct.pack("<I", root - 8 * i) + b"XN01" for i in range(n)) + graph
    else:
        blob = graph
    b = flatbuffers.Builder(0)
    segs = []
    for i in range(n):
        b.StartObject(2)  # DataSegment
        b.PrependUint64Slot(0, stride * i, 0)
        b.PrependUint64Slot(1, len(blob) - stride * i, 0)
        segs.append(b.EndObject())
    segments = offsets_vector(b, segs)
    bid = b.CreateString(backend)
    delegates = []
    for i in range(n):
        b.StartObject(2)  # BackendDelegateDataReference: SEGMENT i
        b.PrependUint8Slot(0, 1, 0)
        b.PrependUint32Slot(1, i, 0)
        ref = b.EndObject()
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, bid, 0)
        b.PrependUOffsetTRelativeSlot(1, ref, 0)
        delegates.append(b.EndObject())
    plans = offsets_vector(b, [plan(b, "forward", offsets_vector(b, delegates))])
    fb = finish_program(b, plans, segments=segments)
    return with_segments(fb, blob)


def with_segments(fb: bytes, data: bytes) -> bytes:
    """The Program FlatBuffer ``fb`` with a 32-byte extended header spliced in and
    ``data`` as its segment bytes, at the next 128-byte boundary."""
    program_size = len(fb) + 32
    base = -(-program_size // 128) * 128
    header = b"eh00" + struct.pack("<IQQQ", 32, program_size, base, len(data))
    out = bytearray(fb[:8] + header + fb[8:])
    struct.pack_into("<I", out, 0, struct.unpack_from("<I", fb)[0] + 32)
    return bytes(out) + bytes(base - program_size) + data


#: A ``TensorLayout``: scalar type, sizes and dim order.
Layout = tuple[int, list[int], list[int]]


def flat_tensor(entries: list[tuple[str | bytes, Layout | None]], data: bytes = bytes(16)) -> bytes:
    """A FlatTensor .ptd (40-byte FH01 header) with one segment holding ``data`` and a
    named-data entry per ``(key, layout)`` on it, in that order (keys may repeat, hold
    any bytes; a layout None is absent)."""
    b = flatbuffers.Builder(0)
    named = []
    for key, layout in entries:
        lt = None
        if layout is not None:
            scalar_type, sizes, dim_order = layout
            b.StartVector(4, len(sizes), 4)
            for s in reversed(sizes):
                b.PrependInt32(s)
            sv = b.EndVector()
            dv = b.CreateByteVector(bytes(dim_order))
            b.StartObject(3)  # TensorLayout
            b.PrependInt8Slot(0, scalar_type, 0)
            b.PrependUOffsetTRelativeSlot(1, sv, 0)
            b.PrependUOffsetTRelativeSlot(2, dv, 0)
            lt = b.EndObject()
        k = b.CreateString(key)
        b.StartObject(3)  # NamedData: key, segment_index 0, tensor_layout
        b.PrependUOffsetTRelativeSlot(0, k, 0)
        b.PrependUint32Slot(1, 0, 1)
        if lt is not None:
            b.PrependUOffsetTRelativeSlot(2, lt, 0)
        named.append(b.EndObject())
    b.StartObject(2)  # DataSegment: offset 0, size
    b.PrependUint64Slot(0, 0, 1)
    b.PrependUint64Slot(1, len(data), 0)
    segments = offsets_vector(b, [b.EndObject()])
    named_vec = offsets_vector(b, named)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(1, segments, 0)
    b.PrependUOffsetTRelativeSlot(2, named_vec, 0)
    b.Finish(b.EndObject(), file_identifier=b"FT01")
    fb = bytes(b.Output())
    # The FH01 header goes after the first 8 bytes (the root offset moves by its size).
    meta_len = len(fb) + 40
    base = -(-meta_len // 16) * 16
    head = struct.pack("<I", struct.unpack_from("<I", fb)[0] + 40) + fb[4:8]
    header = b"FH01" + struct.pack("<IQQQQ", 40, 48, meta_len - 48, base, len(data))
    out = head + header + fb[8:]
    return out + bytes(base - len(out)) + data


def external_program(key: str, held: int, sizes: list[int]) -> bytes:
    """A .pte whose method ``forward`` has one float32 Tensor value of ``sizes`` whose data
    is EXTERNAL under ``key``, and which holds named data ``key`` itself: ``held`` bytes
    (of 64 zero bytes of segment data)."""
    b = flatbuffers.Builder(0)
    fqn = b.CreateString(key)
    b.StartObject(3)  # ExtraTensorInfo
    b.PrependUOffsetTRelativeSlot(1, fqn, 0)
    b.PrependUint8Slot(2, 1, 0)  # location EXTERNAL
    extra = b.EndObject()
    b.StartVector(4, len(sizes), 4)
    for d in reversed(sizes):
        b.PrependInt32(d)
    dims = b.EndVector()
    b.StartObject(10)  # Tensor
    b.PrependInt8Slot(0, 6, 0)  # float32
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    b.PrependUOffsetTRelativeSlot(9, extra, 0)
    tensor = b.EndObject()
    b.StartObject(2)  # EValue
    b.PrependUint8Slot(0, 5, 0)  # KernelTypes.Tensor
    b.PrependUOffsetTRelativeSlot(1, tensor, 0)
    values = offsets_vector(b, [b.EndObject()])
    name = b.CreateString("forward")
    delegates = offsets_vector(b, [])
    b.StartObject(8)  # ExecutionPlan
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    b.PrependUOffsetTRelativeSlot(7, delegates, 0)
    plans = offsets_vector(b, [b.EndObject()])
    b.StartObject(2)  # DataSegment 0: the value
    b.PrependUint64Slot(1, held, 0)
    segments = offsets_vector(b, [b.EndObject()])
    named_key = b.CreateString(key)
    b.StartObject(2)  # NamedData
    b.PrependUOffsetTRelativeSlot(0, named_key, 0)
    named = offsets_vector(b, [b.EndObject()])
    b.StartObject(8)  # Program
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    b.PrependUOffsetTRelativeSlot(4, segments, 0)
    b.PrependUOffsetTRelativeSlot(7, named, 0)
    b.Finish(b.EndObject(), file_identifier=b"ET12")
    return with_segments(bytes(b.Output()), bytes(64))
