"""LocalFileWriter specifics: staging, modes, failing syscalls, replace-the-source, gc."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import ConfigurationError, ObjectNotFound, PublishUncertain, StorageError
from ptestore.gc import collect_local, collect_stale
from ptestore.storage.loaders import LocalFileLoader
from ptestore.writers import LocalFileWriter, WriterState, open_writer
from ptestore.writers.local import TEMP_NAME_RE


def staging_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if TEMP_NAME_RE.match(n))


def test_staging_is_hidden_private_and_beside_the_destination(tmp_path: Path) -> None:
    w = LocalFileWriter(tmp_path / "model.pte")
    assert os.path.dirname(w.staging_path) == str(tmp_path)
    name = os.path.basename(w.staging_path)
    assert name.startswith(".model.pte.ptestore-")
    assert TEMP_NAME_RE.match(name)
    assert stat.S_IMODE(os.stat(w.staging_path).st_mode) == 0o600
    w.discard()
    assert staging_files(tmp_path) == []


def test_new_file_gets_default_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        w = LocalFileWriter(tmp_path / "m.pte")
        w.write(b"x", 0)
        w.publish()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "m.pte").st_mode) == 0o640


def test_replacement_keeps_the_existing_mode(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"old")
    os.chmod(dest, 0o604)
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    w.publish()
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o604
    assert dest.read_bytes() == b"new"


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(
        ObjectNotFound, match=r"m.pte: destination directory .*/nope does not exist"
    ):
        LocalFileWriter(tmp_path / "nope" / "m.pte")
    w = LocalFileWriter(tmp_path / "a" / "b" / "m.pte", auto_mkdir=True)
    w.write(b"x", 0)
    w.publish()
    assert (tmp_path / "a" / "b" / "m.pte").read_bytes() == b"x"


def test_destination_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"is a directory, not a file name"):
        LocalFileWriter(tmp_path)


def test_unknown_option(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"options \['endpoint_url'\] do not apply to local files "
        r"\(accepted: \['auto_mkdir', 'durable'\]\)",
    ):
        open_writer(tmp_path / "m.pte", endpoint_url="http://x")


@pytest.mark.parametrize(
    ("err", "text"), [(errno.ENOSPC, "No space left on device"), (errno.EIO, "Input/output error")]
)
def test_write_failure_midway_discards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, text: str
) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"previous")
    real = os.pwrite
    calls = [0]

    def failing(fd: int, data: Any, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(err, os.strerror(err))
        return real(fd, data, offset)

    w = LocalFileWriter(dest)
    monkeypatch.setattr(os, "pwrite", failing)
    w.write(b"a" * 100, 0)
    w.write(b"b" * 100, 100)
    with pytest.raises(
        StorageError,
        match=rf"m.pte: write of 100 bytes at offset 200 failed: {text} "
        r"\(staging file .*\.tmp discarded\)",
    ):
        w.write(b"c" * 100, 200)
    assert w.state is WriterState.DISCARDED
    assert staging_files(tmp_path) == []
    assert dest.read_bytes() == b"previous"


def test_copy_from_uses_copy_file_range_and_handles_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(100_000))
    loader = LocalFileLoader(src)
    real = os.copy_file_range
    seen: list[int] = []

    def spy(*args: Any) -> int:
        seen.append(args[2])
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", spy)
    w = LocalFileWriter(tmp_path / "out.bin")
    w.copy_from(loader, 10, 50_000, 0)
    w.publish()
    assert seen
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()[10:50_010]

    def enospc(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", enospc)
    w = LocalFileWriter(tmp_path / "out2.bin")
    with pytest.raises(
        StorageError,
        match=r"out2.bin: copying 5 bytes from .*src.bin at offset 0 to offset 0 failed: "
        r"No space left on device",
    ):
        w.copy_from(loader, 0, 5, 0)
    assert staging_files(tmp_path) == []


@pytest.mark.parametrize("err", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP])
def test_copy_from_falls_back_when_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(30_000))

    def unsupported(*args: Any) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    with LocalFileWriter(tmp_path / "out.bin") as w:
        w.copy_from(LocalFileLoader(src), 0, 30_000, 7)
        w.publish()
    assert (tmp_path / "out.bin").read_bytes() == bytes(7) + src.read_bytes()


def test_fsync_failure_is_fatal_and_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"previous")
    calls = [0]

    def failing(fd: int) -> None:
        calls[0] += 1
        raise OSError(errno.EIO, "Input/output error")

    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(
        StorageError,
        match=r"m.pte: fsync of the staging file failed: Input/output error; nothing was "
        r"published \(fsync is never retried\)",
    ):
        w.publish()
    assert calls[0] == 1
    assert dest.read_bytes() == b"previous"
    assert staging_files(tmp_path) == []


def test_directory_fsync_failure_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def failing(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"new", 0)
    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(
        PublishUncertain,
        match=r"m.pte: published, but fsync of directory .* failed: Input/output error; the "
        r"new file is in place but may not survive a crash \(not retried\)",
    ):
        w.publish()
    assert (tmp_path / "m.pte").read_bytes() == b"new"
    assert staging_files(tmp_path) == []


def test_not_durable_skips_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(fd: int) -> None:
        raise AssertionError("fsync called")

    w = LocalFileWriter(tmp_path / "m.pte", durable=False)
    w.write(b"x", 0)
    monkeypatch.setattr(os, "fsync", forbidden)
    w.publish()


def test_create_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"x", 0)
    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(
        StorageError,
        match=r"the filesystem does not support hard links, which publish\(mode='create'\) "
        r"needs: Operation not permitted",
    ):
        w.publish("create")
    assert staging_files(tmp_path) == []
    assert not (tmp_path / "m.pte").exists()


def test_replacing_the_source_while_it_is_read(tmp_path: Path) -> None:
    dest = tmp_path / "model.pte"
    old = os.urandom(200_000)
    dest.write_bytes(old)
    loader = LocalFileLoader(dest)
    with open_writer(dest) as w:
        w.copy_from(loader, 0, 100_000, 0)
        w.write(b"HEADER", 0)
        w.copy_from(loader, 150_000, 50_000, 100_000)
        w.publish()
        # the reader still sees the old inode, completely
        assert loader.load(0, 200_000) == old
    assert dest.read_bytes() == b"HEADER" + old[6:100_000] + old[150_000:]
    loader.close()


def test_gc_removes_only_stale_unlocked_staging_files(tmp_path: Path) -> None:
    live = LocalFileWriter(tmp_path / "live.pte")
    crashed = LocalFileWriter(tmp_path / "crashed.pte")
    crashed.write(b"partial", 0)
    assert crashed._finalizer is not None
    crashed._finalizer.detach()  # simulate SIGKILL: no cleanup, lock released
    crashed._st.close_fd()
    sub = tmp_path / "sub"
    sub.mkdir()
    other = LocalFileWriter(sub / "x.pte")
    assert other._finalizer is not None
    other._finalizer.detach()
    other._st.close_fd()
    lookalike = tmp_path / ".notes.ptestore-zzzz.tmp"  # not our pattern
    lookalike.write_bytes(b"keep")
    (tmp_path / "user.tmp").write_bytes(b"keep")

    assert [e.action for e in collect_local(tmp_path, older_than=1e9)] == [
        "skipped: younger than 1e+09s"
    ] * 3
    dry = collect_stale(str(tmp_path), older_than=0, dry_run=True)
    assert sorted(e.action for e in dry) == [
        "skipped: in use by a live writer",
        "would remove",
        "would remove",
    ]
    only = collect_local(tmp_path / "crashed.pte", older_than=0)
    assert [(os.path.basename(e.location), e.action) for e in only] == [
        (os.path.basename(crashed.staging_path), "removed")
    ]
    rest = collect_local(tmp_path, older_than=0)
    assert sorted(e.action for e in rest) == ["removed", "skipped: in use by a live writer"]
    assert staging_files(tmp_path) == [os.path.basename(live.staging_path)]
    assert staging_files(sub) == []
    assert lookalike.exists()
    assert (tmp_path / "user.tmp").exists()
    live.write(b"still fine", 0)
    live.publish()
    assert (tmp_path / "live.pte").read_bytes() == b"still fine"


def test_gc_bad_targets(tmp_path: Path) -> None:
    msg = r"older_than must be a finite number of seconds >= 0, got -1"
    with pytest.raises(ConfigurationError, match=msg):
        collect_stale(tmp_path, older_than=-1)
    with pytest.raises(
        ConfigurationError,
        match=r"gc supports local paths and s3:// prefixes, "
        r"not memory://",
    ):
        collect_stale("memory://x")
    with pytest.raises(ConfigurationError, match=r"no such directory or file"):
        collect_stale(tmp_path / "missing" / "x.pte")


def test_interpreter_exit_removes_staging(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from ptestore.writers import open_writer
        w = open_writer({str(tmp_path / "m.pte")!r})
        w.write(b"never published", 0)
        """
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", script], check=True, timeout=60)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ writeback as it goes
def _record_writebacks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    import ptestore._libc

    calls: list[tuple[int, int]] = []
    real = ptestore._libc.start_writeback

    def record(fd: int, offset: int, size: int) -> bool:
        calls.append((offset, size))
        return real(fd, offset, size)

    monkeypatch.setattr(ptestore._libc, "start_writeback", record)
    return calls


