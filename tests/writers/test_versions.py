"""Version tokens (``ptestore.writers.versions``), the errors of compare-and-swap and
of a full disk: their messages, attributes and pickling; ``ensure_space`` on a small
tmpfs. The contract suite (``ptestore.testing.writer_races``) races the publishes."""

from __future__ import annotations

import errno
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.smallfs import tmpfs

from ptestore._oserror import local_error
from ptestore.errors import (
    ConfigurationError,
    PreconditionFailed,
    StorageError,
    WriterStateError,
)
from ptestore.writers import open_writer
from ptestore.writers._local_cas import lock_path
from ptestore.writers.base import Versioned, WriterState
from ptestore.writers.versions import current_version, read_versioned


def test_local_token_is_the_hash_of_the_bytes(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    assert current_version(f) is None
    assert read_versioned(f) == Versioned(b"", None)
    f.write_bytes(b"abc")
    token = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert read_versioned(f) == Versioned(b"abc", token)
    assert current_version(f) == current_version("file://" + str(f)) == token


def test_same_size_rewrite_changes_the_local_token(tmp_path: Path) -> None:
    """What a stat identity can miss (a reused inode, a coarse mtime): two same-size
    versions written in a row have different tokens."""
    f = tmp_path / "n"
    f.write_bytes(b"1")
    first = current_version(f)
    os.replace(_written(tmp_path / "tmp", b"2"), f)
    assert current_version(f) not in (None, first)


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_if_match_leaves_only_the_lock_file(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_bytes(b"1")
    w = open_writer(f)
    w.write(b"2", 0)
    w.publish("if-match", expected=current_version(f))
    assert sorted(os.listdir(tmp_path)) == [".c.json.ptestore.lock", "c.json"]
    assert lock_path(str(f)) == str(tmp_path / ".c.json.ptestore.lock")


def test_local_takes_no_options(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError, match=r"local files take no storage options, got \['key'\]"
    ):
        read_versioned(tmp_path / "x", key="k")


def test_a_store_without_tokens_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        current_version("dir://x/y")
    assert str(info.value) == (
        "dir://x/y: dir:// objects have no version token: compare-and-swap (publish mode "
        "'if-match') needs a local file, memory:// or s3://"
    )


def test_memory_token_is_the_content_s() -> None:
    """Whoever stores the object (a backdoor ``pipe_file`` here), its token is the hash
    of its bytes: equal bytes are the same version, other bytes another."""
    import hashlib

    from fsspec.implementations.memory import MemoryFileSystem

    url = "memory://versions/one"
    MemoryFileSystem().pipe_file("/versions/one", b"a")
    first = current_version(url)
    assert first == "sha256:" + hashlib.sha256(b"a").hexdigest()
    MemoryFileSystem().pipe_file("/versions/one", b"a")  # same bytes, another object
    assert current_version(url) == first
    MemoryFileSystem().pipe_file("/versions/one", b"b")
    assert current_version(url) not in (None, first)
    MemoryFileSystem().rm("/versions/one")
    assert current_version(url) is None


def test_precondition_failed_keeps_its_attributes_across_processes() -> None:
    exc = PreconditionFailed("m", url="s3://b/k", expected='"a"', found=None, refused_by="storage")
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.url, back.expected, back.found, back.refused_by) == (
        "m",
        "s3://b/k",
        '"a"',
        None,
        "storage",
    )


def test_storage_error_carries_the_errno() -> None:
    exc = local_error(OSError(errno.ENOSPC, "No space left on device"), "/d/f: write failed")
    assert exc.errno == errno.ENOSPC and str(exc) == "/d/f: write failed"
    back = pickle.loads(pickle.dumps(exc))
    assert back.errno == errno.ENOSPC and str(back) == "/d/f: write failed"
    assert StorageError("no cause").errno is None


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "tiny", "4m") as mnt:
        yield mnt


def test_ensure_space_refuses_before_writing(tiny_fs: Path) -> None:
    dest = tiny_fs / "model.pte"
    w = open_writer(dest)
    free = os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize
    w.ensure_space(free)  # what fits is fine
    with pytest.raises(StorageError) as info:
        w.ensure_space(10 << 20)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"{dest}: not enough free space for an output of {10 << 20} bytes: {10 << 20} bytes "
        f"needed, {free} bytes free on the file system of {tiny_fs}; nothing of it was "
        "written (No space left on device)"
    )
    assert w.state is WriterState.OPEN  # the caller decides
    assert os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize == free  # untouched
    w.discard()
    assert os.listdir(tiny_fs) == []


