"""The digest ptestore names bytes by (``sha256-tree:``, the root of the SHA-256 of each
4 MiB chunk), computed here from hashlib alone so a test does not check the library
against itself (the layout: ``ptestore/provenance/chunks.py``'s docstring)."""

from __future__ import annotations

import hashlib
import struct

CHUNK = 4 << 20
MAX_CHUNKS = 16384


def chunk_size(length: int) -> int:
    size = CHUNK
    while -(-length // size) > MAX_CHUNKS:
        size *= 2
    return size


def tree(data: bytes | bytearray | memoryview) -> str:
    """``sha256-tree:<hex>`` of ``data``."""
    view = memoryview(data).cast("B")
    length = view.nbytes
    size = chunk_size(length)
    h = hashlib.sha256(b"ptestore.chunks\x00" + struct.pack("<QQ", size, length))
    for i in range(0, length, size):
        h.update(hashlib.sha256(view[i : i + size]).digest())
    return "sha256-tree:" + h.hexdigest()


def whole(data: bytes | bytearray | memoryview) -> str:
    """``sha256:<hex>``: the whole-file SHA-256 (what records of versions 1 and 2 name)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
