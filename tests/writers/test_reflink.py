"""Copy-on-write clones on a loop-mounted XFS with reflink (FIEMAP and free space), and
the plain-copy fallback on the suite's own file system (ext4 here and in CI).

The XFS tests carry the ``reflink`` marker; they need root and xfsprogs and skip
without them, unless ``PTESTORE_REQUIRE_REFLINK=1`` (CI), which makes a skip a failure.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate
from support.xfs import XfsMount, shared_bytes, xfs_reflink_mount

import ptestore
from ptestore.cli.specialize import format_summary
from ptestore.errors import AlreadyExists, StorageError
from ptestore.format.reader import read_container
from ptestore.storage.loaders import BytesLoader, LocalFileLoader
from ptestore.writers.local import LocalFileWriter

MIB = 1 << 20
BLOCK = 4096
WEIGHT = 3 * MIB  # every key of the inflated program
KEY_BACKEND = "XnnpackBackend"


@pytest.fixture(scope="module")
def xfs() -> Iterator[XfsMount]:
    with xfs_reflink_mount("2G") as mount:
        yield mount


def _big(directory: Path, name: str = "big.pte") -> Path:
    path = directory / name
    if not path.exists():
        inflate(get_fixture("mlp_xnnpack").pte_path or "", path, WEIGHT)
    return path


def _keys(path: Path) -> list[str]:
    with LocalFileLoader(path) as loader:
        return [e.key for e in read_container(loader).container.named_data]


def _segments(path: Path) -> list[tuple[int, bytes]]:
    """``(absolute offset, bytes)`` of every segment, by index."""
    with LocalFileLoader(path) as loader:
        c = read_container(loader).container
        return [(c.absolute(s), bytes(loader.load(c.absolute(s), s.size))) for s in c.segments]


def _key_segment(path: Path, key: str) -> int:
    with LocalFileLoader(path) as loader:
        return next(
            e.segment_index for e in read_container(loader).container.named_data if e.key == key
        )


def _settled_free(xfs: XfsMount) -> int:
    """Free space once XFS has finished freeing unlinked files in the background
    (the spool, a replaced staging file): the same figure three times in a row."""
    seen = [xfs.free_bytes()]
    deadline = time.monotonic() + 20
    while (len(seen) < 3 or len(set(seen[-3:])) > 1) and time.monotonic() < deadline:
        time.sleep(0.25)
        seen.append(xfs.free_bytes())
    return seen[-1]


def _used_by(xfs: XfsMount, work: object) -> int:
    """New disk space the call ``work()`` takes, from the file system's free space."""
    before = _settled_free(xfs)
    assert callable(work)
    work()
    return before - _settled_free(xfs)


@pytest.mark.reflink
def test_passthrough_shares_nearly_every_extent(xfs: XfsMount) -> None:
    src = _big(xfs.path)
    dst = xfs.path / "pass.pte"
    reports: list[ptestore.SpecializationReport] = []
    used = _used_by(
        xfs,
        lambda: reports.append(
            ptestore.specialize(src, dst, backends=["passthrough"], provenance=False)
        ),
    )
    f = reports[0].files[0]
    size = src.stat().st_size
    assert dst.read_bytes() == src.read_bytes()
    assert f.status == "written" and f.clone_block_size == BLOCK and f.clone_padding == 0
    assert "MiB shared with the source (reflink)" in format_summary(reports[0])
    # One clone of the whole file but the metadata and the partial first block.
    assert f.bytes_cloned >= size - 2 * BLOCK - 16384
    assert shared_bytes(dst) >= size - 64 * 1024
    assert used <= MIB, f"passthrough took {used} bytes of new space"


@pytest.mark.reflink
def test_one_replaced_weight_costs_its_bytes(xfs: XfsMount) -> None:
    src = _big(xfs.path)
    key = _keys(src)[1]
    dst = xfs.path / "one.pte"
    backend = ReplaceKey(KEY_BACKEND, key)
    reports: list[ptestore.SpecializationReport] = []
    used = _used_by(xfs, lambda: reports.append(ptestore.specialize(src, dst, backends=[backend])))
    f = reports[0].files[0]
    assert f.segments_replaced == 1 and f.segments_moved == 0 and f.clone_padding == 0
    assert used <= WEIGHT + MIB, f"one {WEIGHT}-byte weight took {used} bytes of new space"
    index = _key_segment(src, key)
    for i, ((old_off, old), (new_off, new)) in enumerate(
        zip(_segments(src), _segments(dst), strict=True)
    ):
        assert new_off == old_off
        assert new == (backend.replacement if i == index else old)
    assert shared_bytes(dst) >= dst.stat().st_size - WEIGHT - 64 * 1024


