"""Every read of an S3 source is pinned to the version its loader opened (``If-Match``,
``VersionId``) and the answer's ETag is compared with it: a source replaced while it is
read, even one put back before the end (A, B, A), fails the read instead of giving bytes
of B that ``check_unchanged`` cannot see. On moto and SeaweedFS."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError
from support.fixtures import get_fixture
from support.large import inflate

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import BackendError, ConfigurationError, PreconditionFailed
from ptestore.storage.loaders import WHOLE_READ_LIMIT, FsspecLoader, open_loader
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3

SIZE = 2 * WHOLE_READ_LIMIT  # above the whole-read limit: every load is a ranged read
A = random.Random(1).randbytes(SIZE)
B = random.Random(2).randbytes(SIZE)
# A client of its own (s3fs shares filesystems per option set): hooks stay in the test.
OWN = {"skip_instance_cache": True, "retry_initial": 0.001, "retry_max": 0.01}


def _open(s3_server: S3TestServer, bucket: str, key: str = "m.pte") -> FsspecLoader:
    loader = open_loader(f"s3://{bucket}/{key}", **s3_server.storage_options, **OWN)
    assert isinstance(loader, FsspecLoader)
    return loader


def _gets(loader: FsspecLoader) -> list[dict[str, Any]]:
    """The parameters of every GetObject the loader sends from now on."""
    seen: list[dict[str, Any]] = []
    loader.fs.s3.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: seen.append(dict(params))
    )
    return seen


def _sends(loader: FsspecLoader) -> list[str]:
    """One entry per GetObject request that leaves the client (retries included)."""
    sent: list[str] = []
    loader.fs.s3.meta.events.register(
        "before-send.s3.GetObject", lambda request, **_: sent.append(request.url)
    )
    return sent


def test_every_read_is_pinned_to_the_version_opened(s3_server: S3TestServer) -> None:
    client = s3_server.client()
    plain = s3_server.new_bucket()
    etag = client.put_object(Bucket=plain, Key="big.pte", Body=A)["ETag"]
    client.put_object(Bucket=plain, Key="small.pte", Body=A[:1000])
    big = _open(s3_server, plain, "big.pte")
    seen = _gets(big)
    assert big.load(0, 10) == A[:10] and big.load(SIZE - 10, 10) == A[-10:]
    assert [(p["Key"], p["Range"], p["IfMatch"]) for p in seen] == [
        ("big.pte", "bytes=0-9", etag),
        ("big.pte", f"bytes={SIZE - 10}-{SIZE - 1}", etag),
    ]
    assert all("VersionId" not in p for p in seen)
    small = _open(s3_server, plain, "small.pte")
    seen = _gets(small)
    small.load(0, 4)
    assert small.load(10, 4) == A[10:14] and small.in_memory  # the whole-object read
    assert [(p["Range"], p["IfMatch"]) for p in seen] == [
        ("bytes=0-3", small.etag),
        ("bytes=0-999", small.etag),
    ]
    assert small.bytes_fetched == 4 + 1000

    versioned = s3_server.new_bucket()
    client.put_bucket_versioning(Bucket=versioned, VersioningConfiguration={"Status": "Enabled"})
    put = client.put_object(Bucket=versioned, Key="m.pte", Body=A)
    loader = _open(s3_server, versioned)
    assert (loader.etag, loader.version_id) == (put["ETag"], put["VersionId"])
    seen = _gets(loader)
    loader.load(5, 5)
    assert [(p["IfMatch"], p["VersionId"]) for p in seen] == [(put["ETag"], put["VersionId"])]


def test_a_source_replaced_and_put_back_fails_the_read(s3_server: S3TestServer) -> None:
    """A, B, A: the ETag at the end is the one opened, so ``check_unchanged`` passes;
    the read made while B was there is what must fail (a 412, not retried)."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/m.pte"
    etag = client.put_object(Bucket=bucket, Key="m.pte", Body=A)["ETag"]
    loader = _open(s3_server, bucket)
    assert loader.load(0, 1024) == A[:1024]
    new = client.put_object(Bucket=bucket, Key="m.pte", Body=B)["ETag"]
    sent = _sends(loader)
    with pytest.raises(PreconditionFailed) as info:
        loader.load(1024, 1024)
    assert str(info.value) == (
        f"{url}: replaced while being read: the read of 1024 bytes at offset 1024, pinned "
        f"to ETag {etag}, answered 412 (the object's ETag is now {new}); the read stops "
        "instead of mixing two versions"
    )
    assert (info.value.url, info.value.expected, info.value.found) == (url, etag, new)
    assert len(sent) == 1  # a replaced source is not a transient failure
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    loader.check_unchanged()  # what the end of a run sees: A again
    assert loader.load(1024, 1024) == A[1024:2048]


