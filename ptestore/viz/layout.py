"""The layout map: one self-contained HTML page that draws where every byte of a .pte or
.ptd (or a pair) lies, to scale or in a readable mode, and what a specialization changed.

:func:`layout_html` reads the files (metadata only, plus the provenance trailer; with
``compare`` also the segment bytes of both sides, to tell replaced from unchanged) and
returns the page; :func:`write_layout_html` writes it. :func:`layout_regions` turns a
:func:`ptestore.describe` object into the regions the page draws, and
:func:`render_layout` draws regions; both work on synthesized descriptions too.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from .html import esc, human, page, write_text

__all__ = [
    "FileMap",
    "compare_regions",
    "layout_html",
    "layout_regions",
    "render_layout",
    "write_layout_html",
]

#: Width of the drawing in SVG units (the SVG scales to the window's width).
WIDTH = 1000.0
#: Smallest width of a region in readable mode, and of a zero-size marker.
MIN_READABLE = 3.0

#: Fill colour of each category (delegates get theirs from :data:`DELEGATE_COLOURS`).
COLOURS = {
    "header": "#3f5f8f",
    "metadata": "#86a3cc",
    "padding": "#e3e7eb",
    "waste": "#d9534f",
    "trailer": "#8e6cc0",
    "named": "#3aa17e",
    "constant": "#e0a030",
    "mutable": "#d0608f",
    "empty": "#9aa5b1",
}
DELEGATE_COLOURS = ("#2f7ed8", "#0b9ea8", "#5d4ec9", "#1f5f99", "#2aa0d8", "#6a8f1f")
#: Fill colour of each change status (``compare``).
STATUS_COLOURS = {
    "unchanged": "#b8c2cc",
    "moved": "#f2b134",
    "cloned": "#1fa5b3",
    "replaced": "#e8684a",
    "grown": "#b3308c",
    "shrunk": "#7c5cd6",
    "new": "#3b9c3b",
    "layout": "#dfe4e8",
}
STATUS_TEXT = {
    "unchanged": "same bytes at the same offset",
    "moved": "same bytes, new offset (copied)",
    "cloned": "same bytes shared with the source (reflink, no copy)",
    "replaced": "new bytes, same size",
    "grown": "new bytes, larger",
    "shrunk": "new bytes, smaller",
    "new": "no counterpart in the source",
    "layout": "header, metadata, padding or trailer",
}


@dataclass
class FileMap:
    """One file drawn on the page: its name, size, regions and (for a comparison) role."""

    title: str
    url: str
    file_size: int
    regions: list[dict[str, Any]]
    role: str = ""
    notes: list[str] = field(default_factory=list)


def _users(desc: dict[str, Any]) -> dict[int, list[tuple[str, str]]]:
    """``segment index -> [(category, label)]`` from a describe() object."""
    users: dict[int, list[tuple[str, str]]] = {}
    positions: dict[str, int] = {}
    for d in desc.get("delegates", []):
        pos = positions.get(d["method"], 0)
        positions[d["method"]] = pos + 1
        if d.get("location") == "segment":
            users.setdefault(d["index"], []).append(
                (f"delegate:{d['id']}", f"delegate {d['method']}[{pos}] {d['id']}")
            )
    cs = desc.get("constant_segment")
    if cs is not None:
        n = max(0, len(cs.get("offsets", [])) - 1)
        users.setdefault(cs["segment_index"], []).append(
            ("constant", f"constant data ({n} tensors)")
        )
    for i, m in enumerate(desc.get("mutable_data_segments", [])):
        users.setdefault(m["segment_index"], []).append(("mutable", f"mutable data {i}"))
    for row in desc.get("named_data", []):
        users.setdefault(row["segment_index"], []).append(("named", f"key {row['key']}"))
    return users


def _tensor(row: dict[str, Any]) -> dict[str, Any]:
    info = row.get("tensor_info")
    if isinstance(info, dict):
        return {"dtype": info.get("dtype"), "shape": info.get("shape")}
    layout = row.get("tensor_layout")
    if isinstance(layout, dict):
        from ..format.tensorinfo import SCALAR_TYPE_NAMES

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
    users = _users(desc)
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


# ---------------------------------------------------------------------------- compare


def _identity(region: dict[str, Any]) -> tuple[str, ...] | None:
    if region["kind"] != "segment" or not region["users"]:
        return None
    return tuple(sorted(region["users"]))


def compare_regions(
    source: list[dict[str, Any]],
    artifact: list[dict[str, Any]],
    source_hashes: dict[int, str] | None = None,
    artifact_hashes: dict[int, str] | None = None,
    shared: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Mark every region of ``artifact`` (and of ``source``) with its ``status``:
    ``replaced``, ``grown``, ``shrunk``, ``moved``, ``cloned``, ``unchanged``, ``new``
    (artifact only) or ``removed`` (source only); ``layout`` for non-segment regions.

    Segments are matched by their users (the same keys, delegates or constant data).
    ``*_hashes`` (segment index -> digest) tell new bytes from the same bytes; without
    them a same-size segment counts as unchanged. ``shared``: byte ranges of the
    artifact that share storage with another file (FIEMAP), which makes an unchanged
    segment ``cloned``."""
    by_id: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in source:
        ident = _identity(r)
        r["status"] = "layout" if r["kind"] != "segment" else "removed"
        if ident is not None:
            by_id.setdefault(ident, r)
    for r in artifact:
        if r["kind"] != "segment":
            r["status"] = "layout"
            continue
        ident = _identity(r)
        old = by_id.pop(ident, None) if ident is not None else None
        if old is None:
            r["status"] = "empty" if r["size"] == 0 else "new"
            continue
        old["status"] = "kept"
        r["was"] = {"start": old["start"], "size": old["size"], "segment": old.get("segment")}
        same: bool
        if source_hashes is not None and artifact_hashes is not None:
            same = source_hashes.get(old["segment"]) == artifact_hashes.get(r["segment"])
        else:
            same = old["size"] == r["size"]
        if not same:
            if r["size"] > old["size"]:
                r["status"] = "grown"
            elif r["size"] < old["size"]:
                r["status"] = "shrunk"
            else:
                r["status"] = "replaced"
        elif shared and r["size"] and _covered(r["start"], r["size"], shared):
            r["status"] = "cloned"
        elif r["start"] == old["start"]:
            r["status"] = "unchanged"
        else:
            r["status"] = "moved"
        old["status"] = r["status"]


