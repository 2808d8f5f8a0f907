"""Local compare-and-swap (``publish(mode="if-match")``) around its lock: symbolic links
(the destination, the lock file) and an interrupt while waiting for the lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import ConfigurationError, PreconditionFailed, PublishUncertain, StorageError
from ptestore.writers import LocalFileWriter, WriterState
from ptestore.writers._local_cas import lock_path
from ptestore.writers.local import TEMP_NAME_RE
from ptestore.writers.versions import current_version, read_versioned


def staging_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TEMP_NAME_RE.match(n))


def test_if_match_through_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    """Through a link, the hash would be the linked file's, the lock the link's and the
    rename would replace the link: a publisher through the file's own path takes
    another lock, and both would win on one version. Refused; nothing changes."""
    shared = tmp_path / "shared"
    shared.mkdir()
    target, link = shared / "index.json", tmp_path / "index.json"
    target.write_bytes(b"v0")
    link.symlink_to(target)
    read = read_versioned(str(link))
    assert read.version == read_versioned(str(target)).version
    a = LocalFileWriter(link)
    a.write(b"v1 from a (through the link)", 0)
    with pytest.raises(ConfigurationError) as info:
        a.publish("if-match", expected=read.version)
    assert str(info.value) == (
        f"{link}: is a symbolic link (to {target}); publish(mode='if-match') compares and "
        "replaces the file at the path it is given: publish to the file's own path instead"
    )
    # A ConfigurationError at publish, as at write: the writer stays open (it discarded
    # itself, against docs/storage.md), its staging file there until it is discarded.
    assert a.state is WriterState.OPEN
    assert link.is_symlink() and target.read_bytes() == b"v0"
    assert len(staging_files(tmp_path)) == 1
    a.discard()
    assert staging_files(tmp_path) == []
    b = LocalFileWriter(target)  # through the file's own path: the compare-and-swap
    b.write(b"v1 from b", 0)
    b.publish("if-match", expected=read.version)
    assert link.is_symlink() and link.read_bytes() == b"v1 from b"


def test_a_writer_refused_as_bad_input_at_publish_can_publish_otherwise(tmp_path: Path) -> None:
    """Kept open after the refusal, the writer publishes what it staged with a mode that
    applies (``overwrite`` replaces the link itself, as ``mv`` does)."""
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_bytes(b"v0")
    link.symlink_to(target)
    w = LocalFileWriter(link)
    w.write(b"staged once", 0)
    with pytest.raises(ConfigurationError, match="is a symbolic link"):
        w.publish("if-match", expected=read_versioned(str(link)).version)
    w.publish("overwrite")
    assert w.state is WriterState.PUBLISHED
    assert not link.is_symlink() and link.read_bytes() == b"staged once"
    assert target.read_bytes() == b"v0" and staging_files(tmp_path) == []


def test_the_lock_file_is_never_opened_through_a_symbolic_link(tmp_path: Path) -> None:
    """A link planted where the lock file goes is not followed (nothing is created where
    it points): the publish fails, naming it, and publishes nothing."""
    dest = tmp_path / "m.json"
    dest.write_bytes(b"v0")
    victim = tmp_path / "elsewhere"
    os.symlink(victim, lock_path(str(dest)))
    read = read_versioned(str(dest))
    w = LocalFileWriter(dest)
    w.write(b"v1", 0)
    with pytest.raises(StorageError) as info:
        w.publish("if-match", expected=read.version)
    assert str(info.value) == (
        f"{dest}: cannot lock {lock_path(str(dest))}: it is a symbolic link, never followed "
        "(remove it)"
    )
    assert not isinstance(info.value, PublishUncertain)
    assert not victim.exists()
    assert dest.read_bytes() == b"v0"
    assert staging_files(tmp_path) == []


def test_an_interrupt_while_waiting_for_the_lock_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another publisher holds the lock; Ctrl-C while this one waits for it is a plain
    interrupt (nothing was published), not PublishUncertain."""
    dest = tmp_path / "m.json"
    dest.write_bytes(b"v0")
    read = read_versioned(str(dest))
    w = LocalFileWriter(dest)
    w.write(b"v1", 0)
    holder = os.open(lock_path(str(dest)), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    real_flock = fcntl.flock
    waited: list[bool] = []

    def flock(fd: Any, operation: int) -> None:
        if operation == fcntl.LOCK_EX:  # a wait: it would block, the user presses Ctrl-C
            with pytest.raises(BlockingIOError):
                real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited.append(True)
            raise KeyboardInterrupt
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        with pytest.raises(KeyboardInterrupt):
            w.publish("if-match", expected=read.version)
    finally:
        monkeypatch.undo()
        os.close(holder)
    assert waited == [True]
    assert w.state is WriterState.DISCARDED
    assert dest.read_bytes() == b"v0"
    assert staging_files(tmp_path) == []


def test_an_interrupt_at_the_rename_is_uncertain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the lock is held and the version matched, the commit step has begun."""
    dest = tmp_path / "m.json"
    dest.write_bytes(b"v0")
    read = read_versioned(str(dest))
    w = LocalFileWriter(dest)
    w.write(b"v1", 0)

    def replace(src: Any, dst: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PublishUncertain, match="interrupted after its commit step began"):
        w.publish("if-match", expected=read.version)


def test_a_conflict_is_found_under_the_lock(tmp_path: Path) -> None:
    """The commit hook runs before the lock (race tests pause a writer there) and the
    version is compared after it: a change made meanwhile is a conflict."""
    dest = tmp_path / "m.json"
    dest.write_bytes(b"v0")
    read = read_versioned(str(dest))
    w = LocalFileWriter(dest)
    w.write(b"v1", 0)
    w.commit_hook = lambda _: dest.write_bytes(b"changed meanwhile")
    with pytest.raises(PreconditionFailed, match="nothing was published"):
        w.publish("if-match", expected=read.version)
    assert dest.read_bytes() == b"changed meanwhile"


def test_a_versioned_read_of_anything_but_a_regular_file_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """A FIFO was opened and waited on (a writer never comes), a character device read
    and hashed forever: every reader of an index (gc, select, a publish) hung. Opened
    without blocking, looked at, refused; through a link to a regular file, read."""
    fifo, directory, device = tmp_path / "fifo.json", tmp_path / "dir.json", tmp_path / "z.json"
    os.mkfifo(fifo)
    directory.mkdir()
    device.symlink_to("/dev/zero")
    for path, what in (
        (fifo, "a FIFO (named pipe)"),
        (directory, "a directory"),
        (device, "a character device"),
    ):
        with pytest.raises(ConfigurationError) as info:
            read_versioned(str(path), max_bytes=1 << 16)
        assert str(info.value) == f"{path}: is {what}, not a regular file; refusing to read it"
    regular, link = tmp_path / "r.json", tmp_path / "l.json"
    regular.write_bytes(b"{}")
    link.symlink_to(regular)
    assert read_versioned(str(link)).data == b"{}"
    assert read_versioned(str(tmp_path / "none.json")).version is None


def test_the_version_of_a_fifo_is_refused_at_once_and_a_publish_over_it_too(
    tmp_path: Path,
) -> None:
    """The version a compare-and-swap compares (``current_version``, and a publish's
    check before its swap) opened a FIFO and waited for a writer that never comes."""
    fifo = tmp_path / "ptestore-index.json"
    os.mkfifo(fifo)
    message = f"{fifo}: is a FIFO (named pipe), not a regular file; refusing to read it"
    with pytest.raises(ConfigurationError) as info:
        current_version(str(fifo))
    assert str(info.value) == message
    w = LocalFileWriter(str(fifo))
    w.write(b"{}", 0)
    with pytest.raises(ConfigurationError) as info:
        w.publish("if-match", expected="sha256:" + "0" * 64)
    assert str(info.value) == message
    assert fifo.is_fifo()


def test_a_long_name_in_two_byte_characters_gets_a_lock_that_fits(tmp_path: Path) -> None:
    """A legal name of 244 bytes in 124 characters: the lock file's name is cut by bytes
    (at a character), so the compare-and-swap works instead of "File name too long"."""
    dest = tmp_path / ("é" * 120 + ".pte")
    assert len(os.fsencode(dest.name)) == 244
    dest.write_bytes(b"v0")
    read = read_versioned(str(dest))
    w = LocalFileWriter(dest)
    w.write(b"v1", 0)
    w.publish("if-match", expected=read.version)
    assert dest.read_bytes() == b"v1"
    lock = Path(lock_path(str(dest)))
    assert lock.exists() and lock.parent == tmp_path
    assert lock.name == "." + "é" * 120 + ".ptestore.lock"  # 240 bytes of the name kept
    assert len(os.fsencode(lock.name)) == 255


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("a" * 230, "a" * 200),  # 200 characters, as before
        ("é" * 110, "é" * 110),  # 220 bytes: whole, as before
        ("é" * 121, "é" * 120),  # 242 bytes: cut to 240, at a character
        ("a" + "é" * 121, "a" + "é" * 119),  # 243 bytes: 239, not inside the last é
    ],
)
def test_lock_names_keep_what_fits(name: str, kept: str) -> None:
    """Every name the cut by characters served keeps its lock file (a publisher of an
    older version takes the same one); longer ones are cut to the bytes that fit."""
    assert lock_path(f"/d/{name}") == f"/d/.{kept}.ptestore.lock"