@pytest.mark.reflink
def test_grown_weight_keeps_later_segments_congruent(xfs: XfsMount) -> None:
    src = _big(xfs.path)
    key = _keys(src)[0]
    dst = xfs.path / "grown.pte"
    backend = ReplaceKey(KEY_BACKEND, key, extra=100, alignment=64)
    reports: list[ptestore.SpecializationReport] = []
    used = _used_by(xfs, lambda: reports.append(ptestore.specialize(src, dst, backends=[backend])))
    f = reports[0].files[0]
    assert f.segments_moved >= 2
    index = _key_segment(src, key)
    before, after = _segments(src), _segments(dst)
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a[0] != b[0]]
    for i, ((old_off, old), (new_off, new)) in enumerate(zip(before, after, strict=True)):
        if i == index:
            assert new == backend.replacement and new_off % 64 == 0
        else:
            assert new == old
            assert (new_off - old_off) % BLOCK == 0, f"segment {i} is not block-congruent"
    assert 0 < f.clone_padding <= (BLOCK - 1) * len(moved)
    assert used <= len(backend.replacement) + MIB, f"a grown weight took {used} bytes"


@pytest.mark.reflink
def test_writer_clones_congruent_ranges_and_copies_others(xfs: XfsMount) -> None:
    data = os.urandom(MIB)
    src = xfs.path / "raw.bin"
    src.write_bytes(data)
    with LocalFileLoader(src) as loader, LocalFileWriter(xfs.path / "raw-out.bin") as w:
        assert w.clone_block_size(loader) == BLOCK
        w.copy_from(loader, 100, 500_000, 100 + 2 * BLOCK)  # congruent
        assert w.bytes_cloned == (100 + 500_000) // BLOCK * BLOCK - BLOCK
        w.copy_from(loader, 0, 10_000, 600_001)  # not congruent: copied
        assert w.bytes_cloned == (100 + 500_000) // BLOCK * BLOCK - BLOCK
        w.copy_from(BytesLoader(data), 0, 3, 0)  # no descriptor: no clone
        assert w.clone_block_size(BytesLoader(data)) is None
        w.publish()
    out = (xfs.path / "raw-out.bin").read_bytes()
    assert out[:3] == data[:3]
    assert out[100 + 2 * BLOCK : 100 + 2 * BLOCK + 500_000] == data[100 : 100 + 500_000]
    assert out[600_001:610_001] == data[:10_000]


@pytest.mark.reflink
def test_clone_failure_is_a_storage_error(xfs: XfsMount, monkeypatch: pytest.MonkeyPatch) -> None:
    src = xfs.path / "raw2.bin"
    src.write_bytes(os.urandom(64 * 1024))
    real_ioctl = fcntl.ioctl

    def failing(fd: int, request: int, arg: object = 0, *rest: object) -> object:
        if request == 0x4020940D:
            raise OSError(errno.EIO, "Input/output error")
        return real_ioctl(fd, request, arg, *rest)  # type: ignore[call-overload]

    with LocalFileLoader(src) as loader:
        w = LocalFileWriter(xfs.path / "raw2-out.bin")
        assert w.clone_block_size(loader) == BLOCK
        monkeypatch.setattr(fcntl, "ioctl", failing)
        with pytest.raises(StorageError) as info:
            w.copy_from(loader, 0, 32 * 1024, 0)
        assert str(info.value) == (
            f"{w.path}: cloning 32768 bytes from {src} at offset 0 to offset 0 failed: "
            f"Input/output error (staging file {w.staging_path} discarded)"
        )
        assert not os.path.exists(w.staging_path)


@pytest.mark.reflink
def test_other_file_system_is_copied(xfs: XfsMount, tmp_path: Path) -> None:
    """Source on the suite's file system, destination on XFS: EXDEV, so no clone."""
    src = _big(tmp_path)
    dst = xfs.path / "from-elsewhere.pte"
    report = ptestore.specialize(src, dst, backends=["passthrough"], provenance=False)
    assert report.files[0].clone_block_size is None and report.files[0].bytes_cloned == 0
    assert dst.read_bytes() == src.read_bytes()


