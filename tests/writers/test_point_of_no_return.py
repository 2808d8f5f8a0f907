"""Failures after a writer's point of no return, and cleanup from a forked process.

- Once the commit step began (the rename or link, PutObject, CompleteMultipartUpload),
  an interrupt or an unexpected error raises ``PublishUncertain``, never an error that
  means nothing was published (issue 13, item 4).
- A process forked from the one that created a writer never removes its staging, by
  any cleanup path (issue 13, item 7).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import PublishUncertain
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import DataWriter, LocalFileWriter, WriterState, open_writer
from ptestore.writers.s3 import MIN_PART_SIZE, S3Writer

UNCERTAIN = (
    r"publishing was interrupted after its commit step began \(KeyboardInterrupt\): the "
    r"destination holds either its previous content or the complete new output"
)


def staging_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if ".ptestore-" in n)


def interrupt_after(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, exc: BaseException
) -> list[int]:
    """Make ``owner.name`` run, then raise ``exc`` (an interrupt landing right after)."""
    real = getattr(owner, name)
    calls: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        calls.append(1)
        raise exc

    monkeypatch.setattr(owner, name, wrapped)
    return calls


@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_local_interrupt_right_after_the_rename_is_uncertain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    dest = tmp_path / "m.pte"
    if mode == "overwrite":
        dest.write_bytes(b"old")
    w = LocalFileWriter(dest)
    w.write(b"new", 0)
    calls = interrupt_after(
        monkeypatch, os, "replace" if mode == "overwrite" else "link", KeyboardInterrupt()
    )
    with pytest.raises(PublishUncertain, match=UNCERTAIN):
        w.publish(mode)  # type: ignore[arg-type]
    assert calls == [1]
    assert dest.read_bytes() == b"new"
    assert w.state is WriterState.DISCARDED
    assert staging_files(tmp_path) == []


def test_local_interrupt_in_the_directory_fsync_is_uncertain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise KeyboardInterrupt
        real(fd)

    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"new", 0)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(PublishUncertain, match=UNCERTAIN):
        w.publish()
    assert (tmp_path / "m.pte").read_bytes() == b"new"


def test_local_failing_directory_open_after_the_rename_is_uncertain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.open

    def open_(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECTORY:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, flags, *args)

    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"new", 0)
    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(
        PublishUncertain,
        match=r"m.pte: published, but cannot open directory .* to fsync it: Too many open "
        r"files; the new file is in place but may not survive a crash",
    ):
        w.publish()
    assert (tmp_path / "m.pte").read_bytes() == b"new"


def test_interrupt_before_the_commit_step_publishes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "m.pte"
    dest.write_bytes(b"old")
    w = LocalFileWriter(dest)
    w.write(b"new", 0)

    def interrupt(_: DataWriter) -> None:
        raise KeyboardInterrupt

    w.commit_hook = interrupt
    with pytest.raises(KeyboardInterrupt):
        w.publish()
    assert dest.read_bytes() == b"old"
    assert staging_files(tmp_path) == []


def test_a_failing_rename_is_a_plain_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename itself failing is known not to have published: no 'uncertain'."""
    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"new", 0)

    def replace(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Exception) as info:
        w.publish()
    assert not isinstance(info.value, PublishUncertain)
    assert "cannot rename staging file" in str(info.value)
    assert not (tmp_path / "m.pte").exists()


# -- S3 -------------------------------------------------------------------------------


def s3_writer(s3_server: S3TestServer, bucket: str, key: str) -> S3Writer:
    w = open_writer(f"s3://{bucket}/{key}", **s3_server.storage_options, part_size=MIN_PART_SIZE)
    assert isinstance(w, S3Writer)
    return w


@pytest.mark.s3
@pytest.mark.parametrize("size", [1000, 2 * MIN_PART_SIZE + 7], ids=["put", "multipart"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("boom")], ids=["int", "err"])
def test_s3_interrupt_after_the_request_was_sent_is_uncertain(
    s3_server: S3TestServer,
    s3_bucket: str,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    size: int,
    exc: BaseException,
) -> None:
    w = s3_writer(s3_server, s3_bucket, "m.pte")
    data = os.urandom(size)
    w.write(data, 0)
    publisher = w._publisher  # the request is what is interrupted
    calls = interrupt_after(
        monkeypatch, publisher, "put" if size < MIN_PART_SIZE else "complete", exc
    )
    name = type(exc).__name__
    with pytest.raises(
        PublishUncertain, match=rf"interrupted after its commit step began \({name}"
    ):
        w.publish()
    assert calls == [1]
    assert s3_client.get_object(Bucket=s3_bucket, Key="m.pte")["Body"].read() == data
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


# -- forked processes -----------------------------------------------------------------


def _in_child(target: Callable[[], None]) -> int:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=target)
    proc.start()
    proc.join(60)
    assert proc.exitcode is not None, "the child hung"
    return proc.exitcode


def _every_cleanup_path(w: DataWriter) -> Callable[[], None]:
    def child() -> None:  # exits normally
        w.discard()
        w.__exit__(KeyError, KeyError("x"), None)
        w._abandon("child")  # the path failures take
        fin = w._finalizer  # what interpreter exit runs
        assert fin is not None
        fin()

    return child


def test_forked_child_never_removes_the_parents_staging_file(tmp_path: Path) -> None:
    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"parent's bytes", 0)
    staging = w.staging_path
    assert _in_child(_every_cleanup_path(w)) == 0
    assert os.path.exists(staging)
    assert w.state is WriterState.OPEN
    w.publish()
    assert (tmp_path / "m.pte").read_bytes() == b"parent's bytes"


@pytest.mark.s3
def test_forked_child_never_aborts_the_parents_upload(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    w = s3_writer(s3_server, s3_bucket, "m.pte")
    data = os.urandom(2 * MIN_PART_SIZE + 5)
    w.write(data, 0)
    w.wait_uploads()
    upload_id = w.upload_id
    assert upload_id is not None
    assert _in_child(_every_cleanup_path(w)) == 0
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["UploadId"] for u in uploads] == [upload_id]
    w.publish()
    assert s3_client.get_object(Bucket=s3_bucket, Key="m.pte")["Body"].read() == data


# -- the finalizer (mutation testing found these unpinned) ---------------------------------


def test_finalizer_warns_and_logs_a_failing_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gc
    import warnings

    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"forgotten", 0)
    url, staging = w.url, w.staging_path

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "unlink", unlink)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del w
        gc.collect()
    assert [str(m.message) for m in seen if m.category is ResourceWarning] == [
        f"{url}: writer was destroyed without publish() or discard(); its staged data was discarded"
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.writers"] == [
        f"{url}: discarding an abandoned writer failed: {staging}: cannot remove staging "
        "file: Permission denied"
    ]
    monkeypatch.undo()
    os.unlink(staging)