@pytest.mark.parametrize("longer", [0, 100])
def test_a_server_that_ignores_if_match_is_caught_by_the_answers_etag(
    s3_server: S3TestServer, longer: int
) -> None:
    """Whatever a server does with If-Match, the ETag of its answer is compared; also for
    a replacement of another size (its answer's total, checked first on S3 too, made it a
    StorageError: verify's "changed while being verified" needs PreconditionFailed)."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    etag = client.put_object(Bucket=bucket, Key="m.pte", Body=A)["ETag"]
    loader = _open(s3_server, bucket)
    loader.fs.s3.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: params.pop("IfMatch", None)
    )
    assert loader.load(0, 8) == A[:8]
    new = client.put_object(Bucket=bucket, Key="m.pte", Body=B + b"x" * longer)["ETag"]
    with pytest.raises(PreconditionFailed) as info:
        loader.load(8, 8)
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: replaced while being read: the read of 8 bytes at offset 8, "
        f"pinned to ETag {etag}, answered another ETag (the object's ETag is now {new}); "
        "the read stops instead of mixing two versions"
    )
    assert info.value.refused_by == "ptestore"


def test_an_answer_holding_another_range_is_refused_as_such(s3_server: S3TestServer) -> None:
    """A ranged read answered with another range of the same length (something between
    the client and the store that shifts it): its bytes are refused, naming the range
    asked for and the one received, never returned as the bytes asked for."""
    from ptestore.errors import IntegrityError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    loader = _open(s3_server, bucket)

    def shift(params: dict[str, Any], **_: Any) -> None:  # bytes=100-4195 -> 108-4203
        first, last = (int(x) for x in params["Range"].removeprefix("bytes=").split("-"))
        params["Range"] = f"bytes={first + 8}-{last + 8}"

    loader.fs.s3.meta.events.register("before-parameter-build.s3.GetObject", shift)
    sent = _sends(loader)
    with pytest.raises(IntegrityError) as info:
        loader.load(100, 4096)
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: asked the server for Range: bytes=100-4195, it answered "
        f"Content-Range: bytes 108-4203/{SIZE}: another range than the one asked for; its "
        "bytes are refused"
    )
    assert info.value.published is False and len(sent) == 1  # not asked again


#: What a proxy streams for a ranged GET: more than any read asks for, in 1 MiB pieces.
ENDLESS_PIECES = 128


def _endless(
    method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
) -> tuple[dict[str, str], bytes | Iterator[bytes]]:
    """A ranged GET answered with its own headers (206, its Content-Range) and a body
    that goes on and on (128 MiB: the client must hang up long before)."""
    if method != "GET" or not asks.get("Range", asks.get("range")):
        return headers, body
    out = {k: v for k, v in headers.items() if k.lower() != "content-length"}
    return out, (body + bytes(1 << 20) for _ in range(ENDLESS_PIECES))


def test_a_ranged_read_holds_no_more_than_it_asked_for(s3_server: S3TestServer) -> None:
    """A ranged GET answered with an endless body (a proxy, a compromised store): the
    loader reads the range and one byte more, then hangs up; an IntegrityError names the
    object, the range and the bytes read, never a body held whole in memory (it was:
    ``body.read()``, 0.9 GB until a MemoryError). Not asked again."""
    from support.faulty_proxy import faulty_proxy

    from ptestore.errors import IntegrityError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        loader = open_loader(
            f"s3://{bucket}/m.pte", **{**s3_server.storage_options, "endpoint_url": endpoint}, **OWN
        )
        assert isinstance(loader, FsspecLoader)
        sent = _sends(loader)
        proxy.answer = _endless
        with pytest.raises(IntegrityError) as info:
            loader.load(100, 4096)
        written = proxy.streamed.get(timeout=60)  # the proxy's stream ended
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: asked the server for Range: bytes=100-4195 (4096 bytes), its "
        "answer is longer: read no further than 4097 bytes, the rest left unread; its bytes "
        "are refused"
    )
    assert info.value.published is False and len(sent) == 1  # not asked again
    # The client hung up: what left the proxy is what the socket buffers took, far
    # short of the 128 MiB it would have sent.
    assert written < ENDLESS_PIECES * (1 << 20) // 4, written


def test_a_versioned_source_is_read_at_its_version(s3_server: S3TestServer) -> None:
    """A newer version stored (and deleted again) while the source is read: every read
    still gets the version opened; a new version of the same bytes is a change."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    first = client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    loader = _open(s3_server, bucket)
    assert loader.load(0, 1024) == A[:1024]
    newer = client.put_object(Bucket=bucket, Key="m.pte", Body=B)["VersionId"]
    assert loader.load(1024, 1024) == A[1024:2048]  # not B's bytes
    client.delete_object(Bucket=bucket, Key="m.pte", VersionId=newer)
    loader.check_unchanged()
    again = client.put_object(Bucket=bucket, Key="m.pte", Body=A)  # same bytes, same ETag
    assert again["ETag"] == first["ETag"]
    with pytest.raises(PreconditionFailed) as info:
        loader.check_unchanged()
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: replaced while being read (size {SIZE} -> {SIZE}, etag "
        f"{first['ETag']} -> {first['ETag']}, version {first['VersionId']} -> "
        f"{again['VersionId']}); its content may be a mix of two versions"
    )


