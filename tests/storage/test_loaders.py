"""DataLoaders: local, memory, S3 (moto, SeaweedFS), other fsspec protocols; ranges; retries."""

from __future__ import annotations

import errno
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from support.fixtures import get_fixture

from ptestore import open_loader
from ptestore._retry import RetryPolicy, is_transient
from ptestore.errors import ConfigurationError, ObjectNotFound, PermissionDenied, StorageError
from ptestore.format import read_container
from ptestore.storage.loaders import BytesLoader, DataLoader, FsspecLoader, LocalFileLoader
from ptestore.testing.s3server import S3TestServer

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
DATA = MLP.pte_path.read_bytes()


def test_local_loader(tmp_path: Path) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    for url in (str(p), f"file://{p}"):
        with open_loader(url) as loader:
            assert isinstance(loader, LocalFileLoader)
            assert loader.size() == len(DATA)
            assert loader.load(100, 50) == DATA[100:150]
            assert loader.load(len(DATA), 0) == b""


def test_local_errors(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=re.escape(f"{tmp_path}/nope.pte: no such file")):
        open_loader(tmp_path / "nope.pte")
    with pytest.raises(ConfigurationError, match="is a directory, not a regular file"):
        open_loader(tmp_path)
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    with open_loader(p) as loader:
        with pytest.raises(
            StorageError,
            match=re.escape(
                f"{p}: read of 10 bytes at offset 6040 is outside the object (size 6048)"
            ),
        ):
            loader.load(6040, 10)
        with pytest.raises(StorageError, match="outside the object"):
            loader.load(-1, 1)
    with pytest.raises(ConfigurationError, match="do not apply to local files"):
        open_loader(p, anon=True)


def test_local_file_shrinking_while_reading(tmp_path: Path) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    with open_loader(p) as loader:
        p.write_bytes(DATA[:100])  # truncated in place by someone else
        with pytest.raises(StorageError, match="file shrank while reading"):
            loader.load(0, 1000)


def test_bytes_loader_is_zero_copy() -> None:
    buf = bytearray(DATA)
    loader = BytesLoader(buf)
    view = loader.load(8, 4)
    assert bytes(view) == b"eh00"
    buf[8] = ord("X")
    assert bytes(view) == b"Xh00"


def test_memory_loader() -> None:
    fs = fsspec.filesystem("memory")
    path = f"/loader-{uuid.uuid4().hex[:8]}/m.pte"
    fs.pipe(path, DATA)
    with open_loader(f"memory://{path}") as loader:
        assert isinstance(loader, FsspecLoader)
        assert loader.size() == len(DATA)
        assert loader.load(0, 8) == DATA[:8]
        assert read_container(loader).container.methods == ("forward",)
    with pytest.raises(ObjectNotFound, match=r"memory://.*/missing.pte: no such object"):
        open_loader(f"memory://{path}-missing".replace("m.pte-missing", "missing.pte"))


def test_unknown_protocol() -> None:
    with pytest.raises(ConfigurationError, match=r"nosuchproto://x: cannot read protocol"):
        open_loader("nosuchproto://x")


