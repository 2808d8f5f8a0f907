"""The regions of a file: what :func:`layout_regions` finds in a
:func:`ptestore.describe` object (headers, metadata, padding, every segment with its
users, waste, the provenance trailer), in file order. Pure (no I/O): the layout map
(:mod:`ptestore.viz`) draws them and ``inspect --compare`` compares them
(:mod:`.layoutdiff`)."""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from .model import Delegate, NamedDataEntry, SubsegmentOffsets
from .users import segment_users

__all__ = ["layout_regions", "region_users"]


@dataclass(frozen=True)
class _DescribedReferences:
    """The references of a :func:`ptestore.describe` object, as the model's records
    (what :func:`ptestore.format.users.segment_users` walks)."""

    named_data: tuple[NamedDataEntry, ...]
    delegates: tuple[Delegate, ...]
    constant_segment: SubsegmentOffsets | None
    mutable_data_segments: tuple[SubsegmentOffsets, ...]

    @classmethod
    def of(cls, desc: dict[str, Any]) -> _DescribedReferences:
        delegates = []
        positions: dict[str, int] = {}
        for d in desc.get("delegates", []):
            pos = positions.get(d["method"], 0)
            positions[d["method"]] = pos + 1
            delegates.append(Delegate(d["method"], pos, d["id"], d["location"], d["index"], ()))
        cs = desc.get("constant_segment")
        return cls(
            tuple(NamedDataEntry(r["key"], r["segment_index"]) for r in desc.get("named_data", [])),
            tuple(delegates),
            None if cs is None else SubsegmentOffsets(cs["segment_index"], tuple(cs["offsets"])),
            tuple(
                SubsegmentOffsets(m["segment_index"], tuple(m["offsets"]))
                for m in desc.get("mutable_data_segments", [])
            ),
        )


def region_users(desc: dict[str, Any]) -> dict[int, list[tuple[str, str]]]:
    """``segment index -> [(category, label)]`` from a describe() object."""
    out: dict[int, list[tuple[str, str]]] = {}
    for index, users in segment_users(_DescribedReferences.of(desc)).items():
        for u in users:
            if u.kind == "delegate":
                assert u.delegate is not None
                item = (f"delegate:{u.delegate.id}", u.label)
            elif u.kind == "constant":
                item = ("constant", f"constant data ({max(0, u.offsets - 1)} tensors)")
            else:
                item = (u.kind, u.label)
            out.setdefault(index, []).append(item)
    return out


def _tensor(row: dict[str, Any]) -> dict[str, Any]:
    info = row.get("tensor_info")
    if isinstance(info, dict):
        return {"dtype": info.get("dtype"), "shape": info.get("shape")}
    layout = row.get("tensor_layout")
    if isinstance(layout, dict):
        from .tensorinfo import SCALAR_TYPE_NAMES

        code = layout.get("scalar_type")
        name = SCALAR_TYPE_NAMES.get(code, f"scalar_type_{code}") if isinstance(code, int) else code
        return {"dtype": name, "shape": layout.get("sizes")}
    return {}