def _covered(start: int, size: int, ranges: Sequence[tuple[int, int]]) -> bool:
    """Whether ``[start, start+size)`` lies in the union of ``ranges``, except for its
    first and last partial blocks (a clone shares whole blocks only)."""
    end = start + size
    covered = 0
    for a, b in ranges:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            covered += hi - lo
    return covered >= size - 2 * 4096 and covered > 0


def shared_ranges(path: str) -> list[tuple[int, int]] | None:
    """Byte ranges of the local file ``path`` whose extents the file system flags as
    shared (FIEMAP_EXTENT_SHARED: reflinked); None where FIEMAP is unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import struct

    fs_ioc_fiemap = 0xC020660B
    count = 512
    header = struct.Struct("=QQIIII")
    extent = struct.Struct("=QQQQQIIII")
    out: list[tuple[int, int]] = []
    start = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        while True:
            buf = bytearray(header.pack(start, 2**64 - 1 - start, 1, 0, count, 0))
            buf += bytes(extent.size * count)
            try:
                fcntl.ioctl(fd, fs_ioc_fiemap, buf, True)
            except OSError:
                return None
            mapped = header.unpack_from(buf)[3]
            if mapped == 0:
                return out
            last = False
            for i in range(mapped):
                logical, _phys, length, _r1, _r2, flags, *_ = extent.unpack_from(
                    buf, header.size + i * extent.size
                )
                if flags & 0x2000:  # FIEMAP_EXTENT_SHARED
                    out.append((logical, logical + length))
                start = logical + length
                last = last or bool(flags & 0x1)  # FIEMAP_EXTENT_LAST
            if last:
                return out
    finally:
        os.close(fd)


def _segment_hashes(
    url: str, desc: dict[str, Any], storage_options: dict[str, Any]
) -> dict[int, str]:
    from ..storage.loaders import open_loader

    loader = open_loader(url, **storage_options)
    out: dict[int, str] = {}
    try:
        for seg in desc["segments"]:
            h = hashlib.sha256()
            pos, end = int(seg["absolute_offset"]), int(seg["absolute_offset"]) + int(seg["size"])
            while pos < end:
                n = min(8 << 20, end - pos)
                h.update(loader.load(pos, n))
                pos += n
            out[int(seg["index"])] = h.hexdigest()
    finally:
        loader.close()
    return out


# ---------------------------------------------------------------------------- reading


def _read(
    url: str, storage_options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from ..inspection import describe_container, read_description
    from ..provenance import provenance_json
    from ..storage.loaders import open_loader

    container, rows = read_description(url, **storage_options)
    desc = describe_container(container, rows)
    loader = open_loader(url, **storage_options)
    try:
        prov = provenance_json(loader)
    finally:
        loader.close()
    return desc, prov


def _file_map(
    url: str, desc: dict[str, Any], prov: dict[str, Any] | None, role: str = ""
) -> FileMap:
    notes = list(desc.get("warnings", []))
    if isinstance(prov, dict) and "error" in prov:
        notes.append(f"provenance trailer: {prov['error']}")
        prov = None
    kind = ".pte" if desc.get("format") == "pte" else ".ptd"
    title = f"{role + ': ' if role else ''}{kind} {os.path.basename(url.rstrip('/')) or url}"
    return FileMap(title, url, int(desc["file_size"]), layout_regions(desc, prov), role, notes)


def _local_path(url: str) -> str | None:
    from ..storage.types import local_path

    return local_path(url)


def layout_html(
    url: str | os.PathLike[str],
    *,
    ptd: str | os.PathLike[str] | None = None,
    compare: str | os.PathLike[str] | None = None,
    compare_ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> str:
    """The layout map of ``url`` (a .pte or .ptd, local path or fsspec URL) as one
    self-contained HTML page.

    Args:
        url: the file to draw.
        ptd: its .ptd, drawn below it (a pair).
        compare: the source ``url`` was specialized from: the page then draws both and
            marks each segment replaced, grown, shrunk, moved, cloned, unchanged or new.
            This reads the segment bytes of both files (to compare them).
        compare_ptd: the source of ``ptd``, compared the same way.
        **storage_options: as for :func:`ptestore.open_loader`, for every URL.

    Raises the errors of :func:`ptestore.describe`."""
    url = os.fspath(url)
    maps: list[FileMap] = []
    pairs = [(url, None if compare is None else os.fspath(compare))]
    if ptd is not None:
        pairs.append((os.fspath(ptd), None if compare_ptd is None else os.fspath(compare_ptd)))
    if compare_ptd is not None and ptd is None:
        raise ConfigurationError("compare_ptd (--compare-ptd) needs ptd (--ptd PTD)")
    for i, (target, source) in enumerate(pairs):
        desc, prov = _read(target, storage_options)
        want = "ptd" if i else "pte"
        if ptd is not None and desc["format"] != want:  # as inspect --ptd refuses it
            raise ConfigurationError(
                f"inspect {url} with --ptd {os.fspath(ptd)}: expected a .pte and a .ptd, "
                f"found a .{desc['format']} as the {'.ptd' if i else '.pte'}"
            )
        if source is None:
            maps.append(_file_map(target, desc, prov))
            continue
        sdesc, sprov = _read(source, storage_options)
        smap = _file_map(source, sdesc, sprov, "source")
        amap = _file_map(target, desc, prov, "specialized")
        local = _local_path(target)
        shared = shared_ranges(local) if local is not None else None
        compare_regions(
            smap.regions,
            amap.regions,
            _segment_hashes(source, sdesc, storage_options),
            _segment_hashes(target, desc, storage_options),
            shared,
        )
        maps.extend([smap, amap])
    title = f"ptestore layout map: {os.path.basename(url.rstrip('/')) or url}"
    return render_layout(maps, title=title)


def write_layout_html(
    path: str | os.PathLike[str], url: str | os.PathLike[str], **kwargs: Any
) -> None:
    """Write :func:`layout_html` of ``url`` to the local file ``path``."""
    write_text(path, layout_html(url, **kwargs))


# ---------------------------------------------------------------------------- drawing


def _colour(category: str, backends: list[str]) -> str:
    if category.startswith("delegate:"):
        name = category.split(":", 1)[1]
        if name not in backends:
            backends.append(name)
        return DELEGATE_COLOURS[backends.index(name) % len(DELEGATE_COLOURS)]
    return COLOURS.get(category, "#999999")


def _readable_positions(regions: list[dict[str, Any]], size: int) -> dict[int, float]:
    """A monotone map from byte offsets to x in readable mode: every interval between
    two region boundaries gets a width that grows with the log of its size."""
    import math

    points = sorted(
        {0, size, *(r["start"] for r in regions), *(r["start"] + r["size"] for r in regions)}
    )
    spans = [b - a for a, b in itertools.pairwise(points)]
    # every interval gets a fixed minimum, the rest of the width by the log of its size
    least = min(MIN_READABLE, 0.5 * WIDTH / max(1, len(spans)))
    logs = [math.log2(1 + n) for n in spans]
    share = (WIDTH - least * len(spans)) / (sum(logs) or 1.0)
    xs = {points[0]: 0.0}
    x = 0.0
    for p, lg in zip(points[1:], logs, strict=False):
        x += least + lg * share
        xs[p] = x
    return xs


def _svg(fm: FileMap, index: int, backends: list[str]) -> str:
    size = max(1, fm.file_size)
    readable = _readable_positions(fm.regions, size)
    height = 46
    parts = [
        f'<svg class="map" id="map-{index}" viewBox="0 0 {WIDTH:.0f} {height}" '
        f'preserveAspectRatio="none" role="img" aria-label="{esc(fm.title)}">'
    ]
    for r in fm.regions:
        xs = r["start"] * WIDTH / size
        ws = r["size"] * WIDTH / size
        xr = readable[r["start"]]
        wr = readable[r["start"] + r["size"]] - xr
        fill = _colour(r["category"], backends)
        sfill = STATUS_COLOURS.get(r.get("status", ""), "#eeeeee")
        zero = r["size"] == 0
        cls = "region zero" if zero else "region"
        y, hgt = (2, height - 4) if not zero else (0, height)
        parts.append(
            f'<rect class="{cls}" data-id="{index}-{r["id"]}" data-kind="{esc(r["kind"])}" '
            f'data-category="{esc(r["category"])}" data-status="{esc(r.get("status", ""))}" '
            f'data-label="{esc(r["label"])}" data-xs="{xs:.3f}" data-ws="{ws:.3f}" '
            f'data-xr="{xr:.3f}" data-wr="{wr:.3f}" data-fill="{fill}" data-sfill="{sfill}" '
            f'x="{xs:.3f}" y="{y}" width="{1.5 if zero else ws:.3f}" height="{hgt}" fill="{fill}">'
            f"<title>{esc(r['label'])} [{r['start']}, {r['start'] + r['size']}) "
            f"{esc(human(r['size']))}</title></rect>"
        )
    parts.append("</svg>")
    parts.append(_ruler(fm.file_size, readable))
    return "".join(parts)


def _ruler(size: int, readable: dict[int, float]) -> str:
    """Byte offsets under a bar at 0, 1/4, 1/2, 3/4 and the end, placed for both modes
    (``data-xs``/``data-xr`` in drawing units; the script moves them)."""
    points = sorted(readable)
    ticks = []
    for i in range(5):
        off = size * i // 4
        # readable x of ``off``: linear inside the interval between two boundaries
        j = max(0, min(len(points) - 2, _bisect(points, off)))
        a, b = points[j], points[j + 1]
        xa, xb = readable[a], readable[b]
        xr = xa + (xb - xa) * ((off - a) / (b - a) if b > a else 0.0)
        xs = off * WIDTH / max(1, size)
        align = "start" if i == 0 else ("end" if i == 4 else "mid")
        ticks.append(
            f'<span class="tick {align}" data-xs="{xs:.3f}" data-xr="{xr:.3f}" '
            f'style="left:{xs / WIDTH * 100:.3f}%">{off:,}</span>'
        )
    return f'<div class="ruler">{"".join(ticks)}</div>'


def _bisect(points: list[int], value: int) -> int:
    import bisect

    return bisect.bisect_right(points, value) - 1


def _table(fm: FileMap, index: int) -> str:
    rows = []
    for r in fm.regions:
        tensors = r.get("tensors") or []
        t = "; ".join(f"{x.get('dtype')} {list(x.get('shape') or [])}" for x in tensors if x)
        status = r.get("status", "")
        rows.append(
            f'<tr data-id="{index}-{r["id"]}"><td class="mono">{esc(r["kind"])}</td>'
            f'<td>{esc(r["label"])}</td><td class="num">{r["start"]}</td>'
            f'<td class="num">{r["size"]}</td><td class="num">{esc(r.get("alignment", ""))}</td>'
            f"<td>{esc(t)}</td>"
            + (f"<td>{esc(status)}</td>" if any("status" in x for x in fm.regions) else "")
            + "</tr>"
        )
    head = (
        "<tr><th>kind</th><th>what</th><th class=num>offset</th><th class=num>size</th>"
        "<th class=num>align</th><th>dtype [shape]</th>"
        + ("<th>change</th>" if any("status" in x for x in fm.regions) else "")
        + "</tr>"
    )
    return (
        f'<details class="regions"><summary>{len(fm.regions)} regions of {esc(fm.title)}'
        f'</summary><table class="regions" id="table-{index}">{head}{"".join(rows)}</table>'
        "</details>"
    )


def _legend(maps: list[FileMap], backends: list[str]) -> str:
    used = {r["category"] for fm in maps for r in fm.regions}
    items = []
    for name in backends:
        items.append(
            (DELEGATE_COLOURS[backends.index(name) % len(DELEGATE_COLOURS)], f"delegate {name}")
        )
    names = {
        "header": "header",
        "metadata": "FlatBuffer",
        "named": "named data",
        "constant": "constant data",
        "mutable": "mutable data",
        "empty": "empty segment",
        "padding": "alignment padding",
        "waste": "waste (unreferenced, trailing)",
        "trailer": "provenance trailer",
    }
    for key, text in names.items():
        if key in used:
            items.append((COLOURS[key], text))
    html = "".join(
        f'<span class="item"><span class="swatch" style="background:{c}"></span>{esc(t)}</span>'
        for c, t in items
    )
    statuses = [
        s for s in STATUS_COLOURS if any(r.get("status") == s for fm in maps for r in fm.regions)
    ]
    shtml = "".join(
        f'<span class="item" title="{esc(STATUS_TEXT[s])}"><span class="swatch" '
        f'style="background:{STATUS_COLOURS[s]}"></span>{esc(s)}</span>'
        for s in statuses
    )
    out = f'<div class="legend" id="legend-user">{html}</div>'
    if statuses:
        out += f'<div class="legend" id="legend-status" hidden>{shtml}</div>'
    return out


def _summary(fm: FileMap) -> str:
    segs = [r for r in fm.regions if r["kind"] == "segment"]
    pad = sum(r["size"] for r in fm.regions if r["kind"] == "padding")
    waste = sum(r["size"] for r in fm.regions if r["category"] == "waste")
    parts = [
        f"{human(fm.file_size)} ({fm.file_size} bytes)",
        f"{len(segs)} segments",
        f"padding {human(pad)}",
        f"waste {human(waste)}",
    ]
    counts: dict[str, int] = {}
    for r in segs:
        if "status" in r:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    if counts:
        parts.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    trailer = [r for r in fm.regions if r["kind"] == "trailer"]
    parts.append("provenance trailer" if trailer else "no provenance trailer")
    return " · ".join(esc(p) for p in parts)


_CSS = """
.file { margin: 10px 0 14px; }
.file h2 { margin-bottom: 2px; }
svg.map { width: 100%; height: 46px; display: block; background: #fafbfc;
  border: 1px solid var(--line); border-radius: 4px; margin-top: 4px; }
