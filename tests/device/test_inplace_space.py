"""A full disk and an in-place run, on a small ext4 image mounted on a loop device: the
space the writes need inside a sparse copy (its holes) is reserved before the commit, so
a disk too full for it fails with the file as it was, the space given back; where it
cannot be reserved, the apply that meets the full disk says that the journal is
committed and what to do (never "unchanged"), and ``recover`` completes the file once
space is free."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.large import inflate

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import StorageError
from ptestore.journal import CHANGING, journal_path

FX = get_fixture("mlp_xnnpack")
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key
MiB = 1 << 20


class Fill(BackendInterface):
    """Replaces the key with as many bytes of 0x5a (the same size: written in place)."""

    name = "XnnpackBackend"
    version = "1.0"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        n = len(bytes(context.get_named_data_map().get_data(KEY)))
        output.write_named_data(KEY, BackendData(b"\x5a" * n))


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB ext4 image mounted on a loop device, unmounted afterwards."""
    img, mnt = tmp_path / "small.ext4", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(8 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def _sparse_model(tmp_path: Path, mnt: Path) -> tuple[Path, Path, bytes]:
    """A 4 MiB model on ``mnt`` whose replaced segment is a hole (a sparse copy), and a
    filler file leaving room for the journal (the 1 MiB replacement) but not for it and
    the hole's blocks too."""
    big = tmp_path / "big.pte"
    inflate(FX.pte_path, big, MiB)
    seg = next(
        s
        for s in ptestore.describe(big)["segments"]
        if s["index"]
        == next(d for d in ptestore.describe(big)["named_data"] if d["key"] == KEY)["segment_index"]
    )
    start = -(-seg["absolute_offset"] // 4096) * 4096
    end = (seg["absolute_offset"] + seg["size"]) // 4096 * 4096
    data = bytearray(big.read_bytes())
    data[start:end] = bytes(end - start)  # what a sparse copy of zeros holds
    src = mnt / "model.pte"
    src.write_bytes(bytes(data))
    fd = os.open(src, os.O_RDWR)
    try:
        os.truncate(fd, len(data))
        from ptestore._libc import fallocate

        assert fallocate(fd, 0x02 | 0x01, start, end - start)  # PUNCH_HOLE | KEEP_SIZE
        assert os.lseek(fd, start, os.SEEK_HOLE) == start
    finally:
        os.close(fd)
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, _free(mnt) - 3 * MiB // 2)
    assert MiB < _free(mnt) < 2 * MiB, _free(mnt)
    return src, filler, bytes(data)


def test_holes_the_writes_fill_are_reserved_before_the_commit(
    tmp_path: Path, small_ext4: Path
) -> None:
    src, filler, before = _sparse_model(tmp_path, small_ext4)
    free = os.statvfs(small_ext4).f_bfree
    for call in (
        lambda: ptestore.specialize(src, src, backends=[Fill()], in_place=True, provenance=False),
        lambda: ptestore.ensure(
            src, cache_dir=tmp_path / "c", backends=[Fill()], in_place=True, provenance=False
        ),
    ):
        with pytest.raises(StorageError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"{src}: ")
        assert (
            f"{src}: cannot allocate 1044480 bytes for the run's writes (0 past the end of the "
            "file, 1044480 in its holes): No space left on device; the file is unchanged"
        ) in msg
        assert src.read_bytes() == before  # not marked, not written
        assert sorted(os.listdir(small_ext4)) == ["filler", "lost+found", "model.pte"]
        assert os.statvfs(small_ext4).f_bfree >= free - 1  # the holes punched again
    filler.unlink()  # room now: the same run completes
    ptestore.specialize(src, src, backends=[Fill()], in_place=True, provenance=False)
    assert src.read_bytes().count(b"\x5a" * 4096) >= 255


def test_an_apply_that_meets_a_full_disk_says_its_journal_is_committed(
    tmp_path: Path, small_ext4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that cannot reserve (no ``fallocate``): the full disk is met while
    applying. The error says the file is marked, the journal committed and kept, and to
    free space then recover (``ensure`` no longer calls that "unchanged"); once space is
    free, ``recover`` completes the file."""
    import ptestore.journal as journal_module

    src, filler, before = _sparse_model(tmp_path, small_ext4)
    monkeypatch.setattr(journal_module, "_fallocate", lambda fd, mode, offset, size: False)
    journal = journal_path(str(src))
    with pytest.raises(StorageError) as err:
        ptestore.ensure(
            src, cache_dir=tmp_path / "c", backends=[Fill()], in_place=True, provenance=False
        )
    assert str(err.value) == (
        f"{src}: applying its committed in-place journal {journal} failed: No space left "
        "on device; the file is marked as being changed (PTJ~: the ExecuTorch runtime "
        "refuses it) until the journal is applied: free space on its file system, then "
        "run ptestore.recover() on it (or `ptestore inspect` it, or the next ensure) to "
        "complete the change"
    )
    assert "unchanged" not in str(err.value)
    assert src.read_bytes()[4:8] == CHANGING and Path(journal).exists()
    monkeypatch.undo()
    filler.unlink()
    assert ptestore.recover(src) == "rolled forward" and not Path(journal).exists()
    data = src.read_bytes()
    assert data[4:8] == before[4:8] and data != before
    want = tmp_path / "want.pte"
    shutil.copyfile(tmp_path / "big.pte", want)
    ptestore.specialize(want, want, backends=[Fill()], in_place=True, provenance=False)
    assert data == want.read_bytes()  # what an uninterrupted run leaves
