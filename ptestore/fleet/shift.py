"""Where a base holds a download's bytes when its segments moved.

A specialized artifact keeps its source's segments in order, but a replacement of
another size (packed weights, a compiled blob) moves every segment after it: the
source's bytes are then at other offsets than the artifact's, and a chunk of the
artifact is nowhere in the source at its own offsets. Both files say where their
segments are (their FlatBuffers, :mod:`ptestore.format`), so a delta fetch can look
for each segment of the download at the offset the base keeps it:

- :func:`segment_moves` pairs each segment of the download (the *target*) with the
  base's segment of the same named-data key, or else of the same index, when both have
  the same size: a guess (a replaced segment of the same size pairs too), never
  trusted, because every chunk built from it is checked against the target's digest;
- :func:`chunk_pieces` gives, for one chunk of the target, the ranges of the base its
  bytes would come from: one range when its segments moved alike (a clone or one
  in-kernel copy), several when it spans segments that moved differently, with the
  padding between them as zeros; the same offsets when nothing in it moved; None when
  it holds bytes the base cannot give (the metadata of a layout that moved, a segment
  the base does not have beside one that moved).

:mod:`.bases` uses both in a delta fetch.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from .._dataclass import dataclass

if TYPE_CHECKING:
    from ..format.model import Container

__all__ = ["Moves", "Piece", "chunk_pieces", "segment_moves"]

#: ``(start, end, base_offset)``: the target's bytes ``[start, end)`` are the base's at
#: ``base_offset`` (None: zeros, the padding between segments).
Piece = tuple[int, int, "int | None"]


@dataclass(frozen=True)
class Moves:
    """The target's segments (absolute ``(start, end)``, in file order) and where the
    base holds each (its absolute start, None when it has no such segment)."""

    #: Where the target's segments start: the bytes before are its metadata.
    data_start: int
    rows: tuple[tuple[int, int, int | None], ...]

    @property
    def moved(self) -> bool:
        """Some segment the base holds is at another offset there."""
        return any(b is not None and b != s for s, _, b in self.rows)


def _physical(container: Container) -> dict[int, int]:
    """Entry of the segments vector -> physical segment index."""
    return {e: seg.index for seg in container.segments for e in seg.entries}


def _keys(container: Container) -> dict[int, list[str]]:
    """Physical segment index -> the named-data keys stored in it."""
    physical = _physical(container)
    out: dict[int, list[str]] = {}
    for entry in container.named_data:
        index = physical.get(entry.segment_index)
        if index is not None:
            out.setdefault(index, []).append(entry.key)
    return out


def segment_moves(target: Container, base: Container) -> Moves:
    """Pair the target's segments with the base's (see the module)."""
    base_by_index = {seg.index: seg for seg in base.segments}
    base_keys = _keys(base)
    base_by_key = {k: base_by_index[i] for i, keys in base_keys.items() for k in keys}
    target_keys = _keys(target)
    rows: list[tuple[int, int, int | None]] = []
    for seg in sorted(target.segments, key=lambda s: s.offset):
        if seg.size == 0:
            continue
        start = target.segment_base_offset + seg.offset
        found = None
        if target.kind == base.kind:
            keys = target_keys.get(seg.index, ())
            candidates = [base_by_key[k] for k in keys if k in base_by_key]
            same_index = base_by_index.get(seg.index)
            if same_index is not None:
                candidates.append(same_index)
            for other in candidates:
                if other.size == seg.size:
                    found = base.segment_base_offset + other.offset
                    break
        rows.append((start, start + seg.size, found))
    return Moves(target.segment_base_offset, tuple(rows))


def chunk_pieces(moves: Moves, start: int, end: int) -> tuple[Piece, ...] | None:
    """Where the base holds the target's bytes ``[start, end)`` (see the module): the
    pieces cover the span in order; ``((start, end, start),)`` when nothing in it moved
    (the base's bytes at the same offsets, its metadata included)."""
    rows = moves.rows
    first = max(0, bisect_right(rows, (start, 1 << 62, 0)) - 1)
    inside = [r for r in rows[first:] if r[0] < end and r[1] > start]
    if all(b == s or b is None for s, _, b in inside):
        # Nothing the base holds moved: the same offsets (a segment it has no match for
        # may still start as it did: a value grown at its end)
        return ((start, end, start),)
    if start < moves.data_start or any(b is None for _, _, b in inside):
        return None
    pieces: list[Piece] = []
    pos = start
    for s, e, b in inside:
        assert b is not None
        shift = b - s
        lo, hi = max(s, start), min(e, end)
        last = pieces[-1] if pieces else None
        if last is not None and last[2] is not None and last[2] - last[0] == shift:
            # Moved alike: one range of the base, the padding between them included
            pieces[-1] = (last[0], hi, last[2])
        else:
            if pos < lo:
                pieces.append((pos, lo, None))
            pieces.append((lo, hi, lo + shift))
        pos = hi
    if pos < end:
        pieces.append((pos, end, None))
    return tuple(pieces)