def _client_error(code: str, status: int) -> BaseException:
    from botocore.exceptions import ClientError

    return ClientError(
        {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


def test_every_loader_is_a_data_loader(tmp_path: Path) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    fs = fsspec.filesystem("memory")
    fs.pipe("/proto/m.pte", DATA)
    loaders = [BytesLoader(DATA), open_loader(p), open_loader("memory://proto/m.pte")]
    for loader in loaders:
        assert isinstance(loader, DataLoader)
        assert loader.name
        loader.check_unchanged()  # nothing changed
        loader.close()


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        (
            "memory://x/m.pte",
            {"bogus": 1},
            r"memory://x/m.pte: options \['bogus'\] do not apply to "
            r"memory:// \(accepted: \[.*'retry_attempts'.*\]\)",
        ),
        (
            "memory://x/m.pte",
            {"retry_attempts": "x"},
            r"option retry_attempts = 'x': must be an int",
        ),
        ("memory://x/m.pte", {"retry_attempts": 0}, r"retry_attempts = 0: must be an int >= 1"),
        (
            "s3://b/m.pte",
            {"client_kwargs": [1]},
            r"s3://b/m.pte: option client_kwargs = \[1\]: "
            r"must be a dict \(botocore client arguments\)",
        ),
        (
            "s3://b/m.pte",
            {"endpoint": "http://x"},
            r"options \['endpoint'\] do not apply to s3:// "
            r"\(accepted: \[.*'anon', .*'client_kwargs', .*'endpoint_url', .*'profile'",
        ),
    ],
)
def test_options_are_checked_up_front(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        open_loader(url, **options)


class FlakyMemoryFS(MemoryFileSystem):
    """The real memory filesystem with injected faults on ranged reads."""

    protocol = "flakymem"
    failures: ClassVar[list[BaseException]] = []
    calls = 0

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        type(self).calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return super().cat_file(path, start=start, end=end, **kw)


@pytest.fixture
def flaky() -> Iterator[FsspecLoader]:
    fs = FlakyMemoryFS(skip_instance_cache=True)
    path = f"/flaky-{uuid.uuid4().hex[:8]}/m.pte"
    fs.pipe(path, DATA)
    FlakyMemoryFS.calls = 0
    retry = RetryPolicy(attempts=4, initial=0.001, maximum=0.01)
    yield FsspecLoader(fs, path, f"flakymem://{path}", retry=retry)
    FlakyMemoryFS.failures = []


def test_transient_errors_are_retried(flaky: FsspecLoader) -> None:
    FlakyMemoryFS.failures = [
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        _client_error("SlowDown", 503),
        TimeoutError("read timed out"),
    ]
    assert flaky.load(0, 8) == DATA[:8]
    assert FlakyMemoryFS.calls == 4


def test_permanent_errors_are_not_retried(flaky: FsspecLoader) -> None:
    FlakyMemoryFS.failures = [PermissionError(errno.EACCES, "Access Denied")]
    with pytest.raises(
        PermissionDenied, match=r"flakymem://.*: read of 8 bytes at offset 0 failed: Access Denied$"
    ):
        flaky.load(0, 8)
    assert FlakyMemoryFS.calls == 1


def test_a_message_containing_500_is_not_retried(flaky: FsspecLoader) -> None:
    """The old classifier matched message text: "5000" contains "500"."""
    FlakyMemoryFS.failures = [OSError("short read: wanted 5000 bytes")]
    with pytest.raises(
        StorageError,
        match=r"flakymem://.*: read of 8 bytes at offset 0 failed: short read: wanted 5000 bytes",
    ):
        flaky.load(0, 8)
    assert FlakyMemoryFS.calls == 1


def test_s3fs_style_errors_are_classified_by_their_cause(flaky: FsspecLoader) -> None:
    """s3fs raises OSError/PermissionError from the botocore ClientError."""
    denied = PermissionError(errno.EACCES, "Forbidden")
    denied.__cause__ = _client_error("AccessDenied", 403)
    busy = OSError(errno.EIO, "Please reduce your request rate.")
    busy.__cause__ = _client_error("SlowDown", 503)
    FlakyMemoryFS.failures = [busy, denied]
    with pytest.raises(
        PermissionDenied, match=r"failed: AccessDenied \(HTTP 403\): injected AccessDenied$"
    ):
        flaky.load(0, 8)
    assert FlakyMemoryFS.calls == 2


def test_retries_are_bounded(flaky: FsspecLoader) -> None:
    FlakyMemoryFS.failures = [ConnectionResetError("reset")] * 10
    with pytest.raises(StorageError, match="failed: reset"):
        flaky.load(0, 8)
    assert FlakyMemoryFS.calls == 4


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (OSError(errno.ETIMEDOUT, "timed out"), True),
        (OSError(errno.EAGAIN, "try again"), True),
        (_client_error("SlowDown", 503), True),
        (_client_error("Whatever", 502), True),
        (_client_error("RequestTimeout", 400), True),
        (_client_error("TooManyRequests", 429), True),
        (_client_error("AccessDenied", 403), False),
        (_client_error("NoSuchKey", 404), False),
        (_client_error("PreconditionFailed", 412), False),
        # never by message text
        (OSError("short read: wanted 5000 bytes"), False),
        (OSError("An error occurred (SlowDown) when calling GetObject"), False),
        (OSError("InternalError (500)"), False),
        (OSError(errno.EIO, "Connection reset"), False),
        (FileNotFoundError("nope"), False),
        (PermissionError("AccessDenied"), False),
        (ValueError("bad range"), False),
        (StorageError("ours"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@pytest.mark.s3
def test_s3_loader_reads_ranges_only(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    big = DATA + b"\0" * (8 << 20)  # a model followed by 8 MiB nobody should read
    client.put_object(Bucket=bucket, Key="m.pte", Body=big)
    ranges: list[str] = []

    loader = open_loader(f"s3://{bucket}/m.pte", **s3_server.storage_options)
    assert isinstance(loader, FsspecLoader)
    s3 = loader.fs.s3 if hasattr(loader.fs, "s3") else None
    if s3 is not None:
        s3.meta.events.register(
            "provide-client-params.s3.GetObject",
            lambda params, **kw: ranges.append(params.get("Range", "whole")),
        )
    assert loader.size() == len(big)
    parsed = read_container(loader)
    assert parsed.container.methods == ("forward",)
    assert parsed.bytes_read < 2000
    if s3 is not None:
        assert ranges and all(r.startswith("bytes=") for r in ranges)
    with pytest.raises(ObjectNotFound, match=rf"s3://{bucket}/missing.pte: no such object"):
        open_loader(f"s3://{bucket}/missing.pte", **s3_server.storage_options)


@pytest.mark.s3
def test_an_s3_key_ending_in_a_slash_is_refused(s3_server: S3TestServer) -> None:
    """s3fs asks HEAD of ``tk`` for ``tk/`` while a GET asks for ``tk/``: with both
    objects the read said "replaced while being read", with ``solo`` alone "object
    disappeared". Refused before any request, as S3Writer refuses such a destination."""
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="tk", Body=DATA)
    client.put_object(Bucket=bucket, Key="solo", Body=DATA)
    client.put_object(Bucket=bucket, Key="tk/", Body=DATA + b"other")
    for key in ("tk/", "solo/"):
        url = f"s3://{bucket}/{key}"
        with pytest.raises(ConfigurationError) as info:
            open_loader(url, **s3_server.storage_options)
        assert str(info.value) == (
            f"{url}: an S3 key ending in '/' cannot be read: s3fs asks for the key without "
            "its '/' (another object, or none) where a read asks for the key itself; rename "
            "the object"
        )


@pytest.mark.s3
def test_a_small_s3_object_is_read_whole_at_its_second_read(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=DATA)
    loader = open_loader(
        f"s3://{bucket}/m.pte", **s3_server.storage_options, skip_instance_cache=True
    )
    assert isinstance(loader, FsspecLoader)
    ranges: list[str] = []
    loader.fs.s3.meta.events.register(
        "provide-client-params.s3.GetObject",
        lambda params, **kw: ranges.append(params.get("Range", "whole")),
    )
    assert loader.load(len(DATA) - 8, 8) == DATA[-8:]  # one read: a ranged one
    assert not loader.in_memory
    parsed = read_container(loader)  # the second read fetches the whole object
    assert parsed.container.methods == ("forward",)
    assert loader.load(3, 5) == DATA[3:8]
    assert ranges == [f"bytes={len(DATA) - 8}-{len(DATA) - 1}", f"bytes=0-{len(DATA) - 1}"]
    assert loader.in_memory
    assert loader.bytes_fetched == 8 + len(DATA)
    loader.check_unchanged()


def test_memory_objects_are_read_by_ranges() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/ranges/m.pte", DATA)
    loader = open_loader("memory://ranges/m.pte")
    assert loader.load(4, 4) == DATA[4:8]
    assert isinstance(loader, FsspecLoader) and not loader.in_memory


def test_other_protocols_are_read_through_their_file_api(tmp_path: Path) -> None:
    """A protocol that is neither memory, S3 nor HTTP: each read opens the object and
    reads the range asked for, no more (fsspec's local file system as the stand-in)."""
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    fs = fsspec.filesystem("file", skip_instance_cache=True)
    loader = FsspecLoader(fs, str(p), f"other://{p}")
    assert loader.load(100, 50) == DATA[100:150]
    assert loader.load(len(DATA) - 4, 4) == DATA[-4:]
    assert loader.load(8, 4) == DATA[8:12] and loader.in_memory


def test_http_objects_are_read_by_ranges() -> None:
    """An ``http://`` object (what an index may name): one ranged GET per read, through
    its streamed body; the second read of a small object takes it whole."""
    from support.http_store import http_store

    with http_store({"/m.pte": DATA}) as (base, state):
        loader = open_loader(f"{base}/m.pte", skip_instance_cache=True)
        assert isinstance(loader, FsspecLoader) and loader.size() == len(DATA)
        assert loader.load(100, 50) == DATA[100:150]
        assert loader.load(8, 4) == DATA[8:12] and loader.in_memory
        gets = [r for m, _, r in state.requests if m == "GET"]
        assert gets == ["bytes=100-149", f"bytes=0-{len(DATA) - 1}"]
        loader.close()
        missing = open_loader(f"{base}/m.pte", skip_instance_cache=True)
        del state.objects["/m.pte"]
        with pytest.raises(ObjectNotFound, match=r"/m\.pte: object disappeared while reading$"):
            missing.load(0, 8)


def test_an_http_range_answered_with_an_endless_body_is_refused() -> None:
    """An ``http://`` server that answers a ranged GET with the range and then an
    endless body: the read stops one byte past the range and refuses it, naming the
    URL, the range and the bytes read (fsspec's HTTP ``cat_file`` held the whole body:
    a MemoryError); the server wrote what the socket buffers took, not the whole."""
    from support.http_store import ENDLESS, http_store

    from ptestore.errors import IntegrityError

    with http_store({"/m.pte": DATA}) as (base, state):
        loader = open_loader(f"{base}/m.pte", skip_instance_cache=True)
        state.endless = True
        with pytest.raises(IntegrityError) as info:
            loader.load(100, 50)
        written = state.streamed.get(timeout=60)  # the server's stream ended
    assert str(info.value) == (
        f"{base}/m.pte: asked the server for Range: bytes=100-149 (50 bytes), its answer "
        "is longer: read no further than 51 bytes, the rest left unread; its bytes are "
        "refused"
    )
    assert info.value.published is False
    assert written < ENDLESS * (1 << 20) // 4, written


def test_an_http_range_the_server_ignored_is_refused_as_such() -> None:
    """An ``http://`` server that answers a ranged GET 200 with the whole object (it
    does not do ranges): refused in the words an S3 answer gets, read no further than
    the range and one byte; the whole object asked for is what it is."""
    from support.http_store import http_store

    from ptestore.errors import IntegrityError

    with http_store({"/m.pte": DATA}) as (base, state):
        loader = open_loader(f"{base}/m.pte", skip_instance_cache=True)
        state.ignore_range = True
        with pytest.raises(IntegrityError) as info:
            loader.load(100, 50)
        assert loader.load(0, len(DATA)) == DATA
    assert str(info.value) == (
        f"{base}/m.pte: asked the server for Range: bytes=100-149, it answered the whole "
        f"object ({len(DATA)} bytes, no Content-Range): the server ignored the range; its "
        "bytes are refused"
    )
    assert info.value.published is False
    assert [r for m, _, r in state.requests if m == "GET"] == [
        "bytes=100-149",
        f"bytes=0-{len(DATA) - 1}",
    ]


#: Fast retries: what the user configures is the one layer (no wall-clock waits).
FAST_RETRY = {"retry_attempts": 3, "retry_initial": 0.0, "retry_max": 0.0}


def _s3_loader(s3_server: S3TestServer, **options: Any) -> tuple[FsspecLoader, str]:
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=DATA)
    url = f"s3://{bucket}/m.pte"
    loader = open_loader(
        url, **s3_server.storage_options, skip_instance_cache=True, **FAST_RETRY, **options
    )
    assert isinstance(loader, FsspecLoader)
    return loader, url


@pytest.mark.s3
@pytest.mark.parametrize("kind", ["reset", "500", "503"])
def test_a_failing_s3_read_makes_as_many_requests_as_the_retry_policy_says(
    s3_server: S3TestServer, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One retry layer: ``retry_attempts=3`` is 3 GetObject requests, not 3 x s3fs's 5 x
    botocore's 5 (75 for a dropped connection before s3fs's and botocore's retries
    were turned off), whatever the environment asks of botocore."""
    from writers.s3_faults import Fault

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")

    loader, url = _s3_loader(s3_server)
    fault = Fault("GetObject", kind, times=-1).install(loader.fs.s3)
    with pytest.raises(StorageError, match=rf"^{re.escape(url)}: read of 10 bytes at offset 0 "):
        loader.load(0, 10)
    assert fault.calls == 3
    head = Fault("HeadObject", kind, times=-1).install(loader.fs.s3)
    with pytest.raises(StorageError, match=rf"^{re.escape(url)}: stat failed: "):
        loader.check_unchanged()
    assert head.calls == 3


@pytest.mark.s3
@pytest.mark.parametrize("kind", ["reset", "500"])
def test_an_s3_read_that_fails_once_makes_two_requests(s3_server: S3TestServer, kind: str) -> None:
    from writers.s3_faults import Fault

    loader, _ = _s3_loader(s3_server)
    fault = Fault("GetObject", kind, times=1).install(loader.fs.s3)
    assert loader.load(len(DATA) - 8, 8) == DATA[-8:]
    assert (fault.calls, fault.injected) == (2, 1)
    head = Fault("HeadObject", kind, times=1).install(loader.fs.s3)
    loader.check_unchanged()
    assert (head.calls, head.injected) == (2, 1)


@pytest.mark.s3
def test_botocore_retries_given_in_config_kwargs_are_kept(s3_server: S3TestServer) -> None:
    """``config_kwargs`` with ``retries`` is the user's choice: botocore's attempts then
    multiply the policy's (2 x 3), and nothing else does."""
    from writers.s3_faults import Fault

    retries = {"total_max_attempts": 2, "mode": "standard"}
    loader, _ = _s3_loader(s3_server, config_kwargs={"retries": retries})
    assert loader.fs.s3.meta.config.retries == retries
    fault = Fault("GetObject", "500", times=-1).install(loader.fs.s3)
    with pytest.raises(StorageError, match=r"InternalError \(HTTP 500\)"):
        loader.load(0, 10)
    assert fault.calls == 6


def test_a_loader_s_repr_names_its_object_with_credentials_redacted(tmp_path: Path) -> None:
    f = tmp_path / "m.pte"
    f.write_bytes(b"x" * 10)
    with LocalFileLoader(f) as local:
        assert repr(local) == f"<LocalFileLoader {f}>"
    assert repr(BytesLoader(b"abc", name="mem.pte")) == "<BytesLoader mem.pte>"
    secret = BytesLoader(b"abc", name="https://h.example/m.pte?X-Amz-Signature=abcdef")
    assert "abcdef" not in repr(secret)
    assert repr(secret).startswith("<BytesLoader https://h.example/m.pte?X-Amz-Signature=")
