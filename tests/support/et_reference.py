"""Independent reference reader for .pte / .ptd files, built ONLY on ExecuTorch's own code.

This is the ground truth the interop suite compares ptestore against.  It deliberately shares
no code with ptestore:

- .pte: the extended header is parsed by ``executorch.exir._serialize._program._ExtendedHeader``
  and the Program FlatBuffer is read through ExecuTorch's generated FlatBuffer classes
  (``executorch.exir._serialize.generated.executorch_flatbuffer``), after
  ``_patch_generated_flatbuffer_aliases()`` (needed in 1.4.1, see pte-format.md 11.3).
- .ptd: the header is parsed by ``executorch.extension.flat_tensor.serialize.serialize``'s
  ``_get_extended_header`` and the FlatTensor FlatBuffer is decoded by its
  ``_deserialize_to_flat_tensor`` (which runs the flatc bundled with ExecuTorch).
- Field presence (``reference_segment_field_presence``) asks the flatbuffers runtime's vtable
  lookup (``Table.Offset(slot) != 0``): for .pte through the generated classes' ``_tab``; for
  .ptd (ExecuTorch ships no generated Python classes for FlatTensor) through a
  ``flatbuffers.table.Table`` positioned with the slot numbers of ``flat_tensor.fbs``.

Importing this module is cheap; ExecuTorch is imported on first use (it costs ~3 s).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

PathOrBytes = str | os.PathLike[str] | bytes | bytearray | memoryview
Kind = Literal["pte", "ptd"]

# Vtable slots (4 + 2 * field id) from the schemas, used only for presence checks.
_SLOT_FIELD_0 = 4
_SLOT_FIELD_1 = 6
_PTD_ROOT_SEGMENTS_SLOT = 6  # FlatTensor.segments is field 1


def _read(path_or_bytes: PathOrBytes) -> bytes:
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return bytes(path_or_bytes)
    return Path(path_or_bytes).read_bytes()


def _guess_kind(data: bytes) -> Kind:
    return "ptd" if data[4:8] == b"FT01" else "pte"


@functools.lru_cache(maxsize=1)
def _program_module() -> Any:
    from executorch.exir._serialize._flatbuffer_program import (
        _patch_generated_flatbuffer_aliases,
    )

    _patch_generated_flatbuffer_aliases()
    from executorch.exir._serialize.generated.executorch_flatbuffer import Program

    return Program


def _pte_header(data: bytes) -> Any | None:
    from executorch.exir._serialize._program import _ExtendedHeader

    try:
        eh = _ExtendedHeader.from_bytes(data[8:])
    except ValueError:
        return None
    return eh if eh.is_valid() else None


def _pte_program(data: bytes) -> tuple[Any, Any | None]:
    """Returns (generated Program root, _ExtendedHeader or None)."""
    eh = _pte_header(data)
    program_size = eh.program_size if eh is not None else len(data)
    program_mod = _program_module()
    root = program_mod.Program.GetRootAs(data[:program_size], 0)
    return root, eh


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _pte_facts(data: bytes) -> dict[str, Any]:
    root, eh = _pte_program(data)
    header: dict[str, Any] | None = None
    if eh is not None:
        header = {
            "length": eh.length,
            "program_size": eh.program_size,
            "segment_base_offset": eh.segment_base_offset,
            "segment_data_size": eh.segment_data_size if eh.length >= 32 else None,
        }
    methods: list[str] = []
    delegates: list[dict[str, Any]] = []
    for i in range(root.ExecutionPlanLength()):
        plan = root.ExecutionPlan(i)
        name = _s(plan.Name())
        methods.append(name)
        for j in range(plan.DelegatesLength()):
            d = plan.Delegates(j)
            ref = d.Processed()
            specs = []
            for k in range(d.CompileSpecsLength()):
                cs = d.CompileSpecs(k)
                value = bytes(cs.Value(n) for n in range(cs.ValueLength()))
                specs.append({"key": _s(cs.Key()), "value": value.hex()})
            delegates.append(
                {
                    "method": name,
                    "id": _s(d.Id()),
                    "location": "segment" if ref.Location() == 1 else "inline",
                    "index": ref.Index(),
                    "compile_specs": specs,
                }
            )
    segments = []
    for i in range(root.SegmentsLength()):
        seg = root.Segments(i)
        segments.append({"index": i, "offset": seg.Offset(), "size": seg.Size()})
    named = []
    for i in range(root.NamedDataLength()):
        nd = root.NamedData(i)
        named.append({"key": _s(nd.Key()), "segment_index": nd.SegmentIndex()})
    return {
        "format": "pte",
        "file_size": len(data),
        "header": header,
        "methods": methods,
        "segments": segments,
        "named_data": named,
        "delegates": delegates,
    }


def _ptd_header(data: bytes) -> Any:
    from executorch.extension.flat_tensor.serialize.serialize import _get_extended_header

    eh = _get_extended_header(data)
    if eh is None:
        raise ValueError("not a .ptd: FlatTensor header missing or invalid")
    return eh


def _ptd_facts(data: bytes) -> dict[str, Any]:
    from executorch.extension.flat_tensor.serialize.serialize import (
        _deserialize_to_flat_tensor,
    )

    eh = _ptd_header(data)
    flat = _deserialize_to_flat_tensor(data[: eh.flatbuffer_offset + eh.flatbuffer_size])
    named = []
    for nd in flat.named_data:
        layout = nd.tensor_layout
        named.append(
            {
                "key": nd.key,
                "segment_index": nd.segment_index,
                "tensor_layout": None
                if layout is None
                else {
                    "scalar_type": int(layout.scalar_type),
                    "sizes": [int(v) for v in layout.sizes],
                    "dim_order": [int(v) for v in layout.dim_order],
                },
            }
        )
    return {
        "format": "ptd",
        "file_size": len(data),
        "header": {
            "length": eh.length,
            "flatbuffer_offset": eh.flatbuffer_offset,
            "flatbuffer_size": eh.flatbuffer_size,
            "segment_base_offset": eh.segment_base_offset,
            "segment_data_size": eh.segment_data_size,
        },
        "methods": [],
        "segments": [
            {"index": i, "offset": s.offset, "size": s.size} for i, s in enumerate(flat.segments)
        ],
        "named_data": named,
        "delegates": [],
    }


def reference_facts(path_or_bytes: PathOrBytes, kind: Kind | None = None) -> dict[str, Any]:
    """Facts about a .pte or .ptd, read with ExecuTorch's own code (same JSON shape as
    ``ptestore inspect --json``).  ``kind`` defaults to sniffing the FlatBuffer identifier."""
    data = _read(path_or_bytes)
    if kind is None:
        kind = _guess_kind(data)
    if kind == "pte":
        return _pte_facts(data)
    if kind == "ptd":
        return _ptd_facts(data)
    raise ValueError(f"kind must be 'pte' or 'ptd', not {kind!r}")


def reference_segment_field_presence(
    path_or_bytes: PathOrBytes, kind: Kind | None = None
) -> list[dict[str, Any]]:
    """For each DataSegment: whether its ``offset`` / ``size`` fields are physically present in
    the FlatBuffer (vtable entry non-zero), as opposed to omitted because they held 0."""
    data = _read(path_or_bytes)
    if kind is None:
        kind = _guess_kind(data)
    out: list[dict[str, Any]] = []
    if kind == "pte":
        root, _ = _pte_program(data)
        for i in range(root.SegmentsLength()):
            tab = root.Segments(i)._tab
            out.append(
                {
                    "index": i,
                    "offset_present": tab.Offset(_SLOT_FIELD_0) != 0,
                    "size_present": tab.Offset(_SLOT_FIELD_1) != 0,
                }
            )
        return out
    import flatbuffers

    eh = _ptd_header(data)
    buf = data[: eh.flatbuffer_offset + eh.flatbuffer_size]
    root_pos = flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)
    root = flatbuffers.table.Table(buf, root_pos)
    o = root.Offset(_PTD_ROOT_SEGMENTS_SLOT)
    if o == 0:
        return out
    vec = root.Vector(o)
    for i in range(root.VectorLen(o)):
        tab = flatbuffers.table.Table(buf, root.Indirect(vec + 4 * i))
        out.append(
            {
                "index": i,
                "offset_present": tab.Offset(_SLOT_FIELD_0) != 0,
                "size_present": tab.Offset(_SLOT_FIELD_1) != 0,
            }
        )
    return out


def reference_named_data_presence(path_or_bytes: PathOrBytes) -> list[dict[str, Any]]:
    """.pte only: for each NamedData entry, whether ``segment_index`` is physically present."""
    data = _read(path_or_bytes)
    root, _ = _pte_program(data)
    return [
        {
            "index": i,
            "key": _s(root.NamedData(i).Key()),
            "segment_index_present": root.NamedData(i)._tab.Offset(_SLOT_FIELD_1) != 0,
        }
        for i in range(root.NamedDataLength())
    ]


def reference_program_extras(path_or_bytes: PathOrBytes) -> dict[str, Any]:
    """.pte only: facts outside the ``inspect --json`` shape (constant segment, mutable data
    segments, inline delegate data sizes, FlatBuffer start offset)."""
    data = _read(path_or_bytes)
    root, _ = _pte_program(data)
    cs = root.ConstantSegment()
    constant = None
    if cs is not None:
        constant = {
            "segment_index": cs.SegmentIndex(),
            "offsets": [cs.Offsets(i) for i in range(cs.OffsetsLength())],
        }
    mutable = []
    for i in range(root.MutableDataSegmentsLength()):
        m = root.MutableDataSegments(i)
        mutable.append(
            {
                "segment_index": m.SegmentIndex(),
                "offsets": [m.Offsets(k) for k in range(m.OffsetsLength())],
            }
        )
    inline = [
        root.BackendDelegateData(i).DataLength() for i in range(root.BackendDelegateDataLength())
    ]
    root_offset = int.from_bytes(data[0:4], "little")
    return {
        "root_offset": root_offset,
        "constant_segment": constant,
        "mutable_data_segments": mutable,
        "inline_delegate_data_sizes": inline,
        "constant_buffer_count": root.ConstantBufferLength(),
    }


def segment_bytes(path_or_bytes: PathOrBytes, index: int, kind: Kind | None = None) -> bytes:
    """The bytes of segment ``index`` (absolute slice base + offset, size), via the reference."""
    data = _read(path_or_bytes)
    facts = reference_facts(data, kind)
    seg = facts["segments"][index]
    base = facts["header"]["segment_base_offset"] if facts["header"] else 0
    start = base + seg["offset"]
    return data[start : start + seg["size"]]