def test_the_checksum_head_of_a_versioned_source_asks_for_the_version_opened(
    s3_server: S3TestServer,
) -> None:
    """The stored checksum a source is trusted by is the opened version's: a newer
    version stored since answered the HEAD (another ETag), and a read followed."""
    from ptestore.storage.s3checksum import s3_object

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    first = client.put_object(Bucket=bucket, Key="m.pte", Body=A, ChecksumAlgorithm="CRC32")
    loader = _open(s3_server, bucket)
    client.put_object(Bucket=bucket, Key="m.pte", Body=B, ChecksumAlgorithm="CRC32")
    obj = s3_object(loader)
    assert obj is not None and obj.version == first["VersionId"]
    stored = obj.checksum()
    assert stored is not None and stored.value == first["ChecksumCRC32"]


def test_a_transient_failure_of_a_pinned_read_is_retried(s3_server: S3TestServer) -> None:
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    loader = _open(s3_server, bucket)
    sent: list[str] = []

    def drop_first(request: Any, **_: Any) -> None:
        sent.append(request.url)
        if len(sent) == 1:
            raise ConnectionClosedError(endpoint_url=request.url)

    loader.fs.s3.meta.events.register("before-send.s3.GetObject", drop_first)
    assert loader.load(100, 4096) == A[100:4196]
    assert len(sent) >= 2
    assert loader.bytes_fetched == 4096


def test_a_key_s3fs_would_read_as_a_version_is_refused() -> None:
    """s3fs cuts ``?versionId=`` out of a key: ``m?versionId=abc.pte`` would be read as
    version ``abc.pte`` of ``m`` (or ``m`` itself). Refused before any request."""
    url = "s3://bucket/dir/m?versionId=abc.pte"
    with pytest.raises(ConfigurationError) as info:
        open_loader(url, endpoint_url="http://127.0.0.1:9", key="k", secret="s")
    assert str(info.value) == (
        f"{url}: an S3 key containing '?versionId=' cannot be read: s3fs takes what follows "
        "it for a version id of the key before it, and would read another object; rename "
        "the object"
    )


class _SwapWhileReading(BackendInterface):
    """Replaces the source by ``other`` (one byte different in ``key``'s value), reads
    ``key``, puts the original back, and writes the value it read, reversed."""

    name = "XnnpackBackend"

    def __init__(self, client: Any, bucket: str, original: bytes, other: bytes, key: str):
        self.client, self.bucket = client, bucket
        self.original, self.other, self.key = original, other, key

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        self.client.put_object(Bucket=self.bucket, Key="src.pte", Body=self.other)
        try:
            value = bytes(context.get_named_data_map().get_data(self.key))
        finally:
            self.client.put_object(Bucket=self.bucket, Key="src.pte", Body=self.original)
        output.write_named_data(self.key, BackendData(value[::-1]))


