"""The checksums S3 keeps, by algorithm: compute, combine, encode, compare.

S3 stores one checksum per object, of one of these algorithms (its names):

- ``CRC32`` (zlib's CRC-32), ``CRC32C`` (Castagnoli), ``CRC64NVME``: CRCs, stored for the
  whole object (``ChecksumType=FULL_OBJECT``) or, for a multipart object, optionally as
  a *composite* (``COMPOSITE``, not for CRC64NVME): the checksum of the concatenated
  part checksums, written ``<base64>-<parts>``. S3 stores CRC64NVME for an object
  uploaded without a checksum.
- ``SHA256``, ``SHA1``: digests; full-object for a single ``PutObject``, composite only
  for a multipart object.

Values are integers for CRCs and raw digests for SHA-*; S3 writes them as base64 of the
big-endian bytes (:func:`encode`, :func:`decode`).

CRC-32 needs nothing beyond :mod:`zlib` (libdeflate computes it where the system has
it: :mod:`ptestore._crc32`). CRC-32C and CRC64NVME are computed by
``awscrt`` (the AWS Common Runtime botocore itself uses for them, ``botocore[crt]``;
installed by ``pip install 'ptestore[s3]'``), imported on first use: hardware
accelerated, about 25 GB/s here, where pure Python would take minutes per GiB. Without
it :func:`available` is false and :func:`crc` raises :class:`ChecksumUnavailable`;
callers then choose another algorithm or read the bytes, never guess.

:func:`crc_combine` joins the CRCs of two adjacent byte ranges without their bytes
(zlib's ``crc32_combine``, for any reflected CRC whose initial value and final xor are
all ones, as all three are): shifting a CRC over ``n`` zero bytes is a multiplication
by ``x^(8n)`` modulo the polynomial, computed by repeated squaring. It is what lets the
S3 writer send the full-object checksum of parts the service copied, and a record of
per-chunk CRCs (:class:`GridCRCs`) predict any part-aligned checksum of an object
(:class:`ExpectedChecksums`) without reading it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

from ._crc32 import crc32
from ._dataclass import dataclass, field
from .errors import PteStoreError

__all__ = [
    "ALGORITHMS",
    "CRC_ALGORITHMS",
    "S3_DEFAULT",
    "ChecksumUnavailable",
    "ExpectedChecksums",
    "GridCRCs",
    "Hasher",
    "available",
    "combine_all",
    "composite",
    "crc",
    "crc_combine",
    "crt_module",
    "decode",
    "encode",
    "to_bytes",
]

Algorithm = Literal["CRC32", "CRC32C", "CRC64NVME", "SHA256", "SHA1"]
#: Every algorithm S3 keeps, in the order a stored checksum is looked for.
ALGORITHMS: tuple[str, ...] = ("CRC64NVME", "CRC32", "CRC32C", "SHA256", "SHA1")
#: The CRCs (combinable: :func:`crc_combine`).
CRC_ALGORITHMS: tuple[str, ...] = ("CRC32", "CRC32C", "CRC64NVME")
#: What S3 stores for an object uploaded without a checksum.
S3_DEFAULT = "CRC64NVME"

#: width in bits and the reflected polynomial of each CRC.
_CRC_SPECS: dict[str, tuple[int, int]] = {
    "CRC32": (32, 0xEDB88320),
    "CRC32C": (32, 0x82F63B78),
    # CRC-64/NVME: polynomial 0xAD93D23594C93659, reflected below
    "CRC64NVME": (64, int(f"{0xAD93D23594C93659:064b}"[::-1], 2)),
}
_DIGESTS = {"SHA256": "sha256", "SHA1": "sha1"}


class ChecksumUnavailable(PteStoreError):
    """An algorithm whose implementation is not installed (``awscrt``)."""


@functools.cache
def crt_module() -> ModuleType | None:
    """``awscrt.checksums``, or None when it cannot be imported (cached; tests clear the
    cache with ``crt_module.cache_clear()``)."""
    try:
        from awscrt import checksums
    except ImportError:
        return None
    module: ModuleType = checksums
    return module


def _check(algorithm: str) -> None:
    if algorithm not in _CRC_SPECS and algorithm not in _DIGESTS:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}: one of {ALGORITHMS}")


def available(algorithm: str) -> bool:
    """Whether :func:`crc` / :class:`Hasher` can compute ``algorithm`` here."""
    _check(algorithm)
    return algorithm in ("CRC32", "SHA256", "SHA1") or crt_module() is not None


def width(algorithm: str) -> int:
    """Bytes of a value of ``algorithm`` (4, 8, 32 or 20)."""
    _check(algorithm)
    if algorithm in _CRC_SPECS:
        return _CRC_SPECS[algorithm][0] // 8
    return hashlib.new(_DIGESTS[algorithm]).digest_size


def crc(algorithm: str, data: Any, previous: int = 0) -> int:
    """The CRC of ``data`` (any buffer), continuing from ``previous`` (the CRC of the
    bytes before it). :class:`ChecksumUnavailable` when ``awscrt`` is missing for
    CRC-32C and CRC64NVME."""
    if algorithm == "CRC32":
        return crc32(data, previous)
    if algorithm not in ("CRC32C", "CRC64NVME"):
        raise ValueError(f"{algorithm!r} is not a CRC: one of {CRC_ALGORITHMS}")
    crt = crt_module()
    if crt is None:
        raise ChecksumUnavailable(
            f"computing {algorithm} needs the awscrt package, which is not installed: "
            "pip install 'ptestore[s3]'"
        )
    view = data if isinstance(data, (bytes, bytearray, memoryview)) else memoryview(data)
    fn = crt.crc32c if algorithm == "CRC32C" else crt.crc64nvme
    return int(fn(view, previous))


def _multmodp(a: int, b: int, bits: int, poly: int) -> int:
    """``a * b`` modulo the polynomial (reflected bit order, ``bits`` wide)."""
    if a == 0:
        return 0
    m = 1 << (bits - 1)
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return p


@functools.cache
def _x2n(algorithm: str) -> tuple[int, ...]:
    """``x^(2^k)`` modulo the polynomial for k = 0..71 (enough for any 64-bit length)."""
    bits, poly = _CRC_SPECS[algorithm]
    table = [1 << (bits - 2)]  # x^1
    for _ in range(71):
        table.append(_multmodp(table[-1], table[-1], bits, poly))
    return tuple(table)


@functools.lru_cache(maxsize=1024)
def _shift(algorithm: str, n: int) -> int:
    """``x^(8n)`` modulo the polynomial: the operator that moves a CRC over n bytes."""
    bits, poly = _CRC_SPECS[algorithm]
    table = _x2n(algorithm)
    p = 1 << (bits - 1)  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(table[k], p, bits, poly)
        n >>= 1
        k += 1
    return p


def crc_combine(algorithm: str, crc1: int, crc2: int, len2: int) -> int:
    """The CRC of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)`` (any CRC of
    :data:`CRC_ALGORITHMS`; no library needed)."""
    if algorithm not in _CRC_SPECS:
        raise ValueError(f"{algorithm!r} is not a CRC: one of {CRC_ALGORITHMS}")
    if len2 < 0:
        raise ValueError(f"length {len2} < 0")
    bits, poly = _CRC_SPECS[algorithm]
    return _multmodp(_shift(algorithm, len2), crc1, bits, poly) ^ crc2


def combine_all(algorithm: str, pieces: Sequence[tuple[int, int]]) -> int:
    """The CRC of consecutive pieces given as ``(crc, length)``."""
    total = 0
    for value, length in pieces:
        total = crc_combine(algorithm, total, value, length)
    return total


def to_bytes(algorithm: str, value: int | bytes) -> bytes:
    """A value as S3 hashes and encodes it: a CRC's big-endian bytes, a digest as is."""
    if isinstance(value, bytes):
        return value
    return value.to_bytes(width(algorithm), "big")


