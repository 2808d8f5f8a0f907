"""Read a container's metadata through a DataLoader with ranged reads only."""

from __future__ import annotations

from .._dataclass import dataclass
from ..storage.types import DataLoader
from .header import HEAD_BYTES, FileHead
from .model import Container
from .parsing import parse_metadata

__all__ = ["ParsedFile", "read_container"]


@dataclass(frozen=True)
class ParsedFile:
    """A parsed container plus the metadata bytes it was parsed from."""

    container: Container
    metadata: bytes
    #: Bytes read from the loader to parse (header probe + metadata).
    bytes_read: int


def read_container(loader: DataLoader) -> ParsedFile:
    """Parse the .pte or .ptd behind ``loader``, reading only its metadata region.

    Two ranged reads at most: the first 64 bytes (headers, decoded once), then the
    FlatBuffer. Segment data is never read.
    """
    size = loader.size()
    head_bytes = bytes(loader.load(0, min(HEAD_BYTES, size)))
    head = FileHead.from_bytes(head_bytes, size, loader.name)
    read = len(head_bytes)
    if head.metadata_size <= len(head_bytes):
        meta = head_bytes[: head.metadata_size]
    else:
        meta = bytes(loader.load(0, head.metadata_size))
        read += head.metadata_size
    return ParsedFile(parse_metadata(meta, head), meta, read)
