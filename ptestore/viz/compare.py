"""The comparison of the layout map: each segment of an artifact matched with its
source's by their users, and marked replaced, grown, shrunk, moved, cloned (shared
extents, FIEMAP), unchanged or new."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["compare_regions", "segment_hashes", "shared_ranges"]


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


def segment_hashes(
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