def test_ensure_space_counts_what_is_staged(tiny_fs: Path) -> None:
    w = open_writer(tiny_fs / "model.pte")
    w.write(b"x" * (3 << 20), 0)
    free = os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize
    w.ensure_space((3 << 20) + free)  # the staged 3 MiB are room already taken
    with pytest.raises(StorageError, match=r"bytes needed, \d+ bytes free") as info:
        w.ensure_space((3 << 20) + free + (1 << 20))
    assert info.value.errno == errno.ENOSPC
    w.discard()


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_large_write_is_refused_before_it_fills_the_disk(tiny_fs: Path) -> None:
    dest = tiny_fs / "model.pte"
    w = open_writer(dest)
    w.write(b"m" * 1000, 0)
    free = _free(tiny_fs)
    with pytest.raises(StorageError) as info:
        w.write(b"x" * (8 << 20), 1000)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"{dest}: not enough free space for a write of {8 << 20} bytes at offset 1000: "
        f"{8 << 20} bytes needed, {free} bytes free on the file system of {tiny_fs}; "
        "nothing of it was written (No space left on device)"
    )
    assert w.state is WriterState.DISCARDED
    assert os.listdir(tiny_fs) == []


def test_a_large_copy_is_refused_before_it_fills_the_disk(tmp_path: Path, tiny_fs: Path) -> None:
    """The staged path's bulk: a kernel copy from a local source (copy_file_range)."""
    from ptestore.storage.loaders import open_loader

    src = tmp_path / "src.pte"
    src.write_bytes(os.urandom(6 << 20))
    loader = open_loader(src)
    dest = tiny_fs / "model.pte"
    w = open_writer(dest)
    free = _free(tiny_fs)
    try:
        with pytest.raises(StorageError) as info:
            w.copy_from(loader, 0, 6 << 20, 0)
    finally:
        loader.close()
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"{dest}: not enough free space for a copy of {6 << 20} bytes from {loader.name} at "
        f"offset 0: {6 << 20} bytes needed, {free} bytes free on the file system of "
        f"{tiny_fs}; nothing of it was written (No space left on device)"
    )
    assert _free(tiny_fs) == free  # nothing was allocated first
    assert w.state is WriterState.DISCARDED
    assert os.listdir(tiny_fs) == []


def test_what_fits_is_written(tiny_fs: Path) -> None:
    w = open_writer(tiny_fs / "model.pte")
    w.write(b"x" * (2 << 20), 0)
    w.write(b"y" * (1 << 20), 1 << 20)  # rewrites staged bytes: needs no new room
    assert w.publish().size == 2 << 20


def test_ensure_space_on_a_closed_writer_is_refused(tmp_path: Path) -> None:
    w = open_writer(tmp_path / "m")
    w.discard()
    with pytest.raises(
        WriterStateError, match=r"cannot check free space: the writer was discarded"
    ):
        w.ensure_space(1)


def test_a_specialization_that_cannot_fit_fails_before_its_first_byte(
    tmp_path: Path, tiny_fs: Path
) -> None:
    """The staged path knows the output's size before it writes: a 6 MiB output for a
    4 MiB file system fails before the copies with the figures and ENOSPC, and leaves
    nothing (it used to copy until the disk was full). One 3 MiB value is replaced (its
    spool fits); the other 3 MiB are copied."""
    from support.fixtures import FIXTURES_DIR
    from support.large import ReplaceKey, inflate

    import ptestore

    src = tmp_path / "big.pte"
    inflate(FIXTURES_DIR / "mlp_xnnpack.pte", src, 3 << 20)  # two keys: 6 MiB of values
    key = sorted(k["key"] for k in ptestore.describe(src)["named_data"])[0]
    dest = tiny_fs / "out.pte"
    with pytest.raises(StorageError) as info:
        ptestore.specialize(
            src, dest, backends=[ReplaceKey("XnnpackBackend", key)], provenance=False
        )
    assert info.value.errno == errno.ENOSPC
    size = src.stat().st_size
    assert re.fullmatch(
        rf"{re.escape(str(dest))}: not enough free space for an output of {size} bytes: "
        rf"{size} bytes needed, \d+ bytes free on the file system of {re.escape(str(tiny_fs))}"
        r"; nothing of it was written \(No space left on device\)",
        str(info.value),
    ), str(info.value)
    assert os.listdir(tiny_fs) == []