def test_fallback_without_clones_gives_identical_bytes(tmp_path: Path) -> None:
    """On a file system without clones (ext4) the same runs copy, with the same bytes as
    a copy through memory://."""
    src = _big(tmp_path)
    dst = tmp_path / "pass.pte"
    f = ptestore.specialize(src, dst, backends=["passthrough"], provenance=False).files[0]
    assert dst.read_bytes() == src.read_bytes()
    assert f.clone_block_size is None and f.bytes_cloned == 0 and f.clone_padding == 0
    key = _keys(src)[0]
    grown = tmp_path / "grown.pte"
    ptestore.specialize(
        src, grown, backends=[ReplaceKey(KEY_BACKEND, key, 100, 64)], provenance=False
    )
    mem = f"memory://reflink-fallback/{os.getpid()}/grown.pte"
    ptestore.specialize(
        src, mem, backends=[ReplaceKey(KEY_BACKEND, key, 100, 64)], provenance=False
    )
    loader = ptestore.open_loader(mem)
    assert bytes(loader.load(0, loader.size())) == grown.read_bytes()


def test_nothing_replaced_in_place_writes_nothing(tmp_path: Path) -> None:
    src = _big(tmp_path)
    before = src.stat()
    report = ptestore.specialize(src, src, backends=["passthrough"])
    f = report.files[0]
    assert f.status == "unchanged" and f.published_size is None and f.bytes_copied == 0
    after = src.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pte"]  # no staging left
    assert format_summary(report).splitlines()[0] == (
        f"pte: {src}: unchanged (nothing replaced, nothing written)"
    )
    # Something replaced in place: written and published as before.
    key = _keys(src)[0]
    f = ptestore.specialize(src, src, backends=[ReplaceKey(KEY_BACKEND, key)]).files[0]
    assert f.status == "written" and src.stat().st_ino != before.st_ino


def test_nothing_replaced_in_place_with_create_still_refuses(tmp_path: Path) -> None:
    src = _big(tmp_path)
    with pytest.raises(AlreadyExists, match="already exists"):
        ptestore.specialize(src, src, backends=["passthrough"], mode="create")


class _Recording(LocalFileWriter):
    """Records every copy_from (source offset, size, destination offset)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.copies: list[tuple[int, int, int]] = []

    def _copy_from(self, loader: object, src_offset: int, size: int, dst_offset: int) -> None:
        self.copies.append((src_offset, size, dst_offset))
        super()._copy_from(loader, src_offset, size, dst_offset)  # type: ignore[arg-type]


def test_passthrough_is_one_copy_of_the_segment_data(tmp_path: Path) -> None:
    """Unchanged segments as far apart as in the source are one copy_from (padding
    between them included); a replaced one splits the run."""
    from ptestore.coordinator.pipeline import initialize_and_save_backend_data

    src = _big(tmp_path)
    with LocalFileLoader(src) as loader:
        c = read_container(loader).container
        first = min(c.absolute(s) for s in c.segments if s.size)
        w = _Recording(tmp_path / "out.pte")
        initialize_and_save_backend_data(loader, w, backends=["passthrough"], provenance=False)
        assert w.copies == [(first, src.stat().st_size - first, first)]
        key = _keys(src)[1]
        index = _key_segment(src, key)
        w = _Recording(tmp_path / "out2.pte")
        initialize_and_save_backend_data(
            loader, w, backends=[ReplaceKey(KEY_BACKEND, key)], provenance=False
        )
    assert len(w.copies) == 3  # before the replaced segment, the replacement, after it
    assert w.copies[1][1] == c.segments[index].size
    assert (tmp_path / "out.pte").read_bytes() == src.read_bytes()


_LIMITED = r"""
import resource, sys
from support.large import ReplaceKey
import ptestore
src, dst, key, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    ptestore.specialize(src, dst, backends=[ReplaceKey("XnnpackBackend", key)])
except ptestore.StorageError as exc:
    print(exc)
else:
    print("ok")
"""


@pytest.mark.reflink
def test_a_file_size_limit_counts_the_cloned_bytes(xfs: XfsMount) -> None:
    """Under a file-size limit of half the source, an output that clones all but one
    weight (its new bytes well under the limit, its size over it) is refused before its
    first byte: the limit bounds the file's size, clones included (they were taken off,
    and the copy met the limit part-way)."""
    import subprocess
    import sys

    src = _big(xfs.path)
    dst = xfs.path / "limited.pte"
    limit = src.stat().st_size // 2
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": f"{root}:{root / 'tests'}", "PATH": "/usr/bin:/bin"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # (no .pyc cut short under the limit)
    argv = [sys.executable, "-c", _LIMITED, str(src), str(dst), _keys(src)[1], str(limit)]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{dst}: an output of up to "), r.stdout
    assert f"past this process's file-size limit of {limit} bytes" in r.stdout
    assert not dst.exists() and not list(xfs.path.glob(".limited.pte.*"))