def test_specialize_of_a_source_replaced_and_put_back_publishes_nothing(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    """The review's end-to-end case: before, the output held B's byte under a record
    naming A (its own ETag and digest)."""
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    src = tmp_path / "a.pte"
    inflate(fx.pte_path, src, 3 << 20)
    desc = ptestore.describe(src)
    entry = desc["named_data"][1]
    segment = next(s for s in desc["segments"] if s["index"] == entry["segment_index"])
    original = src.read_bytes()
    other = bytearray(original)
    other[segment["absolute_offset"] + segment["size"] // 2] ^= 0xFF
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="src.pte", Body=original)
    out = tmp_path / "out.pte"
    swap = _SwapWhileReading(client, bucket, original, bytes(other), entry["key"])
    # the read failed inside the backend's call: the storage's error, not the backend's
    with pytest.raises(PreconditionFailed) as info:
        ptestore.specialize(
            f"s3://{bucket}/src.pte",
            out,
            backends=[swap],
            storage_options=s3_server.storage_options,
        )
    assert not isinstance(info.value, BackendError)
    assert re.search(
        rf"s3://{bucket}/src\.pte: replaced while being read: the read of \d+ bytes at offset "
        r"\d+, pinned to ETag \S+, answered 412",
        str(info.value),
    )
    assert not out.exists()


def _via_proxy(s3_server: S3TestServer, endpoint: str, bucket: str) -> FsspecLoader:
    options = {**s3_server.storage_options, "endpoint_url": endpoint}
    loader = open_loader(f"s3://{bucket}/m.pte", **options, **OWN)
    assert isinstance(loader, FsspecLoader)
    return loader


def _without_etag(
    methods: set[str], seen: list[str]
) -> Any:  # the proxy's ``answer``: the ETag header dropped from answers of ``methods``
    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        seen.append(method)
        if method in methods:
            return {k: v for k, v in headers.items() if k.lower() != "etag"}, body
        return headers, body

    return answer


def test_an_object_whose_head_has_no_etag_is_not_read(s3_server: S3TestServer) -> None:
    """A ``HEAD`` answered without an ETag (a proxy that drops it, a store that cannot
    name versions): the loader read the object unpinned (no If-Match, and
    ``check_unchanged`` compared sizes only). Now a StorageError naming the object and
    the header, before any GET; the same for ``check_unchanged``'s HEAD."""
    from support.faulty_proxy import faulty_proxy

    from ptestore.errors import StorageError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    message = (
        f"s3://{bucket}/m.pte: the HeadObject answer has no ETag header: the object's "
        "version cannot be known, its bytes are not used"
    )
    seen: list[str] = []
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        proxy.answer = _without_etag({"HEAD"}, seen)
        with pytest.raises(StorageError) as info:
            _via_proxy(s3_server, endpoint, bucket)
        assert str(info.value) == message
        assert seen == ["HEAD"]  # no GET, nor a HEAD asked again
        proxy.answer = None
        loader = _via_proxy(s3_server, endpoint, bucket)
        assert loader.load(0, 8) == A[:8]
        proxy.answer = _without_etag({"HEAD"}, seen)
        with pytest.raises(StorageError) as info:
            loader.check_unchanged()
        assert str(info.value) == message
    assert not isinstance(info.value, PreconditionFailed)


def test_a_read_answered_without_an_etag_is_refused(s3_server: S3TestServer) -> None:
    """A GetObject answered without its ETag: the version it holds cannot be compared
    with the one opened (a server that ignores If-Match would go unseen). A StorageError
    naming the object and the header, as an index read's; not asked again."""
    from support.faulty_proxy import faulty_proxy

    from ptestore.errors import StorageError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    seen: list[str] = []
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        loader = _via_proxy(s3_server, endpoint, bucket)
        proxy.answer = _without_etag({"GET"}, seen)
        with pytest.raises(StorageError) as info:
            loader.load(100, 4096)
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: the GetObject answer has no ETag header: the object's "
        "version cannot be known, its bytes are not used"
    )
    assert seen == ["GET"]


def _whole_object(data: bytes) -> Any:
    """The proxy's ``answer`` and ``status`` of a server that ignores ``Range``: every
    GET answered 200 with ``data`` whole, no Content-Range."""

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method != "GET":
            return headers, body
        return {k: v for k, v in headers.items() if k.lower() != "content-range"}, data

    def status(method: str, path: str, asks: dict[str, str]) -> int | None:
        return 200 if method == "GET" else None

    return answer, status


def test_a_range_the_server_ignored_is_refused_as_such(s3_server: S3TestServer) -> None:
    """A ranged GET answered 200 with the whole object: refused, saying so (it said
    "with no Content-Range ...: another range"), read no further than the range and one
    byte, not asked again."""
    from support.faulty_proxy import faulty_proxy

    from ptestore.errors import IntegrityError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        loader = _via_proxy(s3_server, endpoint, bucket)
        sent = _sends(loader)
        proxy.answer, proxy.status = _whole_object(A)
        with pytest.raises(IntegrityError) as info:
            loader.load(100, 4096)
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: asked the server for Range: bytes=100-4195, it answered the "
        f"whole object ({SIZE} bytes, no Content-Range): the server ignored the range; its "
        "bytes are refused"
    )
    assert info.value.published is False and len(sent) == 1


def test_a_partial_answer_that_does_not_say_which_part_is_refused(
    s3_server: S3TestServer,
) -> None:
    """A 206 without its Content-Range (something between that drops the header): which
    bytes it holds is not said, so they are refused; it was called "the whole object"."""
    from support.faulty_proxy import faulty_proxy

    from ptestore.errors import IntegrityError

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="m.pte", Body=A)

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        return {k: v for k, v in headers.items() if k.lower() != "content-range"}, body

    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        loader = _via_proxy(s3_server, endpoint, bucket)
        sent = _sends(loader)
        proxy.answer = answer
        with pytest.raises(IntegrityError) as info:
            loader.load(100, 4096)
    assert str(info.value) == (
        f"s3://{bucket}/m.pte: asked the server for Range: bytes=100-4195, it answered HTTP "
        "206 with no Content-Range (4096 bytes): not the range asked for; its bytes are "
        "refused"
    )
    assert info.value.published is False and len(sent) == 1