svg.map rect.region { stroke: #ffffff; stroke-width: 0.6; vector-effect: non-scaling-stroke;
  cursor: pointer; }
svg.map rect.region.zero { stroke: #5b6670; stroke-width: 1.5; }
svg.map rect.region:hover { stroke: #000; stroke-width: 1.5; }
svg.map rect.region.selected { stroke: var(--sel); stroke-width: 3; }
.ruler { position: relative; height: 16px; font-size: 11px; color: var(--muted);
  font-variant-numeric: tabular-nums; }
.ruler .tick { position: absolute; top: 1px; white-space: nowrap; transform: translateX(-50%); }
.ruler .tick.start { transform: none; }
.ruler .tick.end { transform: translateX(-100%); }
#details { min-height: 92px; margin-top: 10px; }
#details dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
#details dt { color: var(--muted); }
#details dd { margin: 0; word-break: break-all; }
table.regions { margin-top: 6px; width: 100%; }
table.regions tr { cursor: pointer; }
details.regions { margin-top: 6px; }
.notes { color: #a04000; }
"""

_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("ptestore-data").textContent);
  var regions = {};
  data.files.forEach(function (f, i) {
    f.regions.forEach(function (r) { regions[i + "-" + r.id] = {file: f, region: r}; });
  });
  var rects = Array.prototype.slice.call(document.querySelectorAll("rect.region"));
  var mode = "scale", colour = "user", selected = null;
  function place() {
    rects.forEach(function (el) {
      var x = parseFloat(el.getAttribute(mode === "scale" ? "data-xs" : "data-xr"));
      var w = parseFloat(el.getAttribute(mode === "scale" ? "data-ws" : "data-wr"));
      var zero = el.classList.contains("zero");
      if (zero) { w = 1.5; }
      el.setAttribute("x", x.toFixed(3));
      el.setAttribute("width", w.toFixed(3));
      el.setAttribute("fill", el.getAttribute(colour === "user" ? "data-fill" : "data-sfill"));
    });
    document.querySelectorAll(".ruler .tick").forEach(function (t) {
      var x = parseFloat(t.getAttribute(mode === "scale" ? "data-xs" : "data-xr"));
      t.style.left = (x / 10).toFixed(3) + "%";
    });
  }
  function fmt(n) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + u[i];
  }
  function row(dl, k, v) {
    var dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k; dd.textContent = v; dl.appendChild(dt); dl.appendChild(dd);
  }
  function show(id) {
    var entry = regions[id]; if (!entry) { return; }
    var r = entry.region, box = document.getElementById("details");
    box.innerHTML = "";
    var h = document.createElement("strong"); h.className = "label"; h.textContent = r.label;
    box.appendChild(h);
    var dl = document.createElement("dl"); box.appendChild(dl);
    row(dl, "file", entry.file.url);
    row(dl, "kind", r.kind + (r.category !== r.kind ? " (" + r.category + ")" : ""));
    row(dl, "bytes", "[" + r.start + ", " + (r.start + r.size) + ")  " + fmt(r.size) +
        "  (" + (100 * r.size / Math.max(1, entry.file.file_size)).toFixed(2) + "% of the file)");
    if (r.segment !== undefined) {
      row(dl, "segment", "#" + r.segment + ", offset " + r.offset + " from the segment base");
      row(dl, "alignment", r.alignment + " (largest power of two dividing the offset)");
    }
    (r.keys || []).forEach(function (k, j) {
      var t = (r.tensors || [])[j] || {};
      row(dl, "key", k + (t.dtype ? "  " + t.dtype + " [" + (t.shape || []).join(", ") + "]" : ""));
    });
    if (r.users && r.users.length) {
      row(dl, r.kind === "trailer" ? "records" : "users", r.users.join("\n"));
    }
    if (r.status) { row(dl, "change", r.status + (r.was ? "  (source: [" + r.was.start + ", " +
        (r.was.start + r.was.size) + "), segment " + r.was.segment + ")" : "")); }
  }
  function select(id) {
    if (selected) {
      document.querySelectorAll('[data-id="' + selected + '"]').forEach(function (e) {
        e.classList.remove("selected"); });
    }
    selected = id;
    document.querySelectorAll('[data-id="' + id + '"]').forEach(function (e) {
      e.classList.add("selected"); });
    show(id);
  }
  rects.forEach(function (el) {
    el.addEventListener("mouseenter", function () { show(el.getAttribute("data-id")); });
    el.addEventListener("mouseleave", function () { if (selected) { show(selected); } });
    el.addEventListener("click", function () { select(el.getAttribute("data-id")); });
  });
  document.querySelectorAll("table.regions tr[data-id]").forEach(function (tr) {
    tr.addEventListener("click", function () { select(tr.getAttribute("data-id")); });
  });
  document.querySelectorAll("input[name=mode]").forEach(function (el) {
    el.addEventListener("change", function () { mode = el.value; place(); });
  });
  document.querySelectorAll("input[name=colour]").forEach(function (el) {
    el.addEventListener("change", function () {
      colour = el.value; place();
      var lu = document.getElementById("legend-user");
      var ls = document.getElementById("legend-status");
      if (ls) { ls.hidden = colour !== "status"; lu.hidden = colour === "status"; }
    });
  });
  var tiny = rects.filter(function (el) { return parseFloat(el.getAttribute("data-ws")) < 2; });
  if (tiny.length * 4 > rects.length) {
    var r = document.querySelector("input[name=mode][value=readable]");
    if (r) { r.checked = true; mode = "readable"; }
  }
  place();
  document.body.setAttribute("data-ready", "1");
})();
"""


def render_layout(maps: Sequence[FileMap], *, title: str = "ptestore layout map") -> str:
    """The page drawing ``maps`` (one bar per file; regions from
    :func:`layout_regions`, optionally marked by :func:`compare_regions`)."""
    maps = list(maps)
    backends: list[str] = []
    bars = []
    tables = []
    for i, fm in enumerate(maps):
        notes = "".join(f'<div class="notes">{esc(n)}</div>' for n in fm.notes)
        bars.append(
            f'<section class="file" data-file="{i}"><h2>{esc(fm.title)}</h2>'
            f'<div class="muted"><span class="mono">{esc(fm.url)}</span> · {_summary(fm)}</div>'
            f"{notes}{_svg(fm, i, backends)}</section>"
        )
        tables.append(_table(fm, i))
    compared = any("status" in r for fm in maps for r in fm.regions)
    controls = (
        '<div class="controls"><span>width: '
        '<label><input type="radio" name="mode" value="scale" checked> to scale</label> '
        '<label><input type="radio" name="mode" value="readable"> readable (tiny regions '
        "widened)</label></span>"
    )
    if compared:
        controls += (
            '<span>colour: <label><input type="radio" name="colour" value="user" checked> '
            'by user</label> <label><input type="radio" name="colour" value="status"> '
            "by change</label></span>"
        )
    controls += "</div>"
    body = (
        f"<h1>{esc(title)}</h1>"
        '<div class="muted">Hover or click a region for its details; the table under each '
        "file lists every region.</div>"
        f"{controls}{_legend(maps, backends)}"
        + "".join(bars)
        + '<div id="details" class="panel"><span class="muted">Nothing selected.</span></div>'
        + "".join(tables)
    )
    data = {
        "files": [
            {"title": fm.title, "url": fm.url, "file_size": fm.file_size, "regions": fm.regions}
            for fm in maps
        ]
    }
    return page(title, body, css=_CSS, script=_JS, data=data)
