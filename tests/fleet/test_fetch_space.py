"""A fetch the destination's file system has no room for: refused before the first
request (``check_space``), counting what a ``.part`` really holds (its allocated
blocks: a chunked ``.part`` is sparse) and a base's bytes wherever the file system
cannot clone them; and a disk that fills during the download is a ``StorageError``
naming the ``.part`` and ENOSPC, never a raw ``OSError`` (each on a real tmpfs)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from support.delta import program, trailer_size, version
from support.fixtures import get_fixture
from support.fleet_backend import specialized_pair
from support.smallfs import tmpfs

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.errors import PteStoreError, StorageError
from ptestore.fleet.download import check_space
from ptestore.provenance.chunks import CHUNK_SIZE

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two 20 MiB versions of an artifact (six 4 MiB chunks) differing in one chunk."""
    d = tmp_path_factory.mktemp("versions")
    src = program(d)
    return version(src, d / "a" / "m.pte", "1"), version(src, d / "b" / "m.pte", "2")


def test_a_fetch_the_disk_has_no_room_for_fails_before_any_download(tmp_path: Path) -> None:
    """The pair's sizes against the destination file system's free blocks, before the
    first request: ENOSPC naming the files, the bytes needed and free, the directory;
    no ``.part`` left behind (a real 4 KiB tmpfs: one page)."""
    pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    total = pte.stat().st_size + ptd.stat().st_size
    with tmpfs(tmp_path / "small", "4k") as mnt:
        dest = mnt / "dev" / "m.pte"
        with pytest.raises(StorageError) as info:
            ptestore.fetch(pte, dest)
        assert info.value.errno == errno.ENOSPC
        message = str(info.value)
        assert f"{dest}, {dest.with_suffix('.ptd')}: not enough free space to fetch" in message
        assert f"{total} bytes needed, 4096 free in {mnt}" in message
        assert "nothing was downloaded" in message
        assert _leftovers(mnt) == []  # not even the directory: nothing was started
        assert main(["fetch", str(pte), str(dest)]) == 1


def test_the_space_check_counts_what_a_part_holds_and_a_base_that_cannot_clone(
    tmp_path: Path,
) -> None:
    """A resumed ``.part`` needs only the rest, counted by its allocated blocks (a sparse
    ``.part`` of the full size holds nothing); a base on a file system that cannot clone
    it (tmpfs) is copied chunk by chunk, so it frees no space: still refused."""
    with tmpfs(tmp_path / "small", "64k") as mnt:
        dest = str(mnt / "m.pte")
        (mnt / "m.pte.part").write_bytes(b"\1" * 50_000)  # 13 of the 16 pages
        check_space([({"size": 60_000}, dest)])  # 10,000 more: room for it
        with pytest.raises(StorageError, match="60000 bytes needed"):
            check_space([({"size": 60_000}, str(mnt / "other.pte"))])
        # A chunked download's .part: its final size at once, sparse past what it holds.
        sparse = mnt / "sparse.pte.part"
        with open(sparse, "wb") as f:
            f.write(b"\1" * 4096)
            f.truncate(60_000)
        assert sparse.stat().st_size == 60_000
        with pytest.raises(StorageError, match="55904 bytes needed"):
            check_space([({"size": 60_000}, str(mnt / "sparse.pte"))])
        (mnt / "base.pte").write_bytes(b"\0" * 1000)
        with pytest.raises(StorageError, match="60000 bytes needed"):
            check_space([({"size": 60_000}, str(mnt / "other.pte"))], [str(mnt / "base.pte")])
        elsewhere = tmp_path / "base.pte"
        elsewhere.write_bytes(b"\0")
        with pytest.raises(StorageError, match="not enough free space"):
            check_space([({"size": 60_000}, str(mnt / "other.pte"))], [str(elsewhere)])
        check_space([({}, str(mnt / "unknown.pte"))])  # no size named: nothing to check


