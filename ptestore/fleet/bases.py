"""What a delta download takes from its bases (:mod:`.delta`), in the order that
costs least: the chunks a base's own record names at the same offsets (nothing read),
then the download's layout from the chunks that hold it, then each other chunk from
where a base keeps its parts (:mod:`.shift`: the same offsets when nothing moved).

What a layout is depends on the file: a :class:`Layouts` says how to read the target's
and a base's and how to pair their parts. :data:`CONTAINERS` (the default) reads .pte
and .ptd files (their segments, from the metadata in the first chunks);
:mod:`.packed_chunks` has one for XNNPACK packed-weight files (their regions, from the
index at their end)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._io import pread_all
from ..errors import FormatError
from .delta import Base, Filled, Match, fill, fill_each, match_chunks
from .shift import Moves, segment_moves

if TYPE_CHECKING:
    from ..format.model import Container
    from ..provenance.chunks import ChunkDigests

__all__ = ["CONTAINERS", "Layouts", "fill_from_bases", "target_layout"]

FromStore = Callable[[list[int]], None]


class Layouts(Protocol):
    """Where the parts of a download (the *target*) and of its bases are."""

    def of_base(self, base: Base) -> Any | None:
        """The base's layout; None when it has none this reads (used at the same
        offsets only)."""

    def first(self, chunks: ChunkDigests) -> set[int]:
        """The target's chunks that hold its layout (tried at the bases' same offsets
        before the layout is read)."""

    def target(
        self, fd: int, chunks: ChunkDigests, done: set[int], from_store: FromStore, url: str
    ) -> Any | None:
        """The target's layout, read from the ``.part`` (``fd``) once the chunks that
        hold it are there (those not in ``done`` downloaded first); None when it does
        not parse."""

    def moves(self, target: Any, base: Any) -> Moves | None:
        """Where the base (its layout ``base``) holds each part of the target; None when
        it holds none of them (another model's file: not tried at all)."""


class _Containers:
    """.pte and .ptd files: segments found by the metadata (:func:`.shift.segment_moves`)."""

    def of_base(self, base: Base) -> Container | None:
        return base.layout()

    def first(self, chunks: ChunkDigests) -> set[int]:
        return {0}

    def target(
        self, fd: int, chunks: ChunkDigests, done: set[int], from_store: FromStore, url: str
    ) -> Container | None:
        return target_layout(fd, chunks, done, from_store, url)

    def moves(self, target: Container, base: Container) -> Moves:
        return segment_moves(target, base)


CONTAINERS: Layouts = _Containers()


def target_layout(
    fd: int, chunks: ChunkDigests, done: set[int], from_store: FromStore, url: str
) -> Container | None:
    """The download's layout, parsed from its first chunks in the ``.part`` (those not
    there yet asked of ``from_store`` first: :func:`fill_from_bases` tries the bases at
    the same offsets before the store); None when it is not a container ptestore
    reads."""
    from ..format.header import HEAD_BYTES, FileHead
    from ..format.parsing import parse_metadata

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
    from_store: FromStore,
    on_chunk: Callable[[int, int], None],
    url: str,
    layouts: Layouts = CONTAINERS,
) -> Filled:
    """Put into the ``.part`` the chunks of ``todo`` the bases hold (:mod:`.delta`): at
    their own offsets; where ``layouts`` reads the bases, also where a base keeps parts
    the download has at other offsets (:meth:`Layouts.moves`). For that the download's
    layout is read from the chunks that hold it (:meth:`Layouts.first`), taken from a
    base where one has them (each base tried in turn, at the same offsets: the layout
    did not move) or else from the store; a base the layout shows holds none of the
    download's parts is not tried for the others. The chunks a base's own record names
    are put in first (nothing to read), the rest once the layout is known (no base chunk
    is hashed at an offset that cannot match); a chunk whose bytes in one base do not
    check is tried from the next base that could hold it (:func:`.delta.fill_each`)
    before it is left to the store.
    ``done`` gains the chunks of the first pass (and those ``from_store`` downloads);
    the caller adds the returned ``Filled.done``."""
    if not bases or not todo:
        return Filled()
    tried: dict[int, set[int]] = {}  # by chunk, the bases whose bytes for it did not check
    same = match_chunks(chunks, todo, bases)
    if all(layouts.of_base(b) is None for b in bases):
        return fill_each(fd, directory, chunks, todo, bases, on_chunk, tried=tried)
    head = layouts.first(chunks)
    first = [m for m in same if m.known]
    filled = fill(fd, directory, chunks, first, on_chunk)
    for m in first:
        tried[m.index] = {id(m.base)}
    done |= filled.done

    def layout_chunks(run: list[int]) -> None:
        """The chunks that hold the layout: each base in turn at the same offsets (the
        layout did not move), then the store for those no base has."""
        for i in run:
            start, end = chunks.span(i)
            for base in bases:
                if i not in done and end <= base.size:
                    got = fill(fd, directory, chunks, [Match(i, base, start, False)], on_chunk)
                    filled.add(got)
                    done.update(got.done)
        if left := [i for i in run if i not in done]:
            from_store(left)

    layout_chunks(sorted(head - done))
    target = layouts.target(fd, chunks, done, layout_chunks, url)
    # A chunk a base's record named and its bytes did not have is tried from the others.
    rest = [i for i in todo if i not in done and i not in head]
    if target is None:
        filled.add(fill_each(fd, directory, chunks, rest, bases, on_chunk, tried=tried))
        return filled
    moves: list[Moves | None] = []
    used: list[Base] = []
    for b in bases:
        layout = layouts.of_base(b)
        mv = None if layout is None else layouts.moves(target, layout)
        if layout is None or mv is not None:  # else it holds none of the target's parts
            moves.append(mv)
            used.append(b)
    filled.add(fill_each(fd, directory, chunks, rest, used, on_chunk, moves, tried))
    return filled
