"""Read a container's metadata through a DataLoader with ranged reads only."""

from __future__ import annotations

from dataclasses import dataclass

from ..loaders import DataLoader
from .model import Container
from .parse import HEAD_BYTES, detect_kind, metadata_size, parse_ptd, parse_pte

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

    Two ranged reads at most: the first 64 bytes (headers), then the FlatBuffer.
    Segment data is never read.
    """
    size = loader.size()
    head = bytes(loader.load(0, min(HEAD_BYTES, size)))
    kind = detect_kind(head, size, loader.name)
    msize = metadata_size(head, size, loader.name)
    read = len(head)
    if msize <= len(head):
        meta = head[:msize]
    else:
        meta = bytes(loader.load(0, msize))
        read += msize
    parser = parse_pte if kind == "pte" else parse_ptd
    return ParsedFile(parser(meta, size, loader.name), meta, read)
