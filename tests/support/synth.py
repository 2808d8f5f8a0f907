"""Tiny builders for synthetic Program FlatBuffers (forms no exporter produces).

Field ids follow schema/program.fbs declaration order.
"""

from __future__ import annotations

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
