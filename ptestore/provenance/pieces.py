"""Bytes described a chunk per core: a chunk (:mod:`.chunks`) made of pieces from
loaders, memory and zeros (:data:`Piece`), its SHA-256 and CRCs computed in one of
several plain threads (hashlib and zlib release the GIL), each reading the pieces
that come from a loader into a small buffer of its own.

:class:`~.digest.ContentHasher` describes the chunks a feed fills whole this way;
:func:`chunk_digests` gives the SHA-256 of some chunks of pieces (what an in-place
run's journal must leave in the file).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence

from .._background import Cancelled, started
from .._background import check as check_cancelled
from .._io import HASH_PIECE, REQUEST_PIECE
from ..storage.types import DataLoader, load_into

__all__ = [
    "Piece",
    "Span",
    "chunk_digests",
    "cut",
    "describe_chunks",
    "hashing_threads",
    "is_loader",
    "is_memory",
    "parallel_for",
    "parallel_workers",
]

_CHUNK = 8 << 20
_ZEROS = bytes(1 << 20)


def hashing_threads() -> int:
    """How many chunks a local file has hashed at once: one per core, at most 8."""
    import os

    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))


def parallel_workers(loader: DataLoader) -> int:
    """How many chunks of ``loader`` to hash at once: one per core (at most 8) for a
    loader of a local file that reads from any thread into memory it is given
    (``parallel_reads``: a local file, a run's spool or journal, by ``preadv``; hashlib
    and zlib release the GIL), else 1."""
    if not getattr(loader, "parallel_reads", False):
        return 1
    return hashing_threads()


def parallel_for(pieces: Sequence[Piece]) -> int:
    """How many chunks of ``pieces`` to hash at once: 1 if a loader among them reads
    from one thread only (:func:`parallel_workers`), else one per core."""
    loaders = {id(s): s for s, _, _ in pieces if is_loader(s)}
    return min(
        (parallel_workers(x) for x in loaders.values()),  # type: ignore[arg-type]
        default=hashing_threads(),
    )


#: A piece of bytes to feed (:meth:`ContentHasher.feed_pieces`): ``(source, offset,
#: size)``, the source a :class:`DataLoader` (its bytes at ``offset``), a bytes-like
#: object in memory (its bytes at ``offset``) or None (``size`` zeros).
Piece = tuple[object, int, int]
#: A chunk to describe: ``(index, its pieces in order, whether its SHA-256 is wanted)``.
Span = tuple[int, Sequence[Piece], bool]


def is_memory(source: object) -> bool:
    return isinstance(source, (bytes, bytearray, memoryview))


def is_loader(source: object) -> bool:
    return source is not None and not is_memory(source)


def describe_chunks(
    spans: Sequence[Span],
    algorithms: Sequence[str],
    workers: int,
    cancelled: threading.Event | None,
) -> dict[int, tuple[bytes | None, dict[str, int]]]:
    """``{index: (SHA-256, {algorithm: CRC})}`` of each chunk ``(index, pieces, whether
    its SHA-256 is wanted)`` (None where it is not), ``workers`` chunks at once: this
    thread and ``workers - 1`` others, each taking the next chunk and reading the
    pieces of it that come from a loader into a buffer of its own (:data:`HASH_PIECE`,
    or :data:`REQUEST_PIECE` where a loader reads from one thread only, a remote one: a
    request per 8 MiB, not per 128 KiB; plain threads:
    ``concurrent.futures`` imports ``logging``, 9 ms of a run that hashes 20 MiB). The
    first error is raised here once every thread has stopped; so is a cancellation.
    Where a thread cannot start (out of memory or of threads), the chunks are shared by
    those that did and this one."""
    from ..checksums import crc

    results: dict[int, tuple[bytes | None, dict[str, int]]] = {}
    errors: list[BaseException] = []
    todo = iter(spans)
    lock = threading.Lock()
    stop = threading.Event()  # set on the first error: the others stop between pieces
    loaded = [(src, n) for _, ps, _ in spans for src, _, n in ps if is_loader(src)]
    largest = max((n for _, n in loaded), default=0)
    # Each thread's buffer: a local file's pieces stay in the core's cache (HASH_PIECE);
    # a remote loader's (one worker) is a request each, so they are several MiB.
    remote = any(not getattr(src, "parallel_reads", False) for src, _ in loaded)
    size = min(REQUEST_PIECE if remote else HASH_PIECE, largest)

    def one(buffer: memoryview | None, span: Span) -> None:
        index, pieces, sha = span
        h = hashlib.sha256() if sha else None
        row = dict.fromkeys(algorithms, 0)

        def feed(piece: memoryview | bytes) -> None:
            if h is not None:
                h.update(piece)
            for a in algorithms:
                row[a] = crc(a, piece, row[a])

        for src, offset, n in pieces:
            end = offset + n
            while offset < end:
                check_cancelled(cancelled)
                check_cancelled(stop)
                if src is None:
                    k = min(len(_ZEROS), end - offset)
                    feed(_ZEROS if k == len(_ZEROS) else _ZEROS[:k])
                elif is_memory(src):
                    k = min(_CHUNK, end - offset)
                    feed(memoryview(src).cast("B")[offset : offset + k])  # type: ignore[arg-type]
                else:
                    assert buffer is not None
                    k = min(buffer.nbytes, end - offset)
                    load_into(src, offset, buffer[:k])  # type: ignore[arg-type]
                    feed(buffer[:k])
                offset += k
        results[index] = (None if h is None else h.digest(), row)

    def work() -> None:
        buffer = memoryview(bytearray(size)) if size else None
        try:
            while not stop.is_set():
                with lock:
                    span = next(todo, None)
                if span is None:
                    return
                one(buffer, span)
        except BaseException as exc:  # handed to the calling thread, which raises it
            with lock:
                errors.append(exc)
            stop.set()

    threads: list[threading.Thread] = []
    for _ in range(min(workers, len(spans)) - 1):
        t = threading.Thread(target=work, name="ptestore-chunks", daemon=True)
        if not started(t):  # out of memory or threads: those that started, and this one
            break
        threads.append(t)
    work()
    for t in threads:
        t.join()
    if errors:  # the first one; a Cancelled raised by ``stop`` only follows another
        raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
    return results


def cut(pieces: Sequence[Piece], bounds: Sequence[int]) -> list[list[Piece]]:
    """``pieces`` (their sizes adding up to ``bounds[-1]``) cut at each of the
    increasing positions ``bounds`` (the first 0): the pieces of each stretch."""
    out: list[list[Piece]] = []
    k, used = 0, 0  # the piece at the cursor, and how much of it is taken
    for a, b in itertools.pairwise(bounds):
        stretch: list[Piece] = []
        need = b - a
        while need:
            src, offset, n = pieces[k]
            take = min(need, n - used)
            stretch.append((src, offset + used, take))
            used += take
            need -= take
            if used == n:
                k, used = k + 1, 0
        out.append(stretch)
    return out


def chunk_digests(
    pieces: Sequence[Piece],
    length: int,
    chunk_size: int,
    indices: Sequence[int],
    cancelled: threading.Event | None = None,
) -> dict[int, bytes]:
    """The SHA-256 of chunks ``indices`` (of ``chunk_size`` bytes: :mod:`.chunks`) of
    the ``length`` bytes that ``pieces`` make (their sizes add up to ``length``), a
    chunk per core at once where every loader among them reads from any thread.
    ``cancelled``: stop (:class:`~ptestore._background.Cancelled`) between pieces once
    it is set."""
    if not indices:
        return {}
    cs = chunk_size
    bounds = [min(i * cs, length) for i in range(-(-length // cs) + 1)]
    stretches = cut([p for p in pieces if p[2] > 0], bounds)
    spans = [(i, stretches[i], True) for i in indices]
    got = describe_chunks(spans, (), parallel_for(pieces), cancelled)
    return {i: d for i, (d, _) in got.items() if d is not None}