def test_a_base_on_a_file_system_that_clones_counts_only_what_it_cannot_give(
    tmp_path: Path,
) -> None:
    """Where the base's file system shares extents (XFS with reflink), chunks cloned from
    it take no new space, the bytes it cannot give do: a file larger than the base by
    more than the free space is refused up front (the check was skipped there)."""
    from support.xfs import xfs_reflink_mount

    with xfs_reflink_mount("300M") as xfs:
        free = xfs.free_bytes()
        base = xfs.path / "base.pte"
        with open(base, "wb") as f:  # sparse: its size, no blocks
            f.truncate(2 * free)
        new = str(xfs.path / "new.pte")
        check_space([({"size": 2 * free + free // 2}, new)], [str(base)])
        with pytest.raises(StorageError, match=f"{2 * free} bytes needed, {free} free"):
            check_space([({"size": 4 * free}, new)], [str(base)])
        with pytest.raises(StorageError, match="not enough free space"):
            check_space([({"size": 2 * free}, new)])


def test_what_the_store_sends_after_the_clones_must_fit(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """XFS with reflink: the base's chunks are cloned (free), the chunk that differs is
    downloaded and takes space. With less free than that chunk, the fetch is refused
    before the store is asked for it (ENOSPC naming the destination, the bytes to
    download and free), not a write that fails halfway; with room, it completes."""
    from support.xfs import xfs_reflink_mount

    a, b = versions
    with xfs_reflink_mount("300M") as xfs:
        base = xfs.path / "old.pte"
        shutil.copyfile(a, base)
        dest = xfs.path / "m.pte"
        filler = xfs.path / "filler"
        with open(filler, "wb") as f:
            f.write(bytes(xfs.free_bytes() - (2 << 20)))
            os.fsync(f.fileno())
        free = xfs.free_bytes()
        with pytest.raises(StorageError) as info:
            ptestore.fetch(b, dest, base=base)
        assert info.value.errno == errno.ENOSPC
        needed = CHUNK_SIZE + trailer_size(b)
        message = str(info.value)
        assert message.startswith(
            f"{dest}: not enough free space to fetch: {needed} bytes to download, "
        ), message
        assert f"free in {xfs.path} (No space left on device); " in message
        assert message.endswith(" cloned from the bases take none; nothing more was downloaded")
        assert xfs.free_bytes() >= free - (1 << 20)  # the clones took (almost) nothing
        filler.unlink()
        got = ptestore.fetch(b, dest, base=base).files[0]
        assert dest.read_bytes() == b.read_bytes() and got["received"] == CHUNK_SIZE + 4096


def test_a_base_without_clones_on_a_full_disk_is_refused_up_front(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """``--base`` on a tmpfs (no reflink) with room for the base but not for the new
    version: refused before any request, nothing left but the base."""
    a, b = versions
    with tmpfs(tmp_path / "small", "32m") as mnt:
        base = mnt / "old.pte"
        shutil.copyfile(a, base)
        with pytest.raises(StorageError) as info:
            ptestore.fetch(b, mnt / "m.pte", base=base)
        assert info.value.errno == errno.ENOSPC
        assert f"{b.stat().st_size} bytes needed" in str(info.value)
        assert "nothing was downloaded" in str(info.value)
        assert _leftovers(mnt) == ["old.pte"]


@pytest.mark.parametrize("base", [False, True])
def test_a_disk_that_fills_during_the_download_is_a_storage_error(
    versions: tuple[Path, Path], tmp_path: Path, base: bool
) -> None:
    """The check passed, then something else takes the space: the write that fails is a
    ``StorageError`` ENOSPC naming the ``.part`` (never a raw ``OSError``), the verified
    chunks kept for the next attempt, which completes once there is room."""
    a, b = versions
    with tmpfs(tmp_path / "small", "48m") as mnt:
        kw = {}
        if base:
            shutil.copyfile(a, mnt / "old.pte")
            kw["base"] = mnt / "old.pte"
        dest = mnt / "m.pte"
        filler = mnt / "filler"

        def progress(url: str, done: int, total: int) -> None:
            if not filler.exists():  # the disk fills after the first chunk is in place
                with open(filler, "wb") as f:
                    try:
                        while True:
                            f.write(bytes(1 << 20))
                    except OSError:
                        pass

        with pytest.raises(StorageError) as info:
            ptestore.fetch(b, dest, progress=progress, chunk_size=1 << 20, **kw)
        exc = info.value
        assert isinstance(exc, PteStoreError) and exc.errno == errno.ENOSPC
        # Whichever write hit the full disk first (a chunk copied in a thread, or the
        # count written after it): the message names the destination, then the file.
        stopped = f"{dest}: the download of {b} stopped: No space left on device (ENOSPC, in "
        tail = "); a fetch run again resumes it"
        assert str(exc) in (f"{stopped}{dest}.part{tail}", f"{stopped}{dest}.part.json{tail}")
        assert not dest.exists() and os.path.exists(f"{dest}.part")
        filler.unlink()
        ptestore.fetch(b, dest, **kw)
        assert dest.read_bytes() == b.read_bytes()


def test_ensure_index_on_a_full_disk_serves_the_entry_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ensure INDEX`` updating an entry on a tmpfs without room for the new version:
    its own ``.pte`` is a base there but cannot be cloned, so the fetch is refused up
    front (a ``StorageError``), and the entry it has is served offline, not a raw
    ``OSError`` halfway through."""
    from support.delta import big_job
    from support.fleetrun import fleet_run

    out = tmp_path / "out"
    device = DeviceProfile("a", {"soc": "x"})
    index = fleet_run(big_job(tmp_path, str(out), "1"), capsys)
    with tmpfs(tmp_path / "small", "40m") as mnt:
        first = ptestore.ensure(index, cache_dir=mnt / "cache", model="m", device=device)
        index = fleet_run(big_job(tmp_path, str(out), "2"), capsys)
        st = os.statvfs(mnt)
        with open(mnt / "filler", "wb") as f:
            f.write(bytes(st.f_bavail * st.f_frsize - (8 << 20)))
        got = ptestore.ensure(index, cache_dir=mnt / "cache", model="m", device=device)
        assert got.pte == first.pte and got.choice is not None
        assert "not enough free space to fetch" in got.choice["offline"]
        assert "nothing was downloaded" in got.choice["offline"]


def test_a_clone_the_kernel_refuses_oddly_is_a_storage_error(
    versions: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reflink clone of a base's range failing with an errno that does not mean "copy
    instead" (EIO, ENOSPC from the ioctl) is a ``StorageError`` naming the ``.part`` and
    the errno, never a raw ``OSError``."""
    from ptestore.writers import _clone

    def fails(*args: object) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(_clone, "probe_clone_block_size", lambda *args: 4096)
    monkeypatch.setattr(_clone, "clone_range", fails)
    a, b = versions
    dest = tmp_path / "m.pte"
    with pytest.raises(StorageError) as info:
        ptestore.fetch(b, dest, base=a)
    assert info.value.errno == errno.EIO
    assert str(info.value) == (
        f"{dest}: the download of {b} stopped: Input/output error (EIO, in {dest}.part); a "
        "fetch run again resumes it"
    )


def test_a_full_disk_at_the_resume_marker_names_the_destination_and_the_marker(
    versions: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC writing ``DEST.part.json`` (the verified-chunk count) says what a full
    disk at the ``.part`` says, the destination first, then the file that failed."""
    from ptestore.fleet import chunked
    from ptestore.storage import atomic

    real = atomic.put_bytes

    def full(path: str, data: bytes) -> None:
        if path.endswith(".part.json") and '"verified": 0' not in data.decode():
            why = os.strerror(errno.ENOSPC)
            raise StorageError(f"{path}: cannot write: {why}", errno=errno.ENOSPC)
        real(path, data)

    monkeypatch.setattr(atomic, "put_bytes", full)
    monkeypatch.setattr(chunked, "put_bytes", full)  # the name chunked imported
    a, b = versions
    dest = tmp_path / "m.pte"
    with pytest.raises(StorageError) as info:
        ptestore.fetch(b, dest, base=a)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"{dest}: the download of {b} stopped: No space left on device (ENOSPC, in "
        f"{dest}.part.json); a fetch run again resumes it"
    )
