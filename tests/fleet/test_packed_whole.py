"""Delivering a packed-weight file, no runtime: downloaded whole (no chunk record) onto a
disk that fills, a ``StorageError`` naming the ``.part`` and ENOSPC, never a raw
``OSError`` (a real tmpfs); the fetched pair's ``.pte`` and ``.ptd`` told apart by their
roles, not by how their names end."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import pytest
from support.smallfs import tmpfs

from ptestore.errors import PteStoreError, StorageError
from ptestore.fleet.packed import fetch_packed
from ptestore.fleet.packed_chunks import download_whole

NONE = "the index lists no XNNPACK packed-weight file of this artifact for this CPU"


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


def test_the_pte_and_ptd_are_told_apart_by_role_not_by_suffix(tmp_path: Path) -> None:
    """The .ptd is the file beside the .pte where fetch puts it; a .pte whose own name
    ends in ``.ptd`` (alone, or with its .ptd at ``<name>.ptd``) is still the .pte."""
    pte = {"path": str(tmp_path / "weights.ptd"), "sha256": "a" * 64}
    ptd = {"path": str(tmp_path / "weights.ptd.ptd"), "sha256": "b" * 64}
    for files in ([pte], [ptd, pte], [pte, ptd]):
        got = fetch_packed("index.json", None, files, {}, indexed=True)
        assert got["path"] is None and got["reason"] == NONE