def layout_regions(
    desc: dict[str, Any], provenance: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The regions of a file, in file order, from its :func:`ptestore.describe` object
    (and its ``provenance`` record with ``trailer`` placement, if it has one).

    Each region has ``kind`` (``header``, ``metadata``, ``padding``, ``segment``,
    ``waste``, ``trailer``), ``category`` (what colours it: ``delegate:<backend>``,
    ``named``, ``constant``, ``mutable``, ``empty`` ...), ``start``, ``size``, ``label``,
    ``users`` and, for segments, ``segment``, ``offset``, ``alignment``, ``keys``."""
    regions: list[dict[str, Any]] = []

    def add(kind: str, start: int, size: int, label: str, **extra: Any) -> None:
        if size < 0:
            return
        item: dict[str, Any] = {"kind": kind, "category": kind, "start": start, "size": size}
        item["label"] = label
        item.update(extra)
        regions.append(item)

    h = desc.get("header")
    meta = int(desc.get("metadata_size", 0))
    if desc.get("format") == "ptd" and h is not None:
        add("header", 0, h["length"], "header (FlatTensor 'FH01')")
        fo, fs = h["flatbuffer_offset"], h["flatbuffer_size"]
        if fo > h["length"]:
            add("padding", h["length"], fo - h["length"], "alignment padding")
        add("metadata", fo, fs, "FlatBuffer (FlatTensor)")
        meta_end = fo + fs
    elif h is not None:
        add("header", 0, 8 + h["length"], "header (root offset, 'ET12', extended header)")
        add("metadata", 8 + h["length"], meta - 8 - h["length"], "FlatBuffer (Program)")
        meta_end = meta
    else:
        add("metadata", 0, meta, "FlatBuffer (Program)")
        meta_end = meta
    base = int(h["segment_base_offset"]) if h is not None else meta_end
    if base > meta_end:
        add("padding", meta_end, base - meta_end, "alignment padding")
    users = region_users(desc)
    rows_by_segment: dict[int, list[dict[str, Any]]] = {}
    for row in desc.get("named_data", []):
        rows_by_segment.setdefault(row["segment_index"], []).append(row)
    cursor = max(base, meta_end)
    for seg in sorted(desc.get("segments", []), key=lambda s: (s["absolute_offset"], s["index"])):
        start = int(seg["absolute_offset"])
        if start > cursor:
            add("padding", cursor, start - cursor, "alignment padding")
        used = users.get(seg["index"], [])
        if seg["size"] == 0:
            category = "empty"
        elif not used:
            category = "waste"
        else:
            category = sorted(used, key=lambda u: _PRIORITY.get(u[0].split(":")[0], 9))[0][0]
        rows = rows_by_segment.get(seg["index"], [])
        label = used[0][1] if used else ("empty segment" if not seg["size"] else "unreferenced")
        if len(used) > 1:
            label += f" (+{len(used) - 1} more)"
        add(
            "segment",
            start,
            int(seg["size"]),
            f"segment {seg['index']}: {label}",
            category=category,
            segment=seg["index"],
            offset=seg["offset"],
            alignment=seg["alignment"],
            users=[u[1] for u in used],
            keys=[r["key"] for r in rows],
            tensors=[_tensor(r) for r in rows],
        )
        cursor = max(cursor, start + int(seg["size"]))
    size = int(desc["file_size"])
    trailer = (provenance or {}).get("trailer") if isinstance(provenance, dict) else None
    content_end = int(trailer["offset"]) if isinstance(trailer, dict) else size
    if content_end > cursor:
        add("waste", cursor, content_end - cursor, "trailing bytes (no data)")
    if isinstance(trailer, dict):
        add(
            "trailer",
            int(trailer["offset"]),
            int(trailer["size"]),
            "provenance trailer",
            users=_provenance_lines(provenance or {}),
        )
    for i, r in enumerate(regions):
        r["id"] = i
        r.setdefault("users", [])
    return regions


_PRIORITY = {"delegate": 0, "constant": 1, "mutable": 2, "named": 3}


def _provenance_lines(p: dict[str, Any]) -> list[str]:
    out = []
    src = p.get("source")
    if isinstance(src, dict):
        out.append(f"source {src.get('url')} ({src.get('size')} bytes, {src.get('sha256')})")
    for b in p.get("backends", []) or []:
        if isinstance(b, dict):
            out.append(
                f"backend {b.get('id')}: {b.get('spec')} {b.get('version')} "
                f"({b.get('compatibility')})"
            )
    dev = p.get("device")
    if isinstance(dev, dict):
        out.append(f"device {dev.get('name')} ({dev.get('digest')})")
    if p.get("created"):
        out.append(f"created {p.get('created')} by ptestore {p.get('ptestore_version')}")
    return out
