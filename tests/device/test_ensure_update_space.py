"""An entry made again after its source changed needs room for the new copy alone: the
stale entry's files (never served again) are removed under the key's exclusive lock
before the new copy is made (was: kept until the new one was published, so an update
needed room for two full copies, and failed with ENOSPC where ``cache prune --stale``
then freed the room). A process that opened or mapped the old file keeps it (an unlink
removes a name, not an open file). On a small tmpfs, with a real model."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.large import inflate
from support.smallfs import tmpfs

import ptestore
from ptestore.device import list_entries
from ptestore.errors import StorageError

#: 4 keys of 700 KiB: a model of about 2.8 MiB, on a 4 MiB file system (room for one).
KEY_BYTES = 700 << 10


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "4m") as mnt:
        yield mnt


def _model(tmp_path: Path) -> Path:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    src = tmp_path / "m.pte"
    inflate(fx.pte_path, src, KEY_BYTES)
    return src


def _update(src: Path) -> None:
    """A new version of the source: its modification time moved (its identity changes)."""
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_an_update_needs_room_for_one_copy_and_a_reader_keeps_the_old_file(
    tmp_path: Path, small_fs: Path
) -> None:
    src, cache = _model(tmp_path), small_fs / "cache"
    first = ptestore.ensure(src, cache_dir=cache, backends=["passthrough"])
    assert first.created and os.stat(first.pte).st_size > 2 << 20  # over half of it
    old = Path(first.pte).read_bytes()

    _update(src)  # room for one copy only: was ENOSPC, the stale entry still "ready"
    second = ptestore.ensure(src, cache_dir=cache, backends=["passthrough"])
    assert second.created and second.key == first.key and second.pte == first.pte
    assert Path(second.pte).read_bytes() == old  # (the same bytes: passthrough)
    assert [(e.key, e.state) for e in list_entries(cache)] == [(first.key, "ready")]

    # A process holding the file it was handed keeps it, mapped or open, while the entry
    # is made again: the name is removed, not the file. Its blocks are then still held,
    # so this update finds no room; the error says the stale entry was removed first.
    with open(second.pte, "rb") as held, mmap.mmap(held.fileno(), 0, prot=mmap.PROT_READ) as m:
        _update(src)
        with pytest.raises(StorageError) as err:
            ptestore.ensure(src, cache_dir=cache, backends=["passthrough"])
        assert "the source is unchanged; the entry's earlier version (stale: never served " in (
            str(err.value)
        )
        assert "was removed before it was made again, its room freed (the next call " in (
            str(err.value)
        )
        assert m[:] == old and os.pread(held.fileno(), len(old), 0) == old
        assert os.fstat(held.fileno()).st_nlink == 0  # no name is left to it
        assert not os.path.exists(second.pte)
    assert list_entries(cache) == []  # nothing of it (was an empty "incomplete" entry)
    third = ptestore.ensure(src, cache_dir=cache, backends=["passthrough"])  # room again
    assert third.created and _sha(third.pte) == hashlib.sha256(old).hexdigest()
