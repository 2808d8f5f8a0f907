"""``PinnedReader`` on S3 (:mod:`ptestore.fleet.ranged`): a body cut off is read again
from the first byte not received, and the retry policy's attempts bound failures in a
row, not in a whole download: a long download with an occasional fault completes. The
server is a stand-in for s3fs's request (a body that ends early every few pieces, as a
connection lost mid-body does); the back-off is not waited."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import fsspec.asyn
import pytest
from writers.s3_faults import Fault

from ptestore._retry import DEFAULT_RETRY
from ptestore.errors import IntegrityError, PermissionDenied, StorageError
from ptestore.fleet import ranged
from ptestore.fleet.ranged import PinnedReader
from ptestore.testing.s3server import S3TestServer

DATA = bytes(range(256)) * 64  # 16 KiB


class Body:
    """A response body that ends after ``pieces`` reads (the connection lost)."""

    def __init__(self, data: bytes, pieces: int) -> None:
        self.data, self.left = data, pieces

    async def read(self, n: int) -> bytes:
        if self.left == 0:
            return b""
        self.left -= 1
        out, self.data = self.data[:n], self.data[n:]
        return out

    async def aclose(self) -> None:
        pass


class S3FileSystem:
    """What :class:`PinnedReader` recognizes as s3fs (by the class name)."""

    def __init__(self, pieces: int) -> None:
        self.loop = fsspec.asyn.get_loop()
        self.pieces = pieces
        self.opened = 0
        self.whole = False

    def split_path(self, path: str) -> tuple[str, str, None]:
        return ("bucket", "key", None)

    async def _call_s3(self, operation: str, **params: Any) -> dict[str, Any]:
        assert operation == "get_object" and params["IfMatch"] == '"e"'
        first, last = params["Range"].removeprefix("bytes=").split("-")
        self.opened += 1
        if self.whole:
            return {"Body": Body(DATA, self.pieces), "ContentLength": len(DATA)}
        body = Body(DATA[int(first) : int(last) + 1], self.pieces)
        return {"Body": body, "ContentRange": f"bytes {first}-{last}/{len(DATA)}"}


class Loader:
    name = "s3://bucket/key"
    path = "bucket/key"

    def __init__(self, fs: S3FileSystem) -> None:
        self.fs = fs


def test_occasional_faults_in_a_long_download_are_each_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body cut after every 2 pieces: 32 pieces need 16 requests, far more than the
    policy's attempts, and every cut is retried from where it stopped."""
    monkeypatch.setattr(ranged, "_backoff", lambda *args: None)
    fs = S3FileSystem(pieces=2)
    reader = PinnedReader(Loader(fs), '"e"')  # type: ignore[arg-type]
    got = b"".join(reader.stream(0, len(DATA), 512))
    assert got == DATA and reader.received == len(DATA)
    assert fs.opened == len(DATA) // 512 // 2 > DEFAULT_RETRY.attempts


def test_failures_in_a_row_still_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body that never delivers: refused after the policy's attempts in a row."""
    monkeypatch.setattr(ranged, "_backoff", lambda *args: None)
    fs = S3FileSystem(pieces=0)
    reader = PinnedReader(Loader(fs), '"e"')  # type: ignore[arg-type]
    with pytest.raises(StorageError, match="short read: wanted 512 bytes at offset 0, got 0"):
        b"".join(reader.stream(0, len(DATA), 512))
    assert fs.opened == DEFAULT_RETRY.attempts


def test_a_whole_object_for_a_part_asked_for_is_refused_as_such() -> None:
    """The whole object where a range was asked for: refused at once (no retry), naming
    the range asked for and what came; the whole object asked for is what it is."""
    fs = S3FileSystem(pieces=1 << 20)
    fs.whole = True  # a server that ignores Range: the whole object, no Content-Range
    reader = PinnedReader(Loader(fs), '"e"')  # type: ignore[arg-type]
    with pytest.raises(IntegrityError) as info:
        b"".join(reader.stream(512, 1024, 512))
    assert str(info.value) == (
        "s3://bucket/key: asked the server for Range: bytes=512-1023, it answered the whole "
        f"object ({len(DATA)} bytes, no Content-Range): the server ignored the range; its "
        "bytes are refused"
    )
    assert info.value.published is False and fs.opened == 1 and reader.received == 0
    assert b"".join(reader.stream(0, len(DATA), 4096)) == DATA


# -- the caller's retry policy, on moto and SeaweedFS ------------------------------------------

#: The policy a caller gives: three attempts, no back-off (no wall-clock waits); a client of
#: its own (s3fs shares filesystems per option set): the hooks stay in the test.
THREE = {"retry_attempts": 3, "retry_initial": 0.0, "retry_max": 0.0, "skip_instance_cache": True}


def _object(s3_server: S3TestServer) -> str:
    """The URL of a new object holding :data:`DATA`."""
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="a.pte", Body=DATA)
    return f"s3://{bucket}/a.pte"


def _pinned_read(
    s3_server: S3TestServer, url: str, tmp_path: Path, fault: Fault, **options: Any
) -> bytes:
    """4 KiB of ``url`` read by the :class:`PinnedReader` :func:`ranged.pinned_attempts`
    builds from ``options`` (over the server's and :data:`THREE`), ``fault`` on its
    ``GetObject`` requests (the loader's own ``HEAD`` is made before it)."""

    def run(loader: Any, reader: PinnedReader, state: dict[str, Any]) -> bytes:
        fault.install(loader.fs.s3)
        return reader.read(1024, 4096)

    opts = {**s3_server.storage_options, **THREE, **options}
    return ranged.pinned_attempts(url, opts, str(tmp_path / "a.pte"), run)


@pytest.mark.parametrize(("attempts", "kind"), [(3, "reset"), (3, "503"), (1, "503"), (3, "403")])
def test_a_pinned_read_that_keeps_failing_is_made_as_often_as_the_callers_policy_says(
    s3_server: S3TestServer, tmp_path: Path, attempts: int, kind: str
) -> None:
    """``retry_attempts=3`` is 3 ranged ``GetObject`` requests of a download's reader,
    ``retry_attempts=1`` one (was the default policy's 6, with its back-off, whatever the
    caller gave); a permanent answer (403) is not asked again. Then a StorageError
    naming the object and the range."""
    url = _object(s3_server)
    fault = Fault("GetObject", kind, times=-1)
    with pytest.raises(StorageError) as info:
        _pinned_read(s3_server, url, tmp_path, fault, retry_attempts=attempts)
    assert fault.calls == (1 if kind == "403" else attempts)
    what = f"{url}: read of bytes 1024:5120 failed: "
    if kind == "503":
        assert str(info.value) == f"{what}SlowDown (HTTP 503): injected 503"
    elif kind == "403":
        assert isinstance(info.value, PermissionDenied)
        assert str(info.value) == f"{what}AccessDenied (HTTP 403): injected 403"
    else:
        assert str(info.value).startswith(what), str(info.value)


def test_a_pinned_read_that_fails_twice_is_retried_under_the_callers_policy(
    s3_server: S3TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two dropped connections, then the range: 3 requests, the bytes asked for, each
    retry logged as the caller's policy waits (0.00 s)."""
    url = _object(s3_server)
    fault = Fault("GetObject", "reset", times=2)
    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        got = _pinned_read(s3_server, url, tmp_path, fault)
    assert got == DATA[1024:5120]
    assert (fault.calls, fault.injected) == (3, 2)
    waits = [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"]
    assert len(waits) == 2 and all(
        w.startswith(f"{url}: read at offset 1024 failed (") and w.endswith("from there in 0.00s")
        for w in waits
    ), waits
