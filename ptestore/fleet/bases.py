"""What a delta download takes from its bases (:mod:`.delta`), in the order that
costs least: the chunks a base's own record names at the same offsets (nothing read),
then the download's layout from its first chunks, then each other chunk from where a
base keeps its segments (:mod:`.shift`: the same offsets when nothing moved)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._io import pread_all
from ..errors import FormatError
from .delta import Base, Filled, fill, match_chunks
from .shift import segment_moves

if TYPE_CHECKING:
    from ..format.model import Container
    from ..provenance.chunks import ChunkDigests

__all__ = ["fill_from_bases", "target_layout"]


def target_layout(
    fd: int, chunks: ChunkDigests, done: set[int], from_store: Callable[[list[int]], None], url: str
) -> Container | None:
    """The download's layout, parsed from its first chunks in the ``.part`` (those not
    there yet downloaded first: they hold the metadata a moved layout rewrote, so no
    base has them); None when it is not a container ptestore reads."""
    from ..format.header import HEAD_BYTES, FileHead
    from ..format.parse import parse_metadata

    try:
        if 0 not in done:
            from_store([0])
        head = pread_all(fd, min(HEAD_BYTES, chunks.length), 0)
        file_head = FileHead.from_bytes(head, chunks.length, url)
        size = file_head.metadata_size
        if size > chunks.length:
            return None
        for i in range(1, (size - 1) // chunks.chunk_size + 1):
            if i not in done:
                from_store([i])
        return parse_metadata(pread_all(fd, size, 0), file_head)
    except FormatError:
        return None


def fill_from_bases(
    fd: int,
    directory: str,
    chunks: ChunkDigests,
    todo: list[int],
    bases: list[Base],
    done: set[int],
    from_store: Callable[[list[int]], None],
    on_chunk: Callable[[int, int], None],
    url: str,
) -> Filled:
    """Put into the ``.part`` the chunks of ``todo`` the bases hold (:mod:`.delta`): at
    their own offsets; where the bases are containers, also where a base keeps segments
    the download has at other offsets (:func:`.shift.segment_moves`). For that the
    download's layout is read from its first chunks, taken from a base where one has
    them (at the same offsets: the layout did not move) or else from the store; the
    chunks a base's own record names are put in first (nothing to read), the rest once
    the layout is known (no base chunk is hashed at an offset that cannot match).
    ``done`` gains the chunks of the first pass (and those ``from_store`` downloads);
    the caller adds the returned ``Filled.done``."""
    if not bases or not todo:
        return Filled()
    same = match_chunks(chunks, todo, bases)
    if all(b.layout() is None for b in bases):
        return fill(fd, directory, chunks, same, on_chunk)
    first = [m for m in same if m.known or m.index == 0]
    filled = fill(fd, directory, chunks, first, on_chunk)
    done |= filled.done
    target = target_layout(fd, chunks, done, from_store, url)
    tried = {m.index for m in first}
    rest = [i for i in todo if i not in done and i not in tried]
    if target is None:
        left = set(rest)
        again = [m for m in same if m.index in left]
    else:
        moves = [
            None if (layout := b.layout()) is None else segment_moves(target, layout) for b in bases
        ]
        again = match_chunks(chunks, rest, bases, moves)
    filled.add(fill(fd, directory, chunks, again, on_chunk))
    return filled
