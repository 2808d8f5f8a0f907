"""The error paths and results of publish/discard/create, pinned (mutation testing found
them unpinned: docs/testing.md)."""

from __future__ import annotations

import errno
import gc
import hashlib
import logging
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from ptestore.errors import AlreadyExists, ConfigurationError, StorageError
from ptestore.writers import LocalFileWriter, MemoryWriter, WriterState, open_writer
from ptestore.writers.local import TEMP_NAME_RE


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def failing(exc: OSError) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise exc

    return fail


def test_local_publish_result_and_new_file_mode(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    w = LocalFileWriter(dest)
    w.write(b"abc", 0)
    result = w.publish()
    assert (result.url, result.size, result.etag, result.checksum) == (str(dest), 3, None, None)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~_current_umask()


def test_local_publish_keeps_an_existing_mode(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"old")
    dest.chmod(0o640)
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    w.publish()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640


def test_local_create_message(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"keep")
    w = LocalFileWriter(dest)
    with pytest.raises(AlreadyExists) as info:
        w.publish("create")
    assert str(info.value) == (
        f"{dest}: already exists; publish(mode='create') never replaces an existing file"
    )


@pytest.mark.parametrize(
    ("name", "exc", "message"),
    [
        ("stat", OSError(errno.EACCES, "Permission denied"), "cannot stat destination: "),
        (
            "fchmod",
            OSError(errno.EPERM, "Operation not permitted"),
            "cannot set mode {mode:o} on the staging file: ",
        ),
        (
            "link",
            OSError(errno.EIO, "Input/output error"),
            "cannot link staging file {tmp} to it: ",
        ),
        (
            "replace",
            OSError(errno.EIO, "Input/output error"),
            "cannot rename staging file {tmp} over it: ",
        ),
        # an OSError without errno/strerror: its text
        ("replace", OSError("no errno here"), "cannot rename staging file {tmp} over it: "),
    ],
)
def test_local_publish_failures_name_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, exc: OSError, message: str
) -> None:
    dest = tmp_path / "m.pte"
    w = LocalFileWriter(dest)
    w.write(b"abc", 0)
    tmp = w.staging_path
    mode = 0o666 & ~_current_umask()
    if name == "stat":
        real = os.stat

        def stat_(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            if os.fspath(path) == str(dest):
                raise exc
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", stat_)
    else:
        monkeypatch.setattr(os, name, failing(exc))
    with pytest.raises(StorageError) as info:
        w.publish("create" if name == "link" else "overwrite")
    detail = exc.strerror or str(exc)
    assert str(info.value) == f"{dest}: " + message.format(mode=mode, tmp=tmp) + detail
    monkeypatch.undo()
    assert w.state is WriterState.DISCARDED
    assert not dest.exists()
    assert not os.path.exists(tmp)


def test_a_name_over_the_file_systems_limit_is_refused_when_the_writer_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination name longer than NAME_MAX (bytes, as ``pathconf`` says, else 255)
    is refused before anything is written: the staging name is cut to fit, so before
    only the publish failed ("File name too long"), after all the work."""
    name = "x" * 300 + ".pte"
    for dest in (tmp_path / name, tmp_path / ("d" * 256) / "m.pte"):
        long = max(dest.parts, key=len)
        with pytest.raises(ConfigurationError) as info:
            LocalFileWriter(dest, auto_mkdir=True)
        assert str(info.value) == (
            f"{dest}: the name {long[:40]!r}... ({len(long)} characters) is {len(long)} "
            "bytes long, over the file system's limit of 255 bytes per name (NAME_MAX)"
        )
    assert list(tmp_path.iterdir()) == []
    accented = "\u00e9" * 128 + ".pte"  # 260 bytes in UTF-8, 132 characters
    with pytest.raises(ConfigurationError, match=r" is 260 bytes long, over .* of 255 bytes"):
        LocalFileWriter(tmp_path / accented)
    monkeypatch.setattr(os, "pathconf", lambda path, name: 20)  # a file system's own
    with pytest.raises(ConfigurationError, match=r" is 21 bytes long, over .* of 20 bytes"):
        LocalFileWriter(tmp_path / ("y" * 17 + ".pte"))
    w = LocalFileWriter(tmp_path / ("y" * 16 + ".pte"))
    w.write(b"ok", 0)
    w.publish()


@pytest.mark.parametrize("char", ["\u00e9", "\u20ac", "\U0001f600"])
def test_a_name_of_wide_characters_under_the_limit_is_published(tmp_path: Path, char: str) -> None:
    """A destination name under NAME_MAX in bytes but of 2-, 3- or 4-byte characters:
    its staging name is cut to 200 bytes, at a character (it was cut to 200 characters,
    up to 800 bytes, and the staging file could not be made: ``File name too long``)."""
    name = char * (250 // len(char.encode())) + ".pte"
    assert len(name.encode()) <= 255
    w = LocalFileWriter(tmp_path / name)
    staging = os.path.basename(w.staging_path)
    assert len(staging.encode()) <= 255 and TEMP_NAME_RE.match(staging)
    w.write(b"ok", 0)
    w.publish()
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_bytes() == b"ok"


def test_a_failed_publish_does_not_warn_at_garbage_collection(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"keep")
    w = LocalFileWriter(dest)
    w.write(b"x", 0)
    with pytest.raises(AlreadyExists):
        w.publish("create")
    # recorded, not raised: an exception in a finalizer would only be printed
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del w
        gc.collect()
    assert [str(m.message) for m in seen] == []


def test_a_failing_cleanup_after_a_failure_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"keep")
    w = LocalFileWriter(dest)
    w.write(b"x", 0)
    tmp = w.staging_path
    monkeypatch.setattr(os, "unlink", failing(OSError(errno.EACCES, "Permission denied")))
    with caplog.at_level(logging.WARNING, "ptestore.writers"), pytest.raises(AlreadyExists):
        w.publish("create")
    monkeypatch.undo()
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.writers"] == [
        f"{dest}: discarding after a failure also failed: {tmp}: cannot remove staging file: "
        "Permission denied"
    ]
    os.unlink(tmp)


# -- memory ---------------------------------------------------------------------------


def test_memory_publish_result_and_object() -> None:
    url = "memory://paths/result/m.pte"
    w = open_writer(url)
    assert isinstance(w, MemoryWriter)
    w.write(b"abc", 0)
    result = w.publish()
    assert result.url == url and result.size == 3
    # The version token is the content's SHA-256 (as for local files), not a counter.
    assert result.etag == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    second = open_writer(url)
    second.write(b"d", 0)
    assert second.publish().etag == "sha256:" + hashlib.sha256(b"d").hexdigest()
    obj = MemoryFileSystem.store["/paths/result/m.pte"]
    assert obj.fs is not None and obj.path == "/paths/result/m.pte"
    assert MemoryFileSystem().cat_file("/paths/result/m.pte") == b"d"


def test_memory_create_message() -> None:
    MemoryFileSystem().pipe_file("/paths/create/m.pte", b"keep")
    w = open_writer("memory://paths/create/m.pte")
    with pytest.raises(AlreadyExists) as info:
        w.publish("create")
    assert str(info.value) == (
        "memory://paths/create/m.pte: already exists; publish(mode='create') never replaces "
        "an existing object"
    )


def test_memory_refuses_a_directory_and_an_object_parent() -> None:
    fs = MemoryFileSystem()
    fs.pipe_file("/paths/dir/m.pte/inside", b"x")
    w = open_writer("memory://paths/dir/m.pte")
    with pytest.raises(StorageError) as info:
        w.publish()
    assert str(info.value) == "memory://paths/dir/m.pte: is a directory, not an object"
    MemoryFileSystem.store["/paths/raw/m.pte/inside"] = MemoryFileSystem.store[
        "/paths/dir/m.pte/inside"
    ]  # an object stored without its pseudo directories
    w = open_writer("memory://paths/raw/m.pte")
    with pytest.raises(StorageError, match=r"raw/m.pte: is a directory, not an object"):
        w.publish()
    fs.pipe_file("/p", b"x")  # a one-letter object as the parent
    w = open_writer("memory://p/m.pte")
    with pytest.raises(StorageError) as info:
        w.publish()
    assert str(info.value) == "memory://p/m.pte: parent /p is an object, not a directory"


@pytest.mark.parametrize("end", ["publish", "discard"])
def test_no_warning_at_garbage_collection_after_publish_or_discard(
    tmp_path: Path, end: str
) -> None:
    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"x", 0)
    getattr(w, end)()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del w
        gc.collect()
    assert [str(m.message) for m in seen] == []


def test_an_uncertain_publish_closes_the_writer_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptestore.errors import PublishUncertain, WriterStateError

    dest = tmp_path / "m.pte"
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        real(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PublishUncertain) as info:
        w.publish()
    assert str(info.value) == (
        f"{dest}: publishing was interrupted after its commit step began (KeyboardInterrupt): "
        "the destination holds either its previous content or the complete new output; "
        "check it before relying on either"
    )
    with pytest.raises(WriterStateError) as state:
        w.write(b"x", 0)
    assert str(state.value) == (
        f"{dest}: cannot write: the writer was discarded (publish uncertain: KeyboardInterrupt)"
    )
