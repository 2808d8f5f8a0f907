"""The chunk-verified download of one artifact, for :mod:`.fetch`.

An artifact whose provenance trailer records chunk digests (record version 2: a
SHA-256 per 4 MiB chunk of the content and a root, :mod:`ptestore.provenance.chunks`)
is checked **chunk by chunk as it arrives**, against that record. The record comes from
the trailer, read first with a ranged GET of the object's tail and pinned by the
index's ``trailer_sha256`` and ``size`` (:mod:`.fetch`); the content digest the index
names must be the one that record names.

- Chunks a local *base* holds (:mod:`.delta`) are cloned or copied into ``DEST.part``
  and checked there; the others come from the store in ranged GETs, consecutive chunks
  coalesced into one request (at most ``request_size`` bytes), each pinned to the
  object's version (:mod:`.ranged`), each chunk hashed as its bytes arrive. A chunk the
  store serves with another digest is asked for once more, then refused
  (:class:`~ptestore.errors.IntegrityError` naming the chunk and its range).
- ``DEST.part.json`` pins the download to the object's version and record, and counts
  the **verified chunks**: the leading chunks of ``DEST.part`` checked and made durable
  (``fsync``) before the count was written. A resume re-hashes those (a damaged one
  and everything after it is fetched again, and named in the result), and never keeps a
  byte past them: the rest of the ``.part`` is zeroed before anything else is written.
- Once every chunk is verified, the trailer's bytes (those the tail read returned and
  the index pins) end the file, which is synced; :mod:`.fetch` publishes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .._dataclass import dataclass
from .._io import pwrite_all
from .._log import get_logger
from ..errors import IntegrityError, PteStoreError
from ..provenance.chunks import ChunkDigests, hash_chunks
from ..storage.atomic import put_bytes, sync_file
from ..storage.loaders import LocalFileLoader
from ..storage.types import absolute_path
from .bases import CONTAINERS, Layouts, fill_from_bases
from .delta import Base
from .download import check_room, clones_from, download_error, open_part, read_state
from .fetch_checks import EntryMismatch, named
from .ranged import PinnedReader

__all__ = ["FetchEvent", "Sink", "download_chunks"]

log = get_logger(__name__)

#: Bytes read from a response body at a time (a divisor of every chunk size).
_PIECE = 1 << 20


@dataclass(frozen=True)
class FetchEvent:
    """Bytes of a download put in place: ``origin`` ``"store"`` (downloaded),
    ``"base"`` (cloned or copied from a local base) or ``"part"`` (verified again in a
    ``.part`` a previous attempt left); ``done``/``total`` count that file's bytes."""

    url: str
    path: str
    origin: str
    nbytes: int
    done: int
    total: int


class Sink:
    """Reports a file's progress to ``fetch``'s two callbacks."""

    def __init__(
        self,
        url: str,
        path: str,
        total: int,
        progress: Callable[[str, int, int], None] | None,
        events: Callable[[FetchEvent], None] | None,
    ) -> None:
        self.url, self.path, self.total = url, path, total
        self.done = 0
        self._progress, self._events = progress, events

    def add(self, origin: str, nbytes: int) -> None:
        self.done += nbytes
        if self._progress is not None:
            self._progress(self.url, self.done, self.total)
        if self._events is not None:
            self._events(FetchEvent(self.url, self.path, origin, nbytes, self.done, self.total))


def _save(meta_path: str, state: dict[str, Any], verified: int) -> None:
    put_bytes(meta_path, json.dumps({**state, "verified": verified}).encode())


def _resumable(meta_path: str, state: dict[str, Any]) -> int:
    """The verified-chunk count of a ``.part.json`` pinned to exactly ``state``, else 0."""
    saved = read_state(meta_path)
    if not isinstance(saved, dict):
        return 0
    count = saved.pop("verified", None)
    if saved != state or not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return 0
    return count  # past the last chunk: :func:`_recheck` keeps only the chunks there are


