"""Describe a parsed container as JSON-ready data or a readable table."""

from __future__ import annotations

from typing import Any

from .format.model import Container, PtdHeader, PteHeader, inferred_alignment

__all__ = ["describe", "render_table", "segment_users", "waste"]


def _header_json(c: Container) -> dict[str, Any] | None:
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


def segment_users(c: Container) -> dict[int, list[str]]:
    """Who references each segment: named keys, delegates, constant/mutable data."""
    users: dict[int, list[str]] = {s.index: [] for s in c.segments}
    if c.constant_segment is not None:
        users.setdefault(c.constant_segment.segment_index, []).append("constant data")
    for i, m in enumerate(c.mutable_data_segments):
        users.setdefault(m.segment_index, []).append(f"mutable data {i}")
    for d in c.delegates:
        if d.location == "segment":
            users.setdefault(d.index, []).append(f"delegate {d.method}[{d.position}] {d.id}")
    for e in c.named_data:
        users.setdefault(e.segment_index, []).append(f"key {e.key}")
    return users


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


def describe(c: Container) -> dict[str, Any]:
    """The ``ptestore inspect --json`` object."""
    named: list[dict[str, Any]] = []
    for e in c.named_data:
        item: dict[str, Any] = {"key": e.key, "segment_index": e.segment_index}
        if c.kind == "ptd":
            lt = e.tensor_layout
            item["tensor_layout"] = None if lt is None else lt.to_json()
        named.append(item)
    return {
        "format": c.kind,
        "source": c.source,
        "file_size": c.file_size,
        "header": _header_json(c),
        "metadata_size": c.metadata_size,
        "methods": list(c.methods),
        "segments": [
            {
                "index": s.index,
                "offset": s.offset,
                "size": s.size,
                "absolute_offset": c.segment_base_offset + s.offset,
                "alignment": inferred_alignment(c.segment_base_offset + s.offset),
                "offset_present": s.offset_present,
                "size_present": s.size_present,
            }
            for s in c.segments
        ],
        "named_data": named,
        "delegates": [
            {
                "method": d.method,
                "id": d.id,
                "location": d.location,
                "index": d.index,
                "compile_specs": [
                    {"key": cs.key, "value": cs.value.hex()} for cs in d.compile_specs
                ],
            }
            for d in c.delegates
        ],
        "constant_segment": None
        if c.constant_segment is None
        else {
            "segment_index": c.constant_segment.segment_index,
            "offsets": list(c.constant_segment.offsets),
        },
        "mutable_data_segments": [
            {"segment_index": m.segment_index, "offsets": list(m.offsets)}
            for m in c.mutable_data_segments
        ],
        "waste": waste(c),
        "warnings": list(c.warnings),
    }


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if cell.isdigit() else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    lines = [fmt(headers), fmt(["-" * w for w in widths])]
    lines.extend(fmt(r) for r in rows)
    return lines


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(c: Container) -> str:
    """A readable multi-section report of a container."""
    out: list[str] = []
    kind = ".pte (ExecuTorch Program)" if c.kind == "pte" else ".ptd (FlatTensor data)"
    out.append(f"{c.source}: {kind}, {c.file_size} bytes")
    h = _header_json(c)
    if h is None:
        out.append("header: none (no segment data)")
    else:
        out.append("header: " + ", ".join(f"{k}={v}" for k, v in h.items()))
    out.append(f"metadata: {c.metadata_size} bytes")
    if c.kind == "pte":
        out.append("")
        out.append(f"methods ({len(c.methods)}): " + ", ".join(c.methods))
        out.append("")
        out.append(f"delegates ({len(c.delegates)}):")
        if c.delegates:
            rows = []
            for d in c.delegates:
                specs = "; ".join(
                    f"{cs.key}={_short(cs.value.hex(), 24)}" for cs in d.compile_specs
                )
                rows.append(
                    [d.method, str(d.position), d.id, d.location, str(d.index), specs or "-"]
                )
            out.extend(
                "  " + line
                for line in _table(
                    ["method", "#", "backend", "location", "index", "compile specs"], rows
                )
            )
    out.append("")
    users = segment_users(c)
    out.append(f"segments ({len(c.segments)}), base {c.segment_base_offset}:")
    if c.segments:
        rows = []
        for s in c.segments:
            absolute = c.segment_base_offset + s.offset
            used = users.get(s.index) or ["(unreferenced)"]
            label = used[0] if len(used) == 1 else f"{used[0]} (+{len(used) - 1} more)"
            rows.append(
                [
                    str(s.index),
                    str(s.offset),
                    str(absolute),
                    str(s.size),
                    str(inferred_alignment(absolute)),
                    _short(label, 60),
                ]
            )
        out.extend(
            "  " + line
            for line in _table(["#", "offset", "absolute", "size", "align", "used by"], rows)
        )
    out.append("")
    out.append(f"named data ({len(c.named_data)}):")
    if c.named_data:
        rows = []
        for e in c.named_data:
            size = c.segments[e.segment_index].size
            row = [_short(e.key, 66), str(e.segment_index), str(size)]
            if c.kind == "ptd":
                lt = e.tensor_layout
                row.append("-" if lt is None else f"type {lt.scalar_type} sizes {list(lt.sizes)}")
            rows.append(row)
        heads = ["key", "segment", "size"] + (["layout"] if c.kind == "ptd" else [])
        out.extend("  " + line for line in _table(heads, rows))
    w = waste(c)
    out.append("")
    out.append(
        "waste: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w.items() if k != "total")
        + f"; total {w['total']} bytes ({100.0 * w['total'] / max(1, c.file_size):.1f}%)"
    )
    for warning in c.warnings:
        out.append(f"warning: {warning}")
    return "\n".join(out)