@pytest.mark.parametrize("how", ["copy_from", "write"])
def test_a_durable_writer_starts_the_writeback_of_each_piece_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Every WRITEBACK_PIECE written in a row is handed to the disk as it goes (the fsync
    at publish then has little left); writes that are not in a row start over; a writer
    that is not durable leaves it all to the kernel."""
    from ptestore.writers.local import WRITEBACK_PIECE as PIECE

    calls = _record_writebacks(monkeypatch)
    data = os.urandom(1 << 20) * (2 * PIECE // (1 << 20) + 3)  # two pieces and 3 MiB
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    w = LocalFileWriter(tmp_path / "out.bin")
    w.write(b"head", 0)  # small and not in a row with what follows: left to fsync
    if how == "copy_from":
        with LocalFileLoader(src) as loader:
            w.copy_from(loader, 0, len(data), 4096)
    else:
        for at in range(0, len(data), 4 << 20):  # 4 MiB writes in a row
            w.write(data[at : at + (4 << 20)], 4096 + at)
    assert calls == [(4096, PIECE), (4096 + PIECE, PIECE)]
    w.publish()
    assert (tmp_path / "out.bin").read_bytes()[4096:] == data

    calls.clear()
    w = LocalFileWriter(tmp_path / "fast.bin", durable=False)
    w.write(data, 0)
    w.publish()
    assert calls == []


def test_start_writeback_is_a_hint_that_never_fails(tmp_path: Path) -> None:
    from ptestore._libc import fallocate, start_writeback

    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"x" * (1 << 20), 0)
        assert start_writeback(fd, 0, 1 << 20) is (sys.platform == "linux")
        assert start_writeback(fd, 0, 0) is True
        if sys.platform == "linux":  # reserve and release without changing the size
            assert fallocate(fd, 0x01, 1 << 20, 1 << 20) is True  # KEEP_SIZE
            assert os.fstat(fd).st_size == 1 << 20
            assert fallocate(fd, 0x01 | 0x02, 0, 4096) is True  # PUNCH_HOLE
            assert os.pread(fd, 4096, 0) == bytes(4096)
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert start_writeback(r, 0, 4096) is False  # a pipe (ESPIPE): no error
    finally:
        os.close(r)
        os.close(w)
    if sys.platform == "linux":
        with pytest.raises(OSError) as info:  # a real failure is not "unsupported"
            fallocate(-1, 0, 0, 4096)
        assert info.value.errno == errno.EBADF


def test_a_discard_removes_the_directories_it_made_while_empty(tmp_path: Path) -> None:
    """``auto_mkdir``: a discarded (or failed) write leaves no empty folder behind; only
    the directories this writer made, and only while nothing else is in them."""
    (tmp_path / "kept").mkdir()  # there before: never removed
    w = LocalFileWriter(tmp_path / "kept" / "a" / "b" / "m.pte", auto_mkdir=True)
    w.write(b"x", 0)
    w.discard()
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []
    # Two writers share a directory the first made: its discard leaves it to the second.
    first = LocalFileWriter(tmp_path / "kept" / "d" / "1.pte", auto_mkdir=True)
    second = LocalFileWriter(tmp_path / "kept" / "d" / "2.pte", auto_mkdir=True)
    first.discard()
    assert os.path.isdir(tmp_path / "kept" / "d")
    second.write(b"y", 0)
    second.publish("create")
    second.discard()
    assert (tmp_path / "kept" / "d" / "2.pte").read_bytes() == b"y"
    # An exception in the with block (the writer abandoned) removes them too.
    with (
        pytest.raises(RuntimeError),
        LocalFileWriter(tmp_path / "kept" / "e" / "m.pte", auto_mkdir=True) as w,
    ):
        raise RuntimeError("a backend failed")
    assert sorted(os.listdir(tmp_path / "kept")) == ["d"]


def test_a_directory_removed_under_a_new_writer_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's discard may remove a directory this one found made: it makes
    it again instead of failing (at most a few times)."""
    from ptestore.writers import local

    real = local.make_parents
    calls: list[str] = []

    def racing(directory: str) -> list[str]:
        made = real(directory)
        if not calls:  # the other writer's discard, right after this one's mkdir
            os.rmdir(directory)
        calls.append(directory)
        return made

    monkeypatch.setattr(local, "make_parents", racing)
    w = LocalFileWriter(tmp_path / "d" / "m.pte", auto_mkdir=True)
    assert len(calls) == 2 and os.path.isdir(tmp_path / "d")
    w.discard()
    assert os.listdir(tmp_path) == []


