"""The gc marker: a tiny part that proves a pending multipart upload is ptestore's.

S3 cannot return the metadata or tags of a pending upload, but ``ListParts`` returns
each part's checksum and ETag. Right after creating an upload the writer uploads part
:data:`MARKER_PART_NUMBER` with bytes derived from the key; ``ptestore gc`` aborts only
uploads holding it. The marker is never listed at Complete, so it is never part of an
object; data parts use ``1..MAX_DATA_PARTS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ...checksums import available
from .checksum import WRITER_ALGORITHMS, answer_checksum, part_checksum

__all__ = ["MARKER_PART_NUMBER", "MAX_DATA_PARTS", "is_marker_part", "marker_bytes"]

#: Part number of the gc marker (S3's largest part number).
MARKER_PART_NUMBER = 10000
#: Data parts of one object: 1..9999.
MAX_DATA_PARTS = MARKER_PART_NUMBER - 1


def marker_bytes(key: str) -> bytes:
    """Content of the gc marker part for ``key``: recognisable, never part of an object."""
    return f"ptestore multipart upload marker v1\n{key}\n".encode()


def is_marker_part(key: str, part: Mapping[str, object]) -> bool:
    """True if a ``ListParts`` entry is ptestore's marker part for ``key``.

    Compares the part's checksum (of the algorithm its upload was made with; servers
    that list none, as SeaweedFS, leave the ETag) and, as ETags are MD5s of the bytes
    unless SSE-KMS/SSE-C is used, its ETag.
    """
    if part.get("PartNumber") != MARKER_PART_NUMBER:
        return False
    body = marker_bytes(key)
    for algorithm in WRITER_ALGORITHMS:
        value = answer_checksum(algorithm, part)
        if value is not None and available(algorithm) and value == part_checksum(algorithm, body):
            return True
    etag = str(part.get("ETag", "")).strip('"')
    return bool(etag) and etag == hashlib.md5(body, usedforsecurity=False).hexdigest()
