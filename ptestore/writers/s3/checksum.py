"""The S3 writer's checksum: which algorithm, per part and for the whole object.

S3 checks a multipart object against one checksum of all its bytes
(``ChecksumType=FULL_OBJECT``). The writer computes each uploaded part's checksum, takes
each copied part's from the ``UploadPartCopy`` answer, and joins them without reading
the bytes again (:func:`ptestore.checksums.crc_combine`).

The algorithm (writer option ``checksum_algorithm``) is by default **CRC64NVME**, the
checksum S3 itself stores for an object uploaded without one, when ``awscrt`` is
installed (``ptestore[s3]``), else CRC-32 (zlib). ``"CRC32"`` and ``"CRC32C"`` may be
chosen (stores that lack CRC64NVME). The arithmetic lives in :mod:`ptestore.checksums`;
:func:`b64crc` and :func:`crc32_combine` are kept for their callers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..._log import get_logger
from ...checksums import ALGORITHMS, available, combine_all, crc, crc_combine, decode, encode
from ...errors import ConfigurationError

__all__ = [
    "WRITER_ALGORITHMS",
    "answer_checksum",
    "b64crc",
    "encode",
    "crc32_combine",
    "full_object",
    "param",
    "part_checksum",
    "published_checksum",
    "writer_algorithm",
]

log = get_logger("ptestore.writers.s3")

#: Algorithms S3 takes as a multipart object's FULL_OBJECT checksum.
WRITER_ALGORITHMS = ("CRC64NVME", "CRC32", "CRC32C")


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``."""
    return crc_combine("CRC32", crc1, crc2, len2)


def b64crc(value: int) -> str:
    """A CRC-32 as S3 writes it: base64 of its 4 big-endian bytes."""
    return encode("CRC32", value)


def writer_algorithm(url: str, value: object) -> str:
    """The writer's algorithm for the option value ``value`` (None: CRC64NVME where
    ``awscrt`` is installed, else CRC32); a value it cannot use is refused."""
    if value is None:
        return "CRC64NVME" if available("CRC64NVME") else "CRC32"
    if not isinstance(value, str) or value.upper() not in WRITER_ALGORITHMS:
        raise ConfigurationError(
            f"{url}: option checksum_algorithm = {value!r}: must be one of "
            f"{list(WRITER_ALGORITHMS)} (S3's FULL_OBJECT checksums)"
        )
    algorithm = value.upper()
    if not available(algorithm):
        raise ConfigurationError(
            f"{url}: option checksum_algorithm = {value!r} needs the awscrt package, which "
            "is not installed: pip install 'ptestore[s3]'"
        )
    return algorithm


def part_checksum(algorithm: str, data: Any) -> int:
    """The checksum of a part's bytes."""
    return crc(algorithm, data)


def answer_checksum(algorithm: str, answer: Mapping[str, Any]) -> int | None:
    """The ``Checksum<algorithm>`` of an S3 answer as an integer, None if absent."""
    text = answer.get(f"Checksum{algorithm}")
    if not isinstance(text, str) or "-" in text:
        return None
    value = decode(algorithm, text)
    return value if isinstance(value, int) else None


def full_object(algorithm: str, parts: Iterable[tuple[int | None, int]]) -> int | None:
    """The whole object's checksum from ``(checksum, length)`` of each part in order;
    None if a part's is unknown."""
    pieces = list(parts)
    if any(value is None for value, _ in pieces):
        return None
    return combine_all(algorithm, [(v, n) for v, n in pieces if v is not None])


def published_checksum(algorithm: str, value: int) -> str:
    """``PublishResult.checksum``: ``"<algorithm, lower case>:<base64>"``."""
    return f"{algorithm.lower()}:{encode(algorithm, value)}"


def param(algorithm: str, value: int) -> dict[str, str]:
    """The request parameter carrying ``value`` (``ChecksumCRC64NVME=...``)."""
    if algorithm not in ALGORITHMS:  # pragma: no cover - writer_algorithm checked it
        raise ValueError(algorithm)
    return {f"Checksum{algorithm}": encode(algorithm, value)}
