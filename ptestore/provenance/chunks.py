"""Chunk digests: the SHA-256 of each fixed-size, file-aligned chunk of a container
(its bytes before the trailer) and a root digest over them.

Chunk ``i`` is ``[i * size, min((i + 1) * size, length))``; the last one may be short
and an empty container has none. The chunk size is :data:`CHUNK_SIZE` (4 MiB), doubled
until a container has at most :data:`MAX_CHUNKS` chunks (so the record stays well
under the trailer's payload limit: 16384 digests are 700 KB of base64). 4 MiB because:
it is a multiple of every segment alignment ExecuTorch uses (and of the 4 KiB blocks
a reflink clone shares), so a segment that keeps its offset keeps its chunks; a 16 MiB
weight touches 4-5 chunks; and a 1 GiB program records 256 digests (11 KB).

The root (``sha256:<hex>``) is the SHA-256 of::

    b"ptestore.chunks\\x00" + u64le(chunk size) + u64le(length) + digest_0 + ... + digest_n-1

(each digest the 32 raw bytes). It names the bytes as the whole-file SHA-256 does,
but a run can derive it from the chunks it copied and the ones it wrote.

Since provenance version 3 the root *is* the content's digest, written
``sha256-tree:<hex>`` (:data:`TREE`; the same 64 hex digits as the root) wherever a
digest names bytes: ``content.sha256``, ``source.sha256``, the fleet index, the content
address of a shared .ptd. Records of versions 1 and 2 name the whole-file SHA-256
(``sha256:<hex>``); :func:`algorithm` tells the two apart and every check computes the
digest a record names (:func:`~ptestore.provenance.digest.content_digest` ``like=``).
Why: the root of an output is derived from the chunks it keeps from a known source and
the ones it writes, so trust costs what changed; a whole-file SHA-256 reads every byte.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from .._dataclass import dataclass, field
from ..errors import FormatError

if TYPE_CHECKING:
    from ..storage.types import DataLoader

__all__ = [
    "CHUNK_SIZE",
    "TREE",
    "WHOLE",
    "algorithm",
    "tree_digest",
    "well_formed",
    "MAX_CHUNKS",
    "ChunkDigests",
    "ChunkHasher",
    "Known",
    "chunk_size_for",
    "hash_chunks",
    "iter_mismatches",
    "reusable",
]

CHUNK_SIZE = 4 << 20
MAX_CHUNKS = 16384
_ROOT_PREFIX = b"ptestore.chunks\x00"
_U64x2 = struct.Struct("<QQ")
_DIGEST = 32

#: The prefix of a chunk-root digest (records of version 3).
TREE = "sha256-tree:"
#: The prefix of a whole-file SHA-256 (records of versions 1 and 2).
WHOLE = "sha256:"


def algorithm(digest: str) -> str:
    """``"sha256-tree"`` or ``"sha256"``: how ``digest`` was computed (its prefix)."""
    if digest.startswith(TREE):
        return "sha256-tree"
    if digest.startswith(WHOLE):
        return "sha256"
    raise ValueError(f"digest {digest!r}: expected sha256-tree:<hex> or sha256:<hex>")


def well_formed(
    digest: object, algorithms: tuple[str, ...] = ("sha256", "sha256-tree")
) -> TypeGuard[str]:
    """Whether ``digest`` is ``<algorithm>:`` (one of ``algorithms``) and 64 lowercase
    hex digits: a digest a check knows how to compute."""
    if not isinstance(digest, str):
        return False
    algorithm, _, hexdigits = digest.partition(":")
    return algorithm in algorithms and len(hexdigits) == 64 and _HEX.issuperset(hexdigits)


_HEX = frozenset("0123456789abcdef")


def tree_digest(data: bytes | bytearray | memoryview) -> str:
    """``sha256-tree:<hex>`` of ``data`` (in memory): its chunk root."""
    h = ChunkHasher(memoryview(data).nbytes)
    h.update(data)
    return h.result().digest


def chunk_size_for(length: int) -> int:
    """The chunk size of a ``length``-byte container (see the module's docstring)."""
    size = CHUNK_SIZE
    while -(-length // size) > MAX_CHUNKS:
        size *= 2
    return size


def _root(chunk_size: int, length: int, digests: Sequence[bytes]) -> str:
    h = hashlib.sha256(_ROOT_PREFIX)
    h.update(_U64x2.pack(chunk_size, length))
    for d in digests:
        h.update(d)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class ChunkDigests:
    """The chunk digests of a ``length``-byte container (raw 32-byte SHA-256s)."""

    chunk_size: int
    length: int
    digests: tuple[bytes, ...]

    def __repr__(self) -> str:
        # the digests summed up by their root (256 raw digests made a report's repr
        # run to a thousand characters of bytes literals)
        return (
            f"ChunkDigests(chunk_size={self.chunk_size}, length={self.length}, "
            f"{len(self.digests)} digests, root={self.root!r})"
        )

    @property
    def root(self) -> str:
        """``sha256:<hex>`` over the chunk size, the length and the digests."""
        return _root(self.chunk_size, self.length, self.digests)

    @property
    def digest(self) -> str:
        """The content's digest since records of version 3: ``sha256-tree:<hex>``, the
        root's hex digits."""
        return TREE + self.root[len(WHOLE) :]

    def span(self, i: int) -> tuple[int, int]:
        """``[start, end)`` of chunk ``i``."""
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, self.length)

    def covering(self, start: int, end: int) -> range:
        """Indices of the chunks that overlap ``[start, end)``."""
        if end <= start:
            return range(0)
        return range(start // self.chunk_size, -(-end // self.chunk_size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.chunk_size,
            "sha256": base64.b64encode(b"".join(self.digests)).decode("ascii"),
            "root": self.root,
        }

    @classmethod
    def from_dict(cls, d: object, length: int, source: str, where: str) -> ChunkDigests:
        """Parse ``{"size", "sha256", "root"}`` of a ``length``-byte container; the count
        of digests and the root are checked (a :class:`FormatError` names the field)."""
        field = f"provenance {where}.chunks"
        if not isinstance(d, dict):
            raise FormatError(source, field, d, "an object")
        size = d.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size != chunk_size_for(length):
            raise FormatError(
                source,
                f"{field}.size",
                size,
                f"{chunk_size_for(length)} (the chunk size of {length} bytes)",
            )
        text = d.get("sha256")
        try:
            raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
        except ValueError:
            raw = None
        count = -(-length // size)
        if raw is None or len(raw) != count * _DIGEST:
            got = "not base64" if raw is None else f"{len(raw)} bytes"
            raise FormatError(
                source,
                f"{field}.sha256",
                got,
                f"base64 of {count} SHA-256 digests ({count * _DIGEST} bytes) for {length} "
                f"bytes in chunks of {size}",
            )
        out = cls(size, length, tuple(raw[i : i + _DIGEST] for i in range(0, len(raw), _DIGEST)))
        if d.get("root") != out.root:
            raise FormatError(
                source, f"{field}.root", d.get("root"), f"{out.root}, the root of its digests"
            )
        return out


@dataclass(frozen=True)
class Known:
    """The chunk digests of an object and the CRCs known per chunk (by index):
    what :mod:`.known` remembers of an object version."""

    chunks: ChunkDigests
    crcs: dict[int, dict[str, int]] = field(default_factory=dict)


class ChunkHasher:
    """The chunk digests of bytes fed in order (each piece at the next offset).
    ``known``: digests of chunks already known (by index, see :func:`reusable`): their
    bytes are fed but not hashed."""

    def __init__(self, length: int, known: Mapping[int, bytes] | None = None) -> None:
        self.length = length
        self.chunk_size = chunk_size_for(length)
        self._known = dict(known or {})
        self._digests: list[bytes] = []
        self._h = hashlib.sha256()
        self._filled = 0
        self.size = 0
        #: Bytes hashed (the rest were in known chunks).
        self.hashed = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = min(view.nbytes, self.chunk_size - self._filled)
            if len(self._digests) not in self._known:
                self._h.update(view[:n])
                self.hashed += n
            self._filled += n
            self.size += n
            view = view[n:]
            if self._filled == self.chunk_size:
                self._close_chunk()

    def advance(self, n: int) -> None:
        """Move past ``n`` bytes without their data: each chunk they touch must be known."""
        while n:
            k = min(n, self.chunk_size - self._filled)
            if len(self._digests) not in self._known:
                raise ValueError(f"chunk {len(self._digests)} is not known: its bytes are needed")
            self._filled += k
            self.size += k
            n -= k
            if self._filled == self.chunk_size:
                self._close_chunk()

    def is_known(self, index: int) -> bool:
        return index in self._known

    def learn(self, index: int, digest: bytes) -> None:
        """Chunk ``index``'s digest, computed elsewhere (a thread of a parallel pass):
        its bytes are then moved past (:meth:`advance`) and counted as hashed."""
        self._known[index] = digest
        self.hashed += min(self.chunk_size, self.length - index * self.chunk_size)

    def known(self, n: int, start: int | None = None) -> bool:
        """Whether the next ``n`` bytes (those from ``start``, when given: a caller
        whose earlier bytes another thread may still be hashing) lie in known chunks
        only (nothing to hash)."""
        at = self.size if start is None else start
        first = at // self.chunk_size
        last = (at + max(n, 1) - 1) // self.chunk_size
        return all(i in self._known for i in range(first, last + 1))

    def _close_chunk(self) -> None:
        i = len(self._digests)
        self._digests.append(self._known[i] if i in self._known else self._h.digest())
        self._h = hashlib.sha256()
        self._filled = 0

    def result(self) -> ChunkDigests:
        if self.size != self.length:
            raise ValueError(f"chunk hasher fed {self.size} bytes, expected {self.length}")
        if self._filled:
            self._close_chunk()
        return ChunkDigests(self.chunk_size, self.length, tuple(self._digests))


def reusable(
    source: ChunkDigests, length: int, kept: Iterable[tuple[int, int]]
) -> dict[int, bytes]:
    """The chunk digests of a ``length``-byte output that ``source`` already gives:
    those of chunks lying wholly inside a ``kept`` range (``(start, end)``: bytes the
    output has at the same offsets as the source, unchanged) whose span is the same in
    both (same chunk size; the source's last chunk only if it ends where the output's
    does)."""
    size = chunk_size_for(length)
    if size != source.chunk_size:
        return {}
    out: dict[int, bytes] = {}
    for start, end in kept:
        end = min(end, length, source.length)
        for i in range(-(-start // size), end // size + 1):
            a, b = i * size, min((i + 1) * size, length)
            if a >= b or b > end or min((i + 1) * size, source.length) != b:
                continue
            out[i] = source.digests[i]
    return out


def hash_chunks(
    loader: DataLoader,
    length: int,
    indices: Sequence[int] | None = None,
    *,
    cancelled: threading.Event | None = None,
) -> dict[int, bytes]:
    """SHA-256 of chunks ``indices`` (all when None) of the first ``length`` bytes of
    ``loader``: one chunk per core at once where the loader reads from any thread
    (local files; :func:`~.pieces.chunk_digests`), else one after the other."""
    from .pieces import chunk_digests

    size = chunk_size_for(length)
    todo = list(range(-(-length // size))) if indices is None else list(indices)
    return chunk_digests([(loader, 0, length)], length, size, todo, cancelled)


def iter_mismatches(
    loader: DataLoader, chunks: ChunkDigests, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, bytes]]:
    """``(index, chunk start, chunk end, its actual digest)`` of each chunk overlapping
    ``[start, end)`` (the whole container by default) whose bytes do not have the
    recorded digest."""
    stop = chunks.length if end is None else end
    wanted = list(chunks.covering(start, stop))
    got = hash_chunks(loader, chunks.length, wanted)
    for i in wanted:
        if got[i] != chunks.digests[i]:
            a, b = chunks.span(i)
            yield i, a, b, got[i]
