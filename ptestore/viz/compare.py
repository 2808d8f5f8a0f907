"""The comparison of the layout map: :func:`compare_regions` (in
:mod:`ptestore.format.layoutdiff`, re-exported) on the regions of both files, the
segment digests that tell new bytes from the same (:func:`segment_hashes`, by URL) and
the shared extents that make a segment ``cloned`` (:func:`shared_ranges`, FIEMAP)."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..format.layoutdiff import compare_regions

__all__ = ["compare_regions", "segment_hashes", "shared_ranges"]


def shared_ranges(path: str) -> list[tuple[int, int]] | None:
    """Byte ranges of the local file ``path`` whose extents the file system flags as
    shared (FIEMAP_EXTENT_SHARED: reflinked); None where FIEMAP is unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import struct

    fs_ioc_fiemap = 0xC020660B
    count = 512
    header = struct.Struct("=QQIIII")
    extent = struct.Struct("=QQQQQIIII")
    out: list[tuple[int, int]] = []
    start = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        while True:
            buf = bytearray(header.pack(start, 2**64 - 1 - start, 1, 0, count, 0))
            buf += bytes(extent.size * count)
            try:
                fcntl.ioctl(fd, fs_ioc_fiemap, buf, True)
            except OSError:
                return None
            mapped = header.unpack_from(buf)[3]
            if mapped == 0:
                return out
            last = False
            for i in range(mapped):
                logical, _phys, length, _r1, _r2, flags, *_ = extent.unpack_from(
                    buf, header.size + i * extent.size
                )
                if flags & 0x2000:  # FIEMAP_EXTENT_SHARED
                    out.append((logical, logical + length))
                start = logical + length
                last = last or bool(flags & 0x1)  # FIEMAP_EXTENT_LAST
            if last:
                return out
    finally:
        os.close(fd)


def segment_hashes(
    url: str, desc: dict[str, Any], storage_options: dict[str, Any]
) -> dict[int, str]:
    """``segment index -> SHA-256`` of every segment of the file at ``url``."""
    from ..format.layoutdiff import segment_hashes as hashes
    from ..storage.loaders import open_loader

    loader = open_loader(url, **storage_options)
    try:
        return hashes(loader, desc)
    finally:
        loader.close()