def encode(algorithm: str, value: int | bytes) -> str:
    """A value as S3 writes it (``ChecksumCRC64NVME`` etc.): base64 of its bytes."""
    return base64.b64encode(to_bytes(algorithm, value)).decode("ascii")


def decode(algorithm: str, text: str) -> int | bytes | None:
    """The value of S3's base64 text (without any ``-N``), None when malformed."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != width(algorithm):
        return None
    return int.from_bytes(raw, "big") if algorithm in _CRC_SPECS else raw


class Hasher:
    """One algorithm's checksum of bytes fed in order."""

    def __init__(self, algorithm: str) -> None:
        _check(algorithm)
        self.algorithm = algorithm
        self._crc = 0
        self._digest = hashlib.new(_DIGESTS[algorithm]) if algorithm in _DIGESTS else None
        if self._digest is None and not available(algorithm):
            crc(algorithm, b"")  # raises ChecksumUnavailable

    def update(self, data: Any) -> None:
        if self._digest is not None:
            self._digest.update(data)
        else:
            self._crc = crc(self.algorithm, data, self._crc)

    def value(self) -> int | bytes:
        return self._digest.digest() if self._digest is not None else self._crc

    def encoded(self) -> str:
        return encode(self.algorithm, self.value())


def checksum_of(algorithm: str, data: Any) -> int | bytes:
    """``algorithm``'s value of ``data`` in one call."""
    h = Hasher(algorithm)
    h.update(data)
    return h.value()


