"""The drawing of the layout map: one SVG bar per file (to scale, or readable: tiny
regions widened), its ruler, legend, summary and table, and the page's script and style
(package data under ``assets/``, read on first use)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .html import esc, human, page
from .regions import FileMap
from .resources import asset

__all__ = ["COLOURS", "DELEGATE_COLOURS", "STATUS_COLOURS", "STATUS_TEXT", "render_layout"]


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


def _colour(category: str, backends: dict[str, int]) -> str:
    """A region's fill; a delegate's by its backend id, numbered in order of first use
    (``backends``: id -> number, one look-up per region whatever the ids' count)."""
    if category.startswith("delegate:"):
        number = backends.setdefault(category.split(":", 1)[1], len(backends))
        return DELEGATE_COLOURS[number % len(DELEGATE_COLOURS)]
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


def _svg(fm: FileMap, index: int, backends: dict[str, int]) -> str:
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
    has_status = any("status" in x for x in fm.regions)  # once: not per row
    rows = []
    for r in fm.regions:
        tensors = r.get("tensors") or []
        t = "; ".join(f"{x.get('dtype')} {list(x.get('shape') or [])}" for x in tensors if x)
        status = r.get("status", "")
        rows.append(
            f'<tr data-id="{index}-{r["id"]}"><td class="mono">{esc(r["kind"])}</td>'
            f'<td>{esc(r["label"])}</td><td class="num">{r["start"]}</td>'
            f'<td class="num">{r["size"]}</td><td class="num">{esc(r.get("alignment", ""))}</td>'
            f"<td>{esc(t)}</td>" + (f"<td>{esc(status)}</td>" if has_status else "") + "</tr>"
        )
    head = (
        "<tr><th>kind</th><th>what</th><th class=num>offset</th><th class=num>size</th>"
        "<th class=num>align</th><th>dtype [shape]</th>"
        + ("<th>change</th>" if has_status else "")
        + "</tr>"
    )
    return (
        f'<details class="regions"><summary>{len(fm.regions)} regions of {esc(fm.title)}'
        f'</summary><table class="regions" id="table-{index}">{head}{"".join(rows)}</table>'
        "</details>"
    )


#: Delegate backend ids the legend names one by one (a file may hold thousands).
LEGEND_BACKENDS = 16


def _legend(maps: list[FileMap], backends: dict[str, int]) -> str:
    used = {r["category"] for fm in maps for r in fm.regions}
    items = []
    for name, number in list(backends.items())[:LEGEND_BACKENDS]:
        items.append((DELEGATE_COLOURS[number % len(DELEGATE_COLOURS)], f"delegate {name}"))
    if len(backends) > LEGEND_BACKENDS:
        more = len(backends) - LEGEND_BACKENDS
        items.append(("#999999", f"+{more} more delegate backend ids (hover a region)"))
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
    if not statuses:
        return f'<div class="legend" id="legend-user">{html}</div>'
    # A comparison opens coloured by change (render_layout checks "by change").
    return (
        f'<div class="legend" id="legend-user" hidden>{html}</div>'
        f'<div class="legend" id="legend-status">{shtml}</div>'
    )


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


def render_layout(maps: Sequence[FileMap], *, title: str = "ptestore layout map") -> str:
    """The page drawing ``maps`` (one bar per file; regions from
    :func:`layout_regions`, optionally marked by :func:`compare_regions`)."""
    maps = list(maps)
    backends: dict[str, int] = {}
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
            # A comparison opens coloured by change: that is what it is for.
            '<span>colour: <label><input type="radio" name="colour" value="user"> '
            'by user</label> <label><input type="radio" name="colour" value="status" checked> '
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
    return page(title, body, css=asset("layout.css"), script=asset("layout.js"), data=data)