def _recheck(part: str, chunks: ChunkDigests, count: int) -> tuple[int, list[dict[str, Any]]]:
    """How many of the first ``count`` chunks of ``part`` still have their digests;
    the first one that does not is named."""
    count = min(count, len(chunks.digests))
    if count == 0:
        return 0, []
    loader = LocalFileLoader(part)
    try:
        have = loader.size()
        count = min(count, sum(1 for i in range(count) if chunks.span(i)[1] <= have))
        got = hash_chunks(loader, chunks.length, range(count))
    finally:
        loader.close()
    for i in range(count):
        if got[i] != chunks.digests[i]:
            a, b = chunks.span(i)
            log.warning(
                "%s: chunk %d (bytes %d:%d) verified before no longer has its digest "
                "(%s, the record names %s): it and everything after it are fetched again",
                part,
                i,
                a,
                b,
                got[i].hex(),
                chunks.digests[i].hex(),
            )
            return i, [{"chunk": i, "start": a, "end": b, "sha256": got[i].hex()}]
    return count, []


def _sha256(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


def _store_runs(todo: list[int], chunks: ChunkDigests, request_size: int) -> list[list[int]]:
    """Consecutive chunks in runs of at most ``request_size`` bytes (one GET each)."""
    runs: list[list[int]] = []
    for i in todo:
        run = runs[-1] if runs else None
        if (
            run is not None
            and run[-1] + 1 == i
            and chunks.span(i)[1] - chunks.span(run[0])[0] <= request_size
        ):
            run.append(i)
        else:
            runs.append([i])
    return runs


def _fetch_run(
    reader: PinnedReader, fd: int, chunks: ChunkDigests, run: list[int], sink: Sink
) -> list[tuple[int, bytes]]:
    """Stream ``run`` from the store into ``fd``, hashing each chunk as it arrives;
    returns the chunks whose bytes do not have the record's digest (and theirs)."""
    import hashlib

    start, end = chunks.span(run[0])[0], chunks.span(run[-1])[1]
    bad: list[tuple[int, bytes]] = []
    i = run[0]
    h = hashlib.sha256()
    offset = start
    for piece in reader.stream(start, end, min(_PIECE, chunks.chunk_size)):
        pwrite_all(fd, memoryview(piece), offset)
        h.update(piece)
        offset += len(piece)
        if offset == chunks.span(i)[1]:
            if h.digest() != chunks.digests[i]:
                bad.append((i, h.digest()))
            else:
                sink.add("store", chunks.span(i)[1] - chunks.span(i)[0])
            i += 1
            h = hashlib.sha256()
    return bad


def download_chunks(
    *,
    url: str,
    dest: str,
    size: int,
    state: dict[str, Any],
    chunks: ChunkDigests,
    trailer_bytes: bytes,
    tail: tuple[int, bytes],
    reader: PinnedReader,
    bases: list[Base],
    request_size: int,
    sink: Sink,
    record_name: str = "the record in its trailer (the one the index names)",
    layouts: Layouts = CONTAINERS,
) -> dict[str, Any]:
    """Download ``url`` (``size`` bytes: ``chunks.length`` of content, then
    ``trailer_bytes``) into ``dest + ".part"``, every chunk verified; returns what the
    file's entry in the fetch result says (see the module); ``record_name`` says in
    errors where ``chunks`` came from; ``layouts`` how the target's and the bases' parts are
    found (:mod:`.bases`). Raises
    :class:`~.ranged.ObjectChanged` when the object's version changed (start again)."""
    part, meta_path = dest + ".part", dest + ".part.json"
    directory = os.path.dirname(absolute_path(dest))
    count = _resumable(meta_path, state) if os.path.lexists(part) else 0

    def save(verified: int) -> None:
        """The count written; a full disk there is named as at the ``.part``."""
        try:
            _save(meta_path, state, verified)
        except OSError as exc:  # put_bytes's StorageError too
            raise download_error(exc, dest, url, meta_path) from exc

    fd = open_part(part, count > 0)
    verified, refused = 0, False
    try:
        verified, damaged = _recheck(part, chunks, count)
        save(verified)
        # Nothing past the verified chunks is kept; the file has its final size (sparse)
        # so that chunks land at their offsets in any order.
        os.ftruncate(fd, chunks.span(verified - 1)[1] if verified else 0)
        os.ftruncate(fd, size)
        resumed = chunks.span(verified - 1)[1] if verified else 0
        if resumed:
            sink.add("part", resumed)
        n = len(chunks.digests)
        todo = list(range(verified, n))
        done = set(range(verified))
        retried: list[int] = []

        def from_store(run: list[int]) -> None:
            """Download ``run``, each chunk checked; a chunk that arrives with another
            digest is asked for once more, alone, then refused."""
            nonlocal refused
            bad = _fetch_run(reader, fd, chunks, run, sink)
            for i, first in bad:
                retried.append(i)
                again = _fetch_run(reader, fd, chunks, [i], sink)
                if again:
                    a, b = chunks.span(i)
                    refused = True
                    raise IntegrityError(
                        f"{url}: downloaded bytes {a}:{b} (chunk {i}) have sha256:"
                        f"{again[0][1].hex()}, {record_name} says "
                        f"sha256:{chunks.digests[i].hex()}; read twice: the "
                        "object was damaged or changed after it was made",
                        published=False,
                    )
                log.warning(
                    "%s: bytes %d:%d (chunk %d) arrived with sha256:%s, not the digest its "
                    "record names; read again, they were right the second time",
                    url,
                    *chunks.span(i),
                    i,
                    first.hex(),
                )
            done.update(run)

        def on_chunk(i: int, nbytes: int) -> None:
            sink.add("base", nbytes)

        filled = fill_from_bases(
            fd, directory, chunks, todo, bases, done, from_store, on_chunk, url, layouts
        )
        for i, a, b, path in filled.lied:
            log.warning(
                "%s: bytes %d:%d (chunk %d) do not have the digest its own record names: "
                "damaged or changed since it was made; taken from %s instead",
                path,
                a,
                b,
                i,
                "another base" if i in filled.done else "the store",
            )
        done |= filled.done

        def advance(upto: int) -> int:
            while upto < n and upto in done:
                upto += 1
            return upto

        new = advance(verified)
        if new > verified:
            sync_file(fd)
            verified = new
            save(verified)
        for i in todo:  # wholly inside the tail already read: no request
            a, b = chunks.span(i)
            data = tail[1][a - tail[0] : b - tail[0]] if a >= tail[0] else b""
            if i not in done and len(data) == b - a and _sha256(data) == chunks.digests[i]:
                pwrite_all(fd, memoryview(data), a)
                done.add(i)
                sink.add("store", b - a)
        left = [i for i in todo if i not in done]
        if left and clones_from(directory, [b.path for b in bases]):
            # Before the first request the bases' clones were counted as free at best:
            # what the store still has to send must fit now (only clones are free).
            spans = [chunks.span(i) for i in left]
            needed = sum(b - a for a, b in spans) + len(trailer_bytes)
            check_room(dest, needed, filled.cloned)
        for run in _store_runs(left, chunks, request_size):
            from_store(run)
            new = advance(verified)
            if new > verified:
                sync_file(fd)
                verified = new
                save(verified)
        pwrite_all(fd, memoryview(trailer_bytes), chunks.length)
        sink.add("store", len(trailer_bytes))
        sync_file(fd)
        if os.fstat(fd).st_size != size:
            refused = True
            raise IntegrityError(
                f"{url}: the download is {os.fstat(fd).st_size} bytes, the object {size}",
                published=False,
            )
    except PteStoreError:
        raise
    except OSError as exc:  # a full disk, an I/O error: what is verified is kept
        raise download_error(exc, dest, url, part) from exc
    finally:
        os.close(fd)
        if refused and verified == 0:  # nothing worth keeping for the next attempt
            for name in (part, meta_path):
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass
    from_base = filled.nbytes
    return {
        "url": url,
        "path": dest,
        "size": size,
        "resumed_from": resumed,
        "verified": "chunks",
        "chunks": n,
        "chunk_size": chunks.chunk_size,
        "received": reader.received,
        "requests": reader.requests,
        "from_base": from_base,
        "cloned": filled.cloned,
        "bases": filled.bases,
        "base_damaged": [
            {"chunk": i, "start": a, "end": b, "base": p} for i, a, b, p in filled.lied
        ],
        "part_damaged": damaged,
        "store_retried": retried,
    }


class _Tail:
    """The object as a loader whose reads go through the pinned reader."""

    def __init__(self, reader: PinnedReader, size: int) -> None:
        self.name = reader.name
        self._reader, self._size = reader, size
        #: ``(offset, bytes)`` of each read (the tail holds the last chunk of a small file).
        self.reads: list[tuple[int, bytes]] = []

    def size(self) -> int:
        return self._size

    def load(self, offset: int, size: int) -> bytes:
        data = self._reader.read(offset, size)
        self.reads.append((offset, data))
        return data

    def check_unchanged(self) -> None:
        """Every read is pinned (or checked by :mod:`.fetch` at the end)."""

    def close(self) -> None:
        """The loader behind the reader is :mod:`.fetch`'s to close."""


@dataclass(frozen=True)
class Record:
    """What the pinned trailer of a download gives: its bytes, the chunk digests of the
    content and the content's SHA-256 as the record names it."""

    trailer: bytes
    chunks: ChunkDigests
    sha256: str
    #: The bytes the tail read returned and where they start: chunks wholly inside are
    #: not asked of the store again.
    tail_offset: int = 0
    tail: bytes = b""


def pinned_record(want: dict[str, Any], size: int, reader: PinnedReader) -> Record | None:
    """The chunk record of the object ``want`` (an index file entry) names, read from its
    trailer (a ranged GET of its tail, pinned to its version) and checked against the
    entry's ``size``, ``trailer_sha256`` and ``sha256`` before any content byte is
    downloaded; None when the entry pins no trailer or the record has no chunk digests
    (a version-1 record: the file is checked whole). A trailer the entry does not name,
    or whose record is invalid or claims other bytes than precede it (its
    ``content.size``), is an :class:`~ptestore.errors.IntegrityError`."""
    from ..errors import FormatError
    from ..provenance.record import Provenance
    from ..provenance.trailer import read_trailer

    pinned = want.get("trailer_sha256")
    if pinned is None:
        return None
    url = str(want["url"])
    if "size" in want and size != want["size"]:
        raise EntryMismatch(
            f"{url}: the object is {size} bytes, {named(want, want['size'])}", published=False
        )
    tail = _Tail(reader, size)
    try:
        trailer = read_trailer(tail)
        have = None if trailer is None else "sha256:" + trailer.sha256
        if trailer is None or have != pinned:
            raise EntryMismatch(
                f"{url}: provenance trailer checksum {have}, {named(want, pinned)}",
                published=False,
            )
        content = Provenance.of_trailer(trailer, url).content
    except FormatError as exc:
        said = str(exc)  # a FormatError names its source (the URL) already
        message = said if said.startswith(f"{url}:") else f"{url}: {said}"
        raise IntegrityError(message, published=False) from exc
    if content is None or content.chunks is None:
        return None
    if want.get("sha256") not in (content.sha256, content.chunks.digest):
        raise IntegrityError(  # the entry names other bytes than its pinned trailer does
            f"{url}: the record in its trailer (the one the index pins) names its bytes "
            f"{content.sha256}, the index names {want.get('sha256')}",
            published=False,
        )
    first = tail.reads[0] if tail.reads else (size, b"")
    return Record(trailer.raw(), content.chunks, content.sha256, first[0], first[1])
