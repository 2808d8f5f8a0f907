"""Digests of a file's bytes before its trailer: chunk digests (their root names the
bytes) and CRCs in one pass.

:class:`ContentHasher` takes the bytes in order; :func:`content_digest` reads the first
``size`` bytes of a loader (what ``verify`` does). The CRCs (CRC-32, and CRC-32C and
CRC64NVME where ``awscrt`` is installed, whole and per chunk: :mod:`.crcs`) let a store
that keeps a checksum of the object (S3) be checked against the record without reading
the object: the object's CRC is the content's CRC combined with the trailer's.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from .._background import Pending, Worker
from .._crc32 import crc32
from .._io import read_pieces
from ..storage.types import DataLoader
from . import pieces
from .pieces import Piece, is_memory
from .record import ContentDigest

if TYPE_CHECKING:
    from ..checksums import GridCRCs
    from .chunks import ChunkHasher
    from .crcs import ContentCRCs

__all__ = ["ContentHasher", "content_digest", "object_crc32", "read_pieces"]

_ZEROS = bytes(1 << 20)


#: A piece at least this large has its chunk digests computed in a second thread
#: while this one computes the SHA-256 and CRC-32 (hashlib and zlib release the GIL).
_PARALLEL_MIN = 256 << 10


class ContentHasher:
    """The digest of bytes fed in order. Given the ``length`` they will add up to:
    their chunk digests (:mod:`.chunks`; in a second thread for large pieces), whose
    root is the content's digest (``sha256-tree:``), and the CRCs ``crcs`` of every
    chunk (:mod:`.crcs`: CRC-32 only by default; an output stored where its checksum is
    kept, S3, asks for all three). ``known`` chunk digests and ``known_crcs`` (by
    index) are taken as given: a chunk known in both is not even read by
    :meth:`read` (:attr:`skipped` counts such bytes). ``whole`` (or no ``length``):
    the digest is the SHA-256 of every byte instead (``sha256:``, what records of
    versions 1 and 2 name), and nothing is skipped."""

    def __init__(
        self,
        length: int | None = None,
        known: Mapping[int, bytes] | None = None,
        crcs: Sequence[str] = ("CRC32",),
        *,
        whole: bool = False,
        known_crcs: Mapping[int, Mapping[str, int]] | None = None,
    ) -> None:
        self.whole = whole or length is None
        self._sha = hashlib.sha256() if self.whole else None
        self._crc = 0
        self.size = 0
        #: Bytes moved past without reading them (known chunks).
        self.skipped = 0
        self.length = length
        self._chunks: ChunkHasher | None = None
        self._pool: Worker | None = None
        self._pending: deque[Pending] = deque()  # handed to the worker, in order
        self._grid: GridCRCs | None = None
        if length is not None:
            from .chunks import ChunkHasher
            from .crcs import grid_for

            self._chunks = ChunkHasher(length, known)
            # the CRCs per chunk (CRC-32 among them)
            self._grid = grid_for(length, crcs, None if self.whole else known_crcs)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._feed(data)
        self._drain()

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        """:meth:`update`, except that a large piece's chunk digests may still be being
        computed (in the worker, in order) when it returns: ``data`` must not change
        until :meth:`_drain` (or :meth:`_wait_oldest` for it) has returned."""
        n = memoryview(data).nbytes
        chunks = self._chunks
        if chunks is not None and n >= _PARALLEL_MIN and not chunks.known(n, self.size):
            if self._pool is None:
                self._pool = Worker("ptestore-chunk-digest")
            self._pending.append(self._pool.submit(chunks.update, data))
            try:
                if self._sha is not None:
                    self._sha.update(data)
                self._crc_update(data)
            except BaseException:
                self._drain(quiet=True)
                raise
        else:
            self._drain()  # the chunk hasher is the worker's until then
            if chunks is not None:
                chunks.update(data)
            if self._sha is not None:
                self._sha.update(data)
            self._crc_update(data)
        self.size += n

    def _wait_oldest(self) -> None:
        self._pending.popleft().result()

    def _drain(self, *, quiet: bool = False) -> None:
        """Wait for every piece handed to the worker (``quiet``: ignore what it
        raised, the caller is failing already)."""
        while self._pending:
            try:
                self._wait_oldest()
            except BaseException:
                if not quiet:
                    self._pending.clear()
                    raise

    def _crc_update(self, data: bytes | bytearray | memoryview) -> None:
        if self._grid is not None:
            self._grid.update(data)
        else:
            self._crc = crc32(data, self._crc)

    def _skippable(self, index: int) -> bool:
        return (
            not self.whole
            and self._chunks is not None
            and self._grid is not None
            and self._chunks.is_known(index)
            and self._grid.is_known(index)
        )

    def _runs(self, n: int) -> Iterator[tuple[int, bool]]:
        """The next ``n`` bytes as runs ``(size, skippable)`` on chunk boundaries."""
        if self._chunks is None or self.whole:
            yield n, False
            return
        size = self._chunks.chunk_size
        pos, end = self.size, self.size + n
        while pos < end:
            skip = self._skippable(pos // size)
            stop = pos
            while stop < end and self._skippable(stop // size) == skip:
                stop = min((stop // size + 1) * size, end)
            yield stop - pos, skip
            pos = stop

    def _advance(self, n: int, *, read: bool = False) -> None:
        """Move past ``n`` bytes whose chunks are known (``read``: because a parallel
        pass just read and hashed them, so they are not counted as skipped)."""
        assert self._chunks is not None and self._grid is not None
        self._drain()
        self._chunks.advance(n)
        self._grid.advance(n)
        self.size += n
        if not read:
            self.skipped += n

    def zeros(self, n: int) -> None:
        self._feed_in_order(None, 0, n, None)

    def read(
        self,
        loader: DataLoader,
        offset: int,
        size: int,
        cancelled: threading.Event | None = None,
    ) -> None:
        """Feed ``size`` bytes of ``loader`` from ``offset`` (:meth:`feed_pieces`)."""
        self.feed_pieces([(loader, offset, size)], cancelled)

    def feed_pieces(self, parts: Sequence[Piece], cancelled: threading.Event | None = None) -> None:
        """Feed the bytes of ``parts`` (:data:`Piece`: a loader's, in memory, zeros),
        in order. The chunks they fill whole are described a chunk per core at once,
        whatever pieces each is made of, where every loader among them reads from any
        thread (local files, the run's spool); chunks known in full are not read; the
        rest is fed in order."""
        parts = [p for p in parts if p[2] > 0]
        chunks, grid = self._chunks, self._grid
        workers = 1
        if chunks is not None and grid is not None and not self.whole:
            workers = pieces.parallel_for(parts)
        if chunks is None or grid is None or workers < 2:
            for src, offset, n in parts:
                self._feed_in_order(src, offset, n, cancelled)
            return
        cs = chunks.chunk_size
        total = sum(n for _, _, n in parts)
        start = self.size
        head = min(total, -start % cs)
        count = (total - head) // cs
        if self.length is not None and start + total == self.length and (total - head) % cs:
            count += 1  # the content's last chunk, a short one, is filled whole too
        bounds = [0, head, *(min(head + (j + 1) * cs, total) for j in range(count)), total]
        stretches = pieces.cut(parts, bounds)
        for src, offset, n in stretches[0]:
            self._feed_in_order(src, offset, n, cancelled)
        first = (start + head) // cs
        spans = [
            (first + j, ps, not chunks.is_known(first + j))
            for j, ps in enumerate(stretches[1 : 1 + count])
            if not self._skippable(first + j)
        ]
        described = (
            pieces.describe_chunks(spans, grid.algorithms, workers, cancelled)
            if len(spans) > 1
            else {}
        )
        for j, ps in enumerate(stretches[1 : 1 + count]):
            i = first + j
            n = bounds[j + 2] - bounds[j + 1]
            if i in described:
                digest, row = described[i]
                if digest is not None:
                    chunks.learn(i, digest)
                grid.learn(i, row)
                self._advance(n, read=True)
            elif self._skippable(i):
                self._advance(n)
            else:
                for src, offset, k in ps:
                    self._feed_in_order(src, offset, k, cancelled)
        for src, offset, n in stretches[-1]:
            self._feed_in_order(src, offset, n, cancelled)

    def _feed_in_order(
        self, src: object, offset: int, size: int, cancelled: threading.Event | None
    ) -> None:
        """Feed one piece in order, moving past the chunks known in full."""
        for run, skip in list(self._runs(size)):
            if skip:
                self._advance(run)
            elif src is None:
                done = 0
                while done < run:
                    k = min(run - done, len(_ZEROS))
                    self.update(_ZEROS[:k] if k < len(_ZEROS) else _ZEROS)
                    done += k
            elif is_memory(src):
                self.update(memoryview(src).cast("B")[offset : offset + run])  # type: ignore[arg-type]
            else:
                self._read_in_order(src, offset, run, cancelled)  # type: ignore[arg-type]
            offset += run

    def _read_in_order(
        self, loader: DataLoader, offset: int, size: int, cancelled: threading.Event | None
    ) -> None:
        """Feed ``size`` bytes of ``loader`` from ``offset``, reading the next piece while
        the worker hashes the last one (two buffers taking turns: the chunk digests are
        then no longer the slower half of the work)."""
        try:
            for piece in read_pieces(loader, offset, size, cancelled=cancelled, buffers=2):
                self._feed(piece)
                if len(self._pending) >= 2:
                    self._wait_oldest()  # its buffer is the one read into next
        except BaseException:
            self._drain(quiet=True)
            raise
        self._drain()

    def digest(self) -> ContentDigest:
        self._drain()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        chunks = None if self._chunks is None else self._chunks.result()
        crc, crcs = self._crc, None
        if self._grid is not None and self.size == self.length:
            crcs = self._crcs()
            crc = self._grid.full("CRC32")
        if self._sha is not None:
            digest = "sha256:" + self._sha.hexdigest()
        else:
            assert chunks is not None
            digest = chunks.digest
        return ContentDigest(self.size, digest, crc, chunks, crcs)

    def _crcs(self) -> ContentCRCs:
        from .crcs import ContentCRCs

        assert self._grid is not None and self.length is not None
        return ContentCRCs.from_grid(self._grid, self.length)


def content_digest(
    loader: DataLoader,
    size: int,
    *,
    like: str | None = None,
    cancelled: threading.Event | None = None,
) -> ContentDigest:
    """The digest of the first ``size`` bytes of ``loader`` (one streaming read), with
    its chunk digests: ``sha256-tree:`` (the chunk root), or the whole SHA-256
    (``sha256:``) when ``like`` (the digest it will be compared with) is one."""
    from .chunks import algorithm

    h = ContentHasher(size, whole=like is not None and algorithm(like) == "sha256")
    h.read(loader, 0, size, cancelled)
    return h.digest()


def object_crc32(content: ContentDigest, trailer: bytes) -> int:
    """CRC-32 of a whole object: ``content`` followed by ``trailer``."""
    from ..checksums import crc_combine

    return crc_combine("CRC32", content.crc32, zlib.crc32(trailer), len(trailer))
