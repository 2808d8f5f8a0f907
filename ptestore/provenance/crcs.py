"""The CRCs a record keeps of a file's bytes, so that a store's checksum of the object
can be checked without reading it (:mod:`ptestore.fleet.binding`).

A content digest (``content``, ``ptd_output``) records, beside its SHA-256 and CRC-32::

    "crcs": {"size": 4194304,                      # the chunk size (as ``chunks``)
             "crc32c": "<base64>", "crc64nvme": "<base64>",  # of all the bytes before the trailer
             "chunks": {"crc32": "<base64>", "crc32c": "<base64>", "crc64nvme": "<base64>"}}

The whole-content values are written as S3 writes checksums (base64 of the big-endian
bytes, what a ``HEAD`` shows; fixed width, so a record's size does not depend on them).
``chunks`` holds each algorithm's CRC of every chunk (big-endian, concatenated, then
base64) on the grid of :mod:`.chunks` (4 MiB, doubled for very large files); it is
left out above :data:`MAX_CRC_CHUNKS` chunks (16 GiB at 4 MiB) to keep the trailer
small. The per-chunk CRC-32 (zlib) is always recorded; CRC-32C and CRC64NVME need
``awscrt`` (:mod:`ptestore.checksums`) and are recorded for an output whose writer
says the store keeps a checksum (``DataWriter.stored_checksum``: S3), not for a local
file, whose run would pay their import (about 0.1 s) for a store it does not use. The
choice follows the destination, never the state of the process, so a record is the
same whatever ran before it. Records without ``crcs`` (older
ones) still read.

Why per chunk: S3 keeps one checksum per object, and for a multipart upload made by
common tools (boto3's ``upload_file``, the AWS CLI: 8 MiB parts) it is a *composite*,
the CRC of the parts' CRCs. Any part boundary on the chunk grid is predicted by
combining chunk CRCs (:func:`ptestore.checksums.crc_combine`), and the trailer's bytes
are in hand, so such an object is checked by a ``HEAD`` too. Version 2 readers ignore
the key; no version bump.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .._dataclass import dataclass, field
from ..checksums import (
    CRC_ALGORITHMS,
    ExpectedChecksums,
    GridCRCs,
    decode,
    encode,
    width,
)
from ..errors import FormatError
from .chunks import chunk_size_for


class _Content(Protocol):
    """What :func:`expected_checksums` reads of a
    :class:`~ptestore.provenance.record.ContentDigest`."""

    @property
    def size(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def crc32(self) -> int: ...
    @property
    def crcs(self) -> ContentCRCs | None: ...


__all__ = [
    "LOCAL_CRCS",
    "MAX_CRC_CHUNKS",
    "STORE_CRCS",
    "ContentCRCs",
    "expected_checksums",
    "grid_for",
    "known_crcs",
]

#: Above this many chunks no per-chunk CRCs are recorded (16 bytes each).
MAX_CRC_CHUNKS = 4096
#: Algorithms recorded for the whole content here (CRC-32 is ``content.crc32``).
_FULL = ("CRC32C", "CRC64NVME")


#: What a run records for an output a store keeps a checksum of (S3).
STORE_CRCS = CRC_ALGORITHMS
#: What it records otherwise: the per-chunk CRC-32 (zlib, no import).
LOCAL_CRCS = ("CRC32",)


def grid_for(
    length: int,
    algorithms: Sequence[str] = LOCAL_CRCS,
    known: Mapping[int, Mapping[str, int]] | None = None,
) -> GridCRCs:
    """The CRC accumulator of a ``length``-byte content on its chunk grid, for those of
    ``algorithms`` that can be computed here (CRC-32C and CRC64NVME need ``awscrt``);
    ``known``: CRCs of chunks already known, by index."""
    return GridCRCs(chunk_size_for(length), algorithms, known)


def known_crcs(crcs: ContentCRCs | None, indices: Iterable[int]) -> dict[int, dict[str, int]]:
    """The per-chunk CRCs ``crcs`` records for chunks ``indices`` (by index)."""
    if crcs is None or not crcs.chunks:
        return {}
    return {i: {a: v[i] for a, v in crcs.chunks.items() if i < len(v)} for i in indices}


@dataclass(frozen=True)
class ContentCRCs:
    """CRCs of a content (``length`` bytes): whole, and per chunk of ``chunk_size``."""

    chunk_size: int
    length: int
    #: Of the whole content, per algorithm (CRC32C, CRC64NVME).
    full: Mapping[str, int] = field(default_factory=dict)
    #: Of each chunk, per algorithm (CRC32, CRC32C, CRC64NVME); empty above
    #: :data:`MAX_CRC_CHUNKS` chunks.
    chunks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_grid(cls, grid: GridCRCs, length: int) -> ContentCRCs:
        """From a :class:`GridCRCs` fed the ``length`` bytes."""
        per_chunk = grid.result()
        full = {a: grid.full(a) for a in _FULL if a in per_chunk}
        count = -(-length // grid.chunk_size)
        return cls(grid.chunk_size, length, full, per_chunk if count <= MAX_CRC_CHUNKS else {})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.chunk_size}
        for a in _FULL:
            if a in self.full:
                out[a.lower()] = encode(a, self.full[a])
        if self.chunks:
            out["chunks"] = {
                a.lower(): base64.b64encode(
                    b"".join(v.to_bytes(width(a), "big") for v in values)
                ).decode("ascii")
                for a, values in sorted(self.chunks.items())
            }
        return out

    @classmethod
    def from_dict(cls, d: object, length: int, source: str, where: str) -> ContentCRCs:
        """Parse ``{"size", "crc32c", "crc64nvme", "chunks"}`` of a ``length``-byte
        content (:class:`FormatError` names the bad field)."""
        name = f"provenance {where}.crcs"
        if not isinstance(d, dict):
            raise FormatError(source, name, d, "an object")
        size = d.get("size")
        want = chunk_size_for(length)
        if not isinstance(size, int) or isinstance(size, bool) or size != want:
            raise FormatError(source, f"{name}.size", size, f"{want} (the chunk size)")
        full: dict[str, int] = {}
        for a in _FULL:
            text = d.get(a.lower())
            if text is None:
                continue
            value = decode(a, text) if isinstance(text, str) else None
            if not isinstance(value, int):
                raise FormatError(
                    source, f"{name}.{a.lower()}", text, f"base64 of the {width(a)} bytes of a {a}"
                )
            full[a] = value
        chunks: dict[str, tuple[int, ...]] = {}
        per_chunk = d.get("chunks")
        if per_chunk is not None:
            if not isinstance(per_chunk, dict):
                raise FormatError(source, f"{name}.chunks", per_chunk, "an object")
            count = -(-length // size)
            for a in CRC_ALGORITHMS:
                text = per_chunk.get(a.lower())
                if text is None:
                    continue
                n = width(a)
                try:
                    raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
                except (binascii.Error, ValueError):
                    raw = None
                if raw is None or len(raw) != count * n:
                    got = "not base64" if raw is None else f"{len(raw)} bytes"
                    raise FormatError(
                        source,
                        f"{name}.chunks.{a.lower()}",
                        got,
                        f"base64 of {count} {a} values ({count * n} bytes)",
                    )
                chunks[a] = tuple(
                    int.from_bytes(raw[i : i + n], "big") for i in range(0, len(raw), n)
                )
        return cls(size, length, full, chunks)


def expected_checksums(
    content: _Content, tail: bytes = b"", *, whole: bool = False
) -> ExpectedChecksums:
    """What an object holding ``content`` then ``tail`` (its trailer) should have as
    checksums, from the record alone. ``whole``: the content is the whole object (no
    tail), so its SHA-256 is the object's."""
    crcs = content.crcs
    body: dict[str, int] = {"CRC32": content.crc32}
    chunk_size, chunks = 0, {}
    if crcs is not None and crcs.length == content.size:
        body.update(crcs.full)
        chunk_size, chunks = crcs.chunk_size, dict(crcs.chunks)
    sha = None
    if whole and not tail and content.sha256.startswith("sha256:"):
        try:
            sha = bytes.fromhex(content.sha256[len("sha256:") :])
        except ValueError:
            sha = None
    return ExpectedChecksums(content.size, body, chunk_size, chunks, tail, sha)
