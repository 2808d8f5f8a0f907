"""A packed-weight file downloaded whole (no chunk record) onto a disk that fills: a
``StorageError`` naming the ``.part`` and ENOSPC, never a raw ``OSError`` (a real
tmpfs; no runtime)."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import pytest
from support.smallfs import tmpfs

from ptestore.errors import PteStoreError, StorageError
from ptestore.fleet.packed_chunks import download_whole


def test_a_disk_that_fills_during_a_whole_download_is_a_storage_error(tmp_path: Path) -> None:
    src = tmp_path / "m.xnnpack-0123.xpwc"
    data = bytes(range(256)) * 4096  # 1 MiB
    src.write_bytes(data)
    field = {
        "url": str(src),
        "size": len(data),
        "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
    }
    with tmpfs(tmp_path / "small", "256k") as mnt:
        part = str(mnt / "xnnpack-download-0123.xpwc.part")
        with pytest.raises(StorageError) as info:
            download_whole(field, part, {}, None, 1 << 16)
    exc = info.value
    assert isinstance(exc, PteStoreError) and exc.errno == errno.ENOSPC
    assert str(exc) == (
        f"{part}: the download of {src} stopped: No space left on device (ENOSPC); "
        "a fetch run again downloads it again"
    )
