"""A real artifact whose provenance record claims other bytes than precede its trailer:
its ``content.size`` moved by ``extra`` (1 by default), everything else kept
self-consistent (the chunk size and count for the claimed size, their root, the
content's digest; no ``crcs``), and the trailer's own checksum right. Such a record
parses as a dict; only its size disagrees with the trailer's ``content_size``."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptestore.provenance import read_trailer, replace_trailer
from ptestore.provenance.chunks import ChunkDigests, chunk_size_for
from ptestore.storage.loaders import BytesLoader

__all__ = ["claiming", "content_of", "forge", "record_digests"]


def record_digests(data: bytes) -> list[bytes]:
    """The chunk digests ``data``'s own record names for its content."""
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    raw = base64.b64decode(trailer.record()["content"]["chunks"]["sha256"])
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


def content_of(data: bytes) -> bytes:
    """``data`` before its trailer."""
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    return data[: trailer.content_size]


def claiming(data: bytes, extra: int = 1, digests: Sequence[bytes] | None = None) -> bytes:
    """``data`` (a file with a version-3 record) with its record's ``content.size``
    ``extra`` bytes off; its chunk digests ``digests`` (default: the ones it records),
    cut or padded with the last one to the claimed size's count."""
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    record: dict[str, Any] = trailer.record()
    claimed = trailer.content_size + extra
    chunk = chunk_size_for(claimed)
    count = -(-claimed // chunk)
    have = list(record_digests(data) if digests is None else digests)
    have = (have + have[-1:] * count)[:count]
    chunks = ChunkDigests(chunk, claimed, tuple(have))
    record["content"].update(size=claimed, sha256=chunks.digest, chunks=chunks.to_dict())
    record["content"].pop("crcs", None)
    return replace_trailer(data, record)


def forge(path: Path, extra: int = 1, digests: Sequence[bytes] | None = None) -> Path:
    """Rewrite the file at ``path`` with :func:`claiming`; returns ``path``."""
    path.write_bytes(claiming(path.read_bytes(), extra, digests))
    return path
