"""A remake that fails: an entry whose source changed is freed before it is made again
(:func:`ptestore.device.entryfiles.free_stale_locked`: room for one copy, not two), then
the new specialization fails (a backend raises, the disk is full). Nothing of the entry
remains: it stayed as an empty directory that ``cache ls`` listed as an "incomplete"
entry until a prune; the next ``ensure`` makes it afresh."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import support.fleet_backend as fleet_backend
from support.fixtures import copy_pte
from support.smallfs import tmpfs

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.device import list_entries
from ptestore.errors import BackendError, StorageError

SPEC = "support.fleet_backend:Scaler=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})


def _changed(src: Path) -> None:
    """The source rewritten with one byte changed (a new identity: the entry is stale)."""
    data = bytearray(src.read_bytes())
    data[-1] ^= 1
    src.write_bytes(bytes(data))


def test_a_backend_failure_remaking_an_entry_leaves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    old = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    _changed(src)

    def exploded(self: object, *args: object) -> None:
        raise RuntimeError("exploded")

    with monkeypatch.context() as m:
        m.setattr(fleet_backend.Scaler, "initialize_backend_data", exploded)
        with pytest.raises(BackendError):
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert os.listdir(cache / "entries") == []
    assert list_entries(cache) == []
    again = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert (again.key, again.created) == (old.key, True)
    assert [(e.key, e.state) for e in list_entries(cache)] == [(old.key, "ready")]


def test_a_full_disk_remaking_an_entry_leaves_nothing_of_it(tmp_path: Path) -> None:
    """The new source is larger than the room the earlier entry gave back."""
    src = copy_pte(tmp_path / "m.pte")
    with tmpfs(tmp_path / "mnt", "256k") as mnt:
        cache = mnt / "cache"
        old = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
        filler = mnt / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        copy_pte(src, "mlp_xnnpack_align4096")  # 20 KiB: the old entry freed 12 KiB
        with pytest.raises(StorageError) as info:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
        assert info.value.errno == errno.ENOSPC
        assert os.listdir(cache / "entries") == []
        assert list_entries(cache) == []
        filler.unlink()
        again = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
        assert (again.key, again.created) == (old.key, True)