def _owner(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
@pytest.mark.parametrize("mode", ["overwrite", "if-match"])
def test_root_replacing_a_users_file_keeps_its_owner(tmp_path: Path, mode: str) -> None:
    """As root, the new file takes the replaced file's owner and group with its mode: a
    user's 0640 file stays the user's (root:root 0640 would lock its owner out)."""
    from ptestore.writers.versions import current_version

    dest = tmp_path / "m.pte"
    dest.write_bytes(b"old")
    os.chown(dest, 1000, 1001)
    dest.chmod(0o640)
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    if mode == "if-match":
        w.publish("if-match", expected=current_version(str(dest)))
    else:
        w.publish()
    assert dest.read_bytes() == b"new"
    assert _owner(dest) == (1000, 1001, 0o640)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
@pytest.mark.parametrize(
    ("uid", "bits"),
    [(1000, 0o6755), (0, 0o4755), (0, 0o1644)],
    ids=["user-6755", "root-4755", "root-1644"],
)
def test_a_replacement_never_carries_setuid_setgid_or_sticky(
    tmp_path: Path, uid: int, bits: int
) -> None:
    """The permission bits only: a model is not a program (and a root-owned new file
    must not become setuid because the file it replaced was)."""
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"old")
    os.chown(dest, uid, uid)
    dest.chmod(bits)
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    w.publish()
    assert _owner(dest) == (uid, uid, bits & 0o777)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")
@pytest.mark.parametrize("member", [True, False], ids=["in-its-group", "not-in-its-group"])
def test_a_user_replacing_anothers_file_keeps_its_group_where_it_may(
    member: bool,
) -> None:
    """A user cannot give a file away: the new file is its own, with the replaced file's
    group when the user is in it, else its own group; never a failure."""
    import shutil
    import tempfile

    from support.as_user import as_user

    d = Path(tempfile.mkdtemp(prefix="ptestore-owner-"))  # pytest's are 0700: not theirs
    try:
        os.chmod(d, 0o777)
        dest = d / "m.pte"
        dest.write_bytes(b"old")
        os.chown(dest, 2000, 3000)
        dest.chmod(0o664)

        def replace() -> None:
            w = LocalFileWriter(dest)
            w.write(b"new", 0)
            w.publish()

        assert as_user(1000, replace, groups=[3000] if member else []) == "ok: None"
        assert dest.read_bytes() == b"new"
        assert _owner(dest) == (1000, 3000 if member else 1000, 0o664)
    finally:
        shutil.rmtree(d)