def composite(algorithm: str, parts: Sequence[int | bytes]) -> str:
    """S3's composite checksum of parts with these values: the checksum of their
    concatenated bytes, then ``-<number of parts>``."""
    joined = b"".join(to_bytes(algorithm, v) for v in parts)
    return f"{encode(algorithm, checksum_of(algorithm, joined))}-{len(parts)}"


class GridCRCs:
    """The CRCs of each ``chunk_size``-aligned chunk of bytes fed in order, for every
    algorithm of ``algorithms`` that :func:`available` (the last chunk may be short)."""

    def __init__(
        self,
        chunk_size: int,
        algorithms: Sequence[str] = CRC_ALGORITHMS,
        known: Mapping[int, Mapping[str, int]] | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk size {chunk_size} < 1")
        self.chunk_size = chunk_size
        self.algorithms = tuple(a for a in algorithms if available(a))
        #: CRCs of chunks already known, by index (those with every algorithm are
        #: not computed, see :meth:`advance`).
        self._known = {
            i: dict(v) for i, v in (known or {}).items() if all(a in v for a in self.algorithms)
        }
        self._done: dict[str, list[int]] = {a: [] for a in self.algorithms}
        self._running = dict.fromkeys(self.algorithms, 0)
        self._filled = 0
        self.size = 0
        self._count: list[int] = []  # chunks closed, when no algorithm is available

    def is_known(self, index: int) -> bool:
        """Whether chunk ``index``'s CRCs are known (its bytes need not be fed)."""
        return index in self._known

    def learn(self, index: int, row: Mapping[str, int]) -> None:
        """Chunk ``index``'s CRCs (one per algorithm), computed elsewhere."""
        self._known[index] = dict(row)

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = min(view.nbytes, self.chunk_size - self._filled)
            if len(self._done_any()) not in self._known:
                piece = view[:n]
                for a in self.algorithms:
                    self._running[a] = crc(a, piece, self._running[a])
            self._filled += n
            self.size += n
            view = view[n:]
            if self._filled == self.chunk_size:
                self._close()

    def advance(self, n: int) -> None:
        """Move past ``n`` bytes without their data: each chunk they touch must be known."""
        while n:
            k = min(n, self.chunk_size - self._filled)
            if len(self._done_any()) not in self._known:
                raise ValueError(f"the CRCs of chunk {len(self._done_any())} are not known")
            self._filled += k
            self.size += k
            n -= k
            if self._filled == self.chunk_size:
                self._close()

    def _done_any(self) -> list[int]:
        return self._done[self.algorithms[0]] if self.algorithms else self._count

    def _close(self) -> None:
        i = len(self._done_any())
        known = self._known.get(i)
        for a in self.algorithms:
            self._done[a].append(known[a] if known is not None else self._running[a])
            self._running[a] = 0
        if not self.algorithms:
            self._count.append(0)
        self._filled = 0

    def result(self) -> dict[str, tuple[int, ...]]:
        """Per algorithm, the CRC of each chunk (the partial last one included)."""
        if self._filled:
            self._close()
        return {a: tuple(v) for a, v in self._done.items()}

    def full(self, algorithm: str) -> int:
        """The CRC of everything fed (call after :meth:`result`)."""
        values = self._done[algorithm]
        size = self.chunk_size
        lengths = [min(size, self.size - i * size) for i in range(len(values))]
        return combine_all(algorithm, list(zip(values, lengths, strict=True)))


@dataclass(frozen=True)
class ExpectedChecksums:
    """What is known of an object's bytes without reading it: a *body* (its first
    ``body_size`` bytes) described by CRCs, per algorithm, of the whole body
    (``body_crcs``) and/or of each ``chunk_size``-aligned chunk (``chunk_crcs``),
    followed by ``tail``, bytes in hand (a provenance trailer; empty for none); and,
    when known, the SHA-256 of the whole object."""

    body_size: int
    body_crcs: Mapping[str, int] = field(default_factory=dict)
    chunk_size: int = 0
    chunk_crcs: Mapping[str, Sequence[int]] = field(default_factory=dict)
    tail: bytes = b""
    sha256: bytes | None = None

    @property
    def size(self) -> int:
        return self.body_size + len(self.tail)

    def _chunks(self, algorithm: str) -> Sequence[int] | None:
        values = self.chunk_crcs.get(algorithm)
        if values is None or self.chunk_size < 1:
            return None
        if len(values) != -(-self.body_size // self.chunk_size):
            return None
        return values

    def body_crc(self, algorithm: str) -> int | None:
        if algorithm in self.body_crcs:
            return self.body_crcs[algorithm]
        values = self._chunks(algorithm)
        if values is None:
            return None
        return self._range_crc(algorithm, values, 0, self.body_size)

    def full(self, algorithm: str) -> int | bytes | None:
        """The whole object's checksum of ``algorithm``, or None when not known."""
        if algorithm == "SHA256":
            return self.sha256
        if algorithm not in CRC_ALGORITHMS:
            return None
        body = self.body_crc(algorithm)
        if body is None or not self.tail:
            return body
        if not available(algorithm):
            return None
        return crc_combine(algorithm, body, crc(algorithm, self.tail), len(self.tail))

    def _range_crc(self, algorithm: str, values: Sequence[int], start: int, end: int) -> int:
        size = self.chunk_size
        first, last = start // size, -(-end // size)
        pieces = [(values[i], min(size, self.body_size - i * size)) for i in range(first, last)]
        return combine_all(algorithm, pieces)

    def parts(self, algorithm: str, sizes: Sequence[int]) -> list[int] | None:
        """The CRC of each part of an object cut into parts of ``sizes`` bytes, or None
        when a part boundary falls inside a chunk of the body (or nothing is known)."""
        if algorithm not in CRC_ALGORITHMS or sum(sizes) != self.size or not sizes:
            return None
        if self.tail and not available(algorithm):
            return None
        values = self._chunks(algorithm)
        whole = self.body_crcs.get(algorithm)
        out: list[int] = []
        start = 0
        for n in sizes:
            end = start + n
            body_end = min(end, self.body_size)
            value = 0
            if start < body_end:
                aligned = start % self.chunk_size == 0 if values is not None else start == 0
                closed = body_end == self.body_size or (
                    values is not None and body_end % self.chunk_size == 0
                )
                if not (aligned and closed):
                    return None
                if values is not None:
                    value = self._range_crc(algorithm, values, start, body_end)
                elif whole is not None:
                    value = whole  # one part holds the whole body
                else:
                    return None
            if end > self.body_size:
                piece = self.tail[max(0, start - self.body_size) : end - self.body_size]
                value = crc_combine(algorithm, value, crc(algorithm, piece), len(piece))
            out.append(value)
            start = end
        return out
