"""What the description of a container sums up, computed from the model alone (no
I/O): its header as JSON, the bytes that hold no data (:func:`waste`), every key of a
program as the runtime merges a .pte and its .ptd (:func:`key_rows`) and the keys whose
stored size differs from their tensor info (:func:`size_warnings`).
:mod:`ptestore.inspection` (``describe``, ``inspect``) shows them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .model import Container, PtdHeader, PteHeader
from .users import segment_users

__all__ = ["NamedRow", "header_json", "key_rows", "size_warnings", "waste"]

#: A ``named_data`` row of :func:`ptestore.describe`: key, segment_index, size,
#: tensor_info.
NamedRow = dict[str, Any]


def header_json(c: Container) -> dict[str, Any] | None:
    """The header fields of ``c`` (None for a .pte without an extended header)."""
    h = c.header
    if h is None:
        return None
    if isinstance(h, PteHeader):
        return {
            "length": h.length,
            "program_size": h.program_size,
            "segment_base_offset": h.segment_base_offset,
            "segment_data_size": h.segment_data_size,
        }
    assert isinstance(h, PtdHeader)
    return {
        "length": h.length,
        "flatbuffer_offset": h.flatbuffer_offset,
        "flatbuffer_size": h.flatbuffer_size,
        "segment_base_offset": h.segment_base_offset,
        "segment_data_size": h.segment_data_size,
    }


def waste(c: Container) -> dict[str, int]:
    """Bytes that hold no data: alignment padding, gaps, unreferenced segments, tail."""
    base = c.segment_base_offset
    header_pad = max(0, base - c.metadata_size) if base else 0
    spans = sorted((s.offset, s.offset + s.size) for s in c.segments if s.size)
    gaps = 0
    cursor = 0
    for start, end in spans:
        if start > cursor:
            gaps += start - cursor
        cursor = max(cursor, end)
    users = segment_users(c)
    unreferenced = sum(s.size for s in c.segments if not users.get(s.index))
    data_end = base + cursor if base else c.metadata_size
    tail = max(0, c.file_size - max(data_end, c.metadata_size))
    return {
        "program_padding": header_pad,
        "segment_gaps": gaps,
        "unreferenced_segments": unreferenced,
        "trailing_bytes": tail,
        "total": header_pad + gaps + unreferenced + tail,
    }


def key_rows(pte: Container, index: Any, ptd: Container | None = None) -> list[NamedRow]:
    """Every key the program uses, as the runtime merges them (a .ptd entry wins): key,
    ``file`` (``"pte"``, ``"ptd"``, or ``"external"`` for a key the program describes
    but neither file given holds: it comes from a .ptd), ``segment_index`` and ``size``
    (None when external) and ``tensor_info``."""
    rows: dict[str, NamedRow] = {}
    for c in (ptd, pte):
        if c is None:
            continue
        for e in c.named_data:
            rows.setdefault(
                e.key,
                {
                    "key": e.key,
                    "file": c.kind,
                    "segment_index": e.segment_index,
                    "size": c.segments[e.segment_index].size,
                },
            )
    for key in index:
        rows.setdefault(key, {"key": key, "file": "external", "segment_index": None, "size": None})
    for key, row in rows.items():
        info = index.get(key)
        row["tensor_info"] = None if info is None else info.to_json()
    return list(rows.values())


def size_warnings(keys: Sequence[NamedRow]) -> list[str]:
    """A warning per key whose stored size differs from its tensor info (a declared
    size change: a stock runtime reads the value as the tensor info says)."""
    out = []
    for row in keys:
        info, size = row.get("tensor_info"), row.get("size")
        if info is None or size is None or size == info["nbytes"]:
            continue
        out.append(
            f"key {row['key']!r}: {size} bytes, but its tensor info says {info['dtype']} "
            f"{info['shape']}, {info['nbytes']} bytes (a declared size change: only a "
            "runtime that reads this backend's own format can use it)"
        )
    return out
