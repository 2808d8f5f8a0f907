"""What a specialization changed, segment by segment: each segment of an artifact
matched with its source's by their users (the same keys, delegates or constant data)
and marked replaced, grown, shrunk, moved, cloned (shared extents), unchanged or new
(:func:`compare_regions`, on :func:`~ptestore.format.regions.layout_regions`), and that
comparison summed up as data (:func:`layout_changes`, ``inspect X --compare SRC
--json``) or text (:func:`render_changes`). Pure: the bytes are read through a
DataLoader (:func:`segment_hashes`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._text import printable
from ..errors import FormatError

if TYPE_CHECKING:
    from ..storage.types import DataLoader

__all__ = [
    "CHANGED",
    "compare_regions",
    "layout_changes",
    "render_changes",
    "segment_hashes",
]

#: The statuses of a segment whose bytes differ from its source's.
CHANGED = ("replaced", "grown", "shrunk")


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


def segment_hashes(loader: DataLoader, desc: dict[str, Any]) -> dict[int, str]:
    """``segment index -> SHA-256`` of every segment of the file ``loader`` reads
    (``desc``: its :func:`ptestore.describe` object), read in pieces
    (:func:`ptestore._io.read_pieces`).

    Each distinct byte range is hashed once, however many segments describe it; distinct
    ranges adding up to more than twice the file (segments that overlap over and over)
    are refused with a FormatError before a byte is read."""
    ranges: dict[tuple[int, int], list[int]] = {}
    for seg in desc["segments"]:
        extent = (int(seg["absolute_offset"]), int(seg["size"]))
        ranges.setdefault(extent, []).append(int(seg["index"]))
    total, file_size = sum(size for _, size in ranges), int(desc["file_size"])
    if total > 2 * file_size:
        raise FormatError(
            str(desc["source"]),
            "segments (distinct byte ranges to hash)",
            total,
            f"<= {2 * file_size} bytes (twice the {file_size}-byte file)",
            "segments overlap so often that comparing them would read the file over and over",
        )
    from .._io import HASH_PIECE, read_pieces

    # a local file into one small reused buffer (:data:`~ptestore._io.HASH_PIECE`: the
    # kernel's copy and the hash stay in the cache), anything else 8 MiB per request
    out: dict[int, str] = {}
    for (pos, size), indices in ranges.items():
        h = hashlib.sha256()
        for piece in read_pieces(loader, pos, size, buffer_size=HASH_PIECE):
            h.update(piece)
        out.update(dict.fromkeys(indices, h.hexdigest()))
    return out


def _trailer(regions: list[dict[str, Any]]) -> int | None:
    return next((r["size"] for r in regions if r["kind"] == "trailer"), None)


def layout_changes(
    source: list[dict[str, Any]],
    artifact: list[dict[str, Any]],
    *,
    source_size: int,
    artifact_size: int,
) -> dict[str, Any]:
    """The comparison :func:`compare_regions` marked, as JSON-ready data (the
    ``inspect --compare --json`` object, docs/cli.md): every segment of the artifact
    (and each source segment with no counterpart, ``removed``), the segments and bytes
    per status, and the named-data keys by what happened to their bytes."""
    segments: list[dict[str, Any]] = []
    for r in artifact:
        if r["kind"] != "segment":
            continue
        was = r.get("was")
        segments.append(
            {
                "segment": r["segment"],
                "status": r["status"],
                "start": r["start"],
                "size": r["size"],
                "was": None if was is None else dict(was),
                "keys": list(r.get("keys", [])),
                "users": list(r.get("users", [])),
            }
        )
    for r in source:
        if r["kind"] == "segment" and r.get("status") == "removed":
            segments.append(
                {
                    "segment": None,
                    "status": "removed",
                    "start": None,
                    "size": 0,
                    "was": {"start": r["start"], "size": r["size"], "segment": r["segment"]},
                    "keys": list(r.get("keys", [])),
                    "users": list(r.get("users", [])),
                }
            )
    counts: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for s in segments:
        counts[s["status"]] = counts.get(s["status"], 0) + 1
        size = s["was"]["size"] if s["status"] == "removed" else s["size"]
        nbytes[s["status"]] = nbytes.get(s["status"], 0) + size
    keys: dict[str, list[str]] = {
        "changed": [],
        "moved": [],
        "added": [],
        "removed": [],
        "unchanged": [],
    }
    for s in segments:
        st = s["status"]
        group = (
            "changed"
            if st in CHANGED
            else "added"
            if st in ("new", "empty")
            else "removed"
            if st == "removed"
            else "moved"
            if st == "moved"
            else "unchanged"  # unchanged, cloned
        )
        keys[group].extend(s["keys"])
    return {
        "file_size": artifact_size,
        "source_size": source_size,
        "trailer_size": _trailer(artifact),
        "source_trailer_size": _trailer(source),
        "segments": segments,
        "counts": dict(sorted(counts.items())),
        "bytes": dict(sorted(nbytes.items())),
        "bytes_changed": sum(nbytes.get(s, 0) for s in CHANGED),
        "keys": {k: sorted(v) for k, v in keys.items()},
    }


def _span(start: int | None, size: int) -> str:
    return "-" if start is None else f"{size} @ {start}"


def render_changes(d: dict[str, Any], *, file: str = "", source: str = "") -> str:
    """:func:`layout_changes`' data as the text ``inspect X --compare SRC`` prints."""

    def trailer(n: int | None) -> str:
        return f" (provenance trailer {n})" if n is not None else ""

    lines = [
        f"{printable(file) or 'file'} compared with its source {printable(source)}".rstrip(),
        f"  size {d['file_size']} bytes{trailer(d['trailer_size'])}, source "
        f"{d['source_size']} bytes{trailer(d['source_trailer_size'])}",
        "  segments: "
        + (", ".join(f"{n} {s}" for s, n in d["counts"].items()) or "none")
        + f"; bytes changed {d['bytes_changed']}",
        "  bytes by status: " + (", ".join(f"{s} {n}" for s, n in d["bytes"].items()) or "-"),
    ]
    rows = [["segment", "status", "size @ offset", "source", "keys / users"]]
    for s in d["segments"]:
        was = s["was"]
        rows.append(
            [
                "-" if s["segment"] is None else str(s["segment"]),
                s["status"],
                _span(s["start"], s["size"]),
                "-" if was is None else f"{_span(was['start'], was['size'])} (#{was['segment']})",
                printable(", ".join(s["keys"] or s["users"])) or "-",  # the files' keys
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for group, names in d["keys"].items():
        if names and group != "unchanged":
            lines.append(f"  keys {group}: {printable(', '.join(names))}")
    return "\n".join(lines)
