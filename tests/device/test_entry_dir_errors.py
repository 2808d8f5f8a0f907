"""An entry's directory that cannot be made (:meth:`CacheLayout.make_entry_dir`) is an
error of the house hierarchy, classified as the cache directory's own
(:func:`ptestore._oserror.local_error`), its message naming the path and the cause: it
let a bare ``OSError`` escape (``[Errno 28] No space left on device: '...'``) from every
caller but the copy's make, which called a refused access a ``StorageError`` (exit 1)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from support.fixtures import copy_pte
from support.privileges import unprivileged
from support.smallfs import tmpfs

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.device.keys import entry_key
from ptestore.device.layout import CacheLayout
from ptestore.errors import ConfigurationError, PermissionDenied, StorageError

SPEC = "support.counting_backend:Counting=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})


def _fill_inodes(where: Path) -> None:
    where.mkdir()
    for i in range(1000):
        try:
            (where / str(i)).touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return
    raise AssertionError("the file system's inodes did not run out")


def test_an_entry_directory_on_a_full_file_system_is_a_storage_error(tmp_path: Path) -> None:
    """In place, the entry's directory made once the file is specialized: a bare
    ``OSError`` was the whole message (``failed, nothing published: [Errno 28] No space
    left on device: '.../entries/KEY'``)."""
    src = copy_pte(tmp_path / "m.pte")
    with tmpfs(tmp_path / "mnt", "1m,nr_inodes=64") as mnt:  # few inodes
        cache = mnt / "cache"
        layout = CacheLayout(cache)
        layout.create()
        key = entry_key(str(src), None, [SPEC], DEVICE, True, True)
        Path(layout.lock(key).path).touch()  # the key's lock there: the directory fails
        _fill_inodes(mnt / "fill")
        with pytest.raises(StorageError) as info:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
        assert type(info.value) is StorageError and info.value.errno == errno.ENOSPC
        where = cache / "entries" / key
        assert str(info.value) == (
            f"{where}: cannot create the cache entry's directory: No space left on device"
        )
        assert not where.exists()


def test_a_refused_entry_directory_is_permission_denied_exit_2(tmp_path: Path) -> None:
    """``entries/`` not writable (a cache made read-only): the copy's make called it a
    ``StorageError`` (exit 1, ``cannot create: Permission denied``); it is the access
    refused that the cache directory's own is (exit 2)."""
    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    CacheLayout(cache).create()
    os.chmod(cache / "entries", 0o555)
    said = tmp_path / "said"

    def run() -> int:
        try:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
        except PermissionDenied as exc:
            said.write_text(str(exc))
            return 0
        except Exception as exc:
            said.write_text(f"{type(exc).__name__}: {exc}")
            return 1
        return 2

    try:
        assert unprivileged(run) == 0, said.read_text()
    finally:
        os.chmod(cache / "entries", 0o755)
    key = entry_key(str(src), None, [SPEC], DEVICE, False, True)
    where = cache / "entries" / key
    assert (
        said.read_text() == f"{where}: cannot create the cache entry's directory: Permission denied"
    )
    assert os.listdir(cache / "entries") == []


def test_an_entry_path_too_long_is_a_configuration_error(tmp_path: Path) -> None:
    """A cache directory whose ``entries/`` fits within PATH_MAX but not an entry's path
    under it: a ``StorageError`` (exit 1) that did not say the limit; a name too long is
    bad input (exit 2), the limit named, as for the cache directory itself."""
    root = tmp_path
    while len(os.fsencode(str(root / "entries"))) < 4096 - 20:
        root = root / ("d" * min(200, 4096 - 20 - len(str(root / "entries"))))
    layout = CacheLayout(root)
    layout.create()
    key = "0" * 32
    with pytest.raises(ConfigurationError) as info:
        layout.make_entry_dir(key)
    where = os.path.join(layout.entries, key)
    assert str(info.value).startswith(f"{where}: cannot stat the cache entry: File name too long")
    assert "over the system's limit of 4096 bytes per path (PATH_MAX" in str(info.value)
