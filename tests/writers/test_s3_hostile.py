"""The S3 writer against a store, or something between it and the client, that answers
what S3 never does (through ``tests/support/faulty_proxy.py``, on moto and SeaweedFS):
an ``UploadPart`` answer without its ETag, or with one no store gives; a copy source's
ranged ``GetObject`` answered with an endless body, with the whole object (the range
ignored), without its ETag or with another one. And the one retry layer on the writer's
requests: ``retry_attempts=3`` is 3 requests of a failing ``UploadPart``,
``UploadPartCopy``, source ``GetObject`` or ``CompleteMultipartUpload``, never more
(s3fs's and botocore's own retries off)."""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError
from support.faulty_proxy import FaultState, faulty_proxy

from ptestore._text import shown
from ptestore.errors import IntegrityError, PreconditionFailed, StorageError
from ptestore.storage.loaders import FsspecLoader, open_loader
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, WriterState, open_writer
from ptestore.writers.s3 import MIN_PART_SIZE

from .s3_faults import error_response

pytestmark = pytest.mark.s3

P = MIN_PART_SIZE
#: Fast retries (no wall-clock waits); a client of its own: hooks stay in the test.
FAST = {"retry_initial": 0.001, "retry_max": 0.01, "skip_instance_cache": True}
#: A small copy source: its ranges are read by the writer (S3 copies only from > 5 MiB).
SMALL = random.Random(7).randbytes(1000)


class Store:
    """A bucket on the server under test, reached through a proxy that may change answers."""

    def __init__(self, server: S3TestServer, endpoint: str, proxy: FaultState) -> None:
        self.server, self.proxy = server, proxy
        self.bucket = server.new_bucket()
        self.client = server.client()
        self.options = {**server.storage_options, "endpoint_url": endpoint, **FAST}
        self.url = f"s3://{self.bucket}/out/{uuid.uuid4().hex}.pte"

    def writer(self, **kw: Any) -> S3Writer:
        w = open_writer(self.url, part_size=P, **self.options, **kw)
        assert isinstance(w, S3Writer)
        return w

    def source(self, data: bytes) -> FsspecLoader:
        """An S3 loader of ``data`` through the proxy (the writer's endpoint and
        credentials: its ranges are the writer's to read or copy)."""
        key = f"src/{uuid.uuid4().hex}.pte"
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        loader = open_loader(f"s3://{self.bucket}/{key}", **self.options)
        assert isinstance(loader, FsspecLoader)
        return loader

    def nothing_left(self, w: S3Writer) -> bool:
        """The writer discarded, its upload aborted, nothing published."""
        uploads = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=w.key)
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=w.key)
        return (
            w.state is WriterState.DISCARDED
            and not uploads.get("Uploads")
            and not listed.get("Contents")
        )


@pytest.fixture
def store(s3_server: S3TestServer) -> Iterator[Store]:
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        yield Store(s3_server, endpoint, proxy)


def _part(path: str) -> int | None:
    m = re.search(r"[?&]partNumber=(\d+)(&|$)", path)
    return int(m.group(1)) if m else None


def _three_parts(w: S3Writer) -> None:
    """Parts 1 and 2 uploaded as soon as written, the short part 3 at publish."""
    w.write(random.randbytes(2 * P + 100), 0)
    w.publish()


# -- UploadPart's ETag ---------------------------------------------------------------------

LONG_ETAG = '"' + "a" * 2000 + '"'


@pytest.mark.parametrize("etag", [None, "", LONG_ETAG], ids=["missing", "empty", "long"])
def test_an_upload_part_answer_without_a_usable_etag_is_a_storage_error(
    store: Store, etag: str | None
) -> None:
    """Part 2's ``UploadPart`` answered without its ETag (or an empty one, or 2,000
    characters): the writer read ``resp["ETag"]`` (a KeyError traceback) or sent the
    value on to CompleteMultipartUpload. Now a StorageError naming the object, the part
    and the header; the upload aborted, nothing published."""

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method != "PUT" or _part(path) != 2:
            return headers, body
        out = {k: v for k, v in headers.items() if k.lower() != "etag"}
        if etag is not None:
            out["ETag"] = etag
        return out, body

    store.proxy.answer = answer
    w = store.writer()
    with pytest.raises(StorageError) as info:
        _three_parts(w)
    if etag == LONG_ETAG:
        assert str(info.value) == (
            f"{w.url}: the UploadPart 2 answer's ETag header is malformed: {shown(etag)}: "
            "an ETag is at most 1024 printable ASCII characters; the part cannot be named "
            "in CompleteMultipartUpload, nothing is published"
        )
    else:
        assert str(info.value) == (
            f"{w.url}: the UploadPart 2 answer has no ETag header: the part cannot be named "
            "in CompleteMultipartUpload, nothing is published"
        )
    assert type(info.value) is StorageError
    store.proxy.answer = None
    assert store.nothing_left(w)


def test_a_part_copy_answer_without_its_etag_is_a_storage_error(store: Store) -> None:
    """UploadPartCopy of part 1 answered without ``CopyPartResult.ETag``: a StorageError
    naming the object, the part and the field (was "... returned no ETag"); nothing
    published."""
    big = store.source(random.randbytes(2 * P))

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        copy = {k.lower() for k in asks} & {"x-amz-copy-source"}
        if method == "PUT" and copy and _part(path) == 1:
            return headers, re.sub(rb"<ETag>[^<]*</ETag>", b"", body)
        return headers, body

    store.proxy.answer = answer
    w = store.writer()
    w.copy_from(big, 0, 2 * P, 0)
    with pytest.raises(StorageError) as info:
        w.publish()
    assert str(info.value) == (
        f"{w.url}: the UploadPartCopy 1 answer has no CopyPartResult.ETag: the part cannot "
        "be named in CompleteMultipartUpload, nothing is published"
    )
    assert type(info.value) is StorageError
    store.proxy.answer = None
    assert store.nothing_left(w)


def test_a_create_answer_without_an_upload_id_is_a_storage_error(store: Store) -> None:
    """CreateMultipartUpload answered without its UploadId: was ``resp["UploadId"]``, a
    KeyError traceback. Now a StorageError naming the object and the field; the upload
    the service made is left as an interrupted create leaves one (no parts, no marker)."""

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method == "POST" and re.search(r"[?&]uploads(=|&|$)", path):
            return headers, re.sub(rb"<UploadId>[^<]*</UploadId>", b"", body)
        return headers, body

    store.proxy.answer = answer
    w = store.writer()
    with pytest.raises(StorageError) as info:
        _three_parts(w)
    assert str(info.value) == (
        f"{w.url}: the CreateMultipartUpload answer has no UploadId: the upload cannot be "
        "used, nothing is published; an upload the service made stays pending (it has no "
        "gc marker part) until an AbortIncompleteMultipartUpload lifecycle rule removes it"
    )
    assert type(info.value) is StorageError and w.state is WriterState.DISCARDED
    store.proxy.answer = None
    left = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=w.key)["Uploads"]
    assert len(left) == 1
    upload = left[0]["UploadId"]
    parts = store.client.list_parts(Bucket=store.bucket, Key=w.key, UploadId=upload)
    assert not parts.get("Parts")
    assert not store.client.list_objects_v2(Bucket=store.bucket, Prefix=w.key).get("Contents")


# -- a copy source's ranged reads ------------------------------------------------------------

#: What the proxy streams for an endless body: 128 pieces of 1 MiB.
ENDLESS_PIECES = 128


def _source_gets(store: Store, change: Any) -> None:
    """``change(headers, body)`` applied to the answer of every ranged GET of a source."""

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], Any]:
        if method == "GET" and "/src/" in path and asks.get("Range", asks.get("range")):
            return change(headers, body)  # type: ignore[no-any-return]
        return headers, body

    store.proxy.answer = answer


def _read_into_part_2(store: Store, src: FsspecLoader, first: int, size: int) -> S3Writer:
    """A writer whose short last part is ``size`` bytes of ``src`` from ``first``: read
    by a ranged GET of the writer's client at publish (not copied: S3 copies ranges of
    larger objects only)."""
    w = store.writer()
    w.write(random.randbytes(P), 0)
    w.copy_from(src, first, size, P)
    return w


def _gets(w: S3Writer) -> list[str]:
    sent: list[str] = []
    w.client.meta.events.register(
        "before-send.s3.GetObject", lambda request, **_: sent.append(request.url)
    )
    return sent


def test_a_source_read_answered_with_an_endless_body_is_refused(store: Store) -> None:
    """The writer's ranged GET of a copy source answered with the range and then an
    endless body: it read the whole body (``body.read()``: 128 MiB here, without end on
    a real proxy) and called it a short read. Now the range and one byte are read, then
    an IntegrityError names the source and the range; not asked again."""
    src = store.source(SMALL)
    w = _read_into_part_2(store, src, 0, len(SMALL))
    sent = _gets(w)

    def endless(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], Any]:
        out = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        return out, (body + bytes(1 << 20) for _ in range(ENDLESS_PIECES))

    _source_gets(store, endless)
    with pytest.raises(IntegrityError) as info:
        w.publish()
    written = store.proxy.streamed.get(timeout=60)
    assert str(info.value) == (
        f"{src.name}: asked the server for Range: bytes=0-999 (1000 bytes), its answer is "
        "longer: read no further than 1001 bytes, the rest left unread; its bytes are refused"
    )
    assert info.value.published is False and len(sent) == 1
    assert written < ENDLESS_PIECES * (1 << 20) // 4, written
    store.proxy.answer = None
    assert store.nothing_left(w)


def test_a_source_range_the_server_ignored_is_refused_as_such(store: Store) -> None:
    """The source's ranged GET answered 200 with the whole object: it was "short read:
    wanted 500 bytes at offset 100, got 1000"; now what the loader says of such an
    answer, and the body is not read."""
    src = store.source(SMALL)
    w = _read_into_part_2(store, src, 100, 500)
    sent = _gets(w)
    _source_gets(
        store, lambda h, b: ({k: v for k, v in h.items() if k.lower() != "content-range"}, SMALL)
    )
    store.proxy.status = lambda method, path, asks: 200 if "/src/" in path else None
    with pytest.raises(IntegrityError) as info:
        w.publish()
    assert str(info.value) == (
        f"{src.name}: asked the server for Range: bytes=100-599, it answered the whole "
        "object (1000 bytes, no Content-Range): the server ignored the range; its bytes "
        "are refused"
    )
    assert info.value.published is False and len(sent) == 1
    store.proxy.answer = store.proxy.status = None
    assert store.nothing_left(w)


def test_a_source_read_without_its_etag_or_with_another_is_refused(store: Store) -> None:
    """The answer's ETag is compared with the one the source was opened with, whatever
    the server did with If-Match: none is a StorageError naming the source and the
    header, another a PreconditionFailed (it was accepted either way)."""
    src = store.source(SMALL)
    w = _read_into_part_2(store, src, 0, len(SMALL))
    _source_gets(store, lambda h, b: ({k: v for k, v in h.items() if k.lower() != "etag"}, b))
    with pytest.raises(StorageError) as info:
        w.publish()
    assert str(info.value) == (
        f"{src.name}: the GetObject answer has no ETag header: the object's version cannot "
        "be known, its bytes are not used"
    )
    assert type(info.value) is StorageError

    w = _read_into_part_2(store, src, 0, len(SMALL))
    _source_gets(store, lambda h, b: ({**h, "ETag": '"another"'}, b))
    with pytest.raises(PreconditionFailed) as replaced:
        w.publish()
    assert str(replaced.value) == (
        f"{src.name}: replaced since it was opened (ETag {src.etag} no longer matches; read "
        f'of 1000 bytes at offset 0 of {src.name} answered ETag "another"): the run stops '
        "instead of mixing two versions"
    )
    assert replaced.value.refused_by == "ptestore"
    store.proxy.answer = None
    assert store.nothing_left(w)


# -- one retry layer -------------------------------------------------------------------------


class _Failing:
    """Fails every attempt of one operation (of one part, when ``part`` is given) with
    ``kind``: ``"reset"`` (connection closed) or an S3 error of :mod:`.s3_faults`."""

    def __init__(self, kind: str, part: int | None = None) -> None:
        self.kind, self.part, self.calls = kind, part, 0

    def __call__(self, request: Any, **_: Any) -> Any:
        if self.part is not None and _part(request.url) != self.part:
            return None
        self.calls += 1
        if self.kind == "reset":
            raise ConnectionClosedError(endpoint_url=request.url)
        return error_response(request.url, self.kind)


@pytest.mark.parametrize("kind", ["reset", "500", "503"])
@pytest.mark.parametrize(
    "op", ["UploadPart", "UploadPartCopy", "GetObject", "CompleteMultipartUpload"]
)
def test_a_failing_request_of_the_writer_is_made_as_often_as_the_policy_says(
    store: Store, op: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retry_attempts=3``: each of the writer's requests that keeps failing is sent 3
    times (botocore's retries off, whatever the environment asks of botocore; s3fs's
    loop not on the writer's path), then the run fails and nothing is published."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    w = store.writer(retry_attempts=3)
    part = {"UploadPart": 2, "UploadPartCopy": 1}.get(op)
    failing = _Failing(kind, part)
    w.client.meta.events.register(f"before-send.s3.{op}", failing)
    if op == "UploadPartCopy":  # parts 1 and 2 copied by the service
        big = store.source(random.randbytes(2 * P))
        w.copy_from(big, 0, 2 * P, 0)
    elif op == "GetObject":  # part 2 read from a small source at publish
        w.write(random.randbytes(P), 0)
        w.copy_from(store.source(SMALL), 0, len(SMALL), P)
    else:
        w.write(random.randbytes(2 * P + 100), 0)
    with pytest.raises(StorageError):
        w.publish()
    assert failing.calls == 3
    assert store.nothing_left(w)


# -- an object read whole ----------------------------------------------------------------------


def test_a_whole_read_of_an_answer_without_its_length_is_refused_unread(store: Store) -> None:
    """``read_versioned(url)`` (no ``max_bytes``) of an answer that announces no length
    and never ends: its body was read whole (``body.read()``). Now nothing bounds it, so
    it is not read: a StorageError naming the object and the header. With ``max_bytes``
    it is read no further than the bound and one byte, and reported too large."""
    from ptestore.writers.versions import read_versioned

    key = f"idx/{uuid.uuid4().hex}.json"
    url = f"s3://{store.bucket}/{key}"
    store.client.put_object(Bucket=store.bucket, Key=key, Body=b"{}")

    def endless(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], Any]:
        if method != "GET" or not path.startswith(f"/{store.bucket}/idx/"):
            return headers, body
        out = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        return out, (body + bytes(1 << 20) for _ in range(ENDLESS_PIECES))

    store.proxy.answer = endless
    with pytest.raises(StorageError) as info:
        read_versioned(url, **store.options)
    written = store.proxy.streamed.get(timeout=60)
    assert str(info.value) == (
        f"{url}: the GetObject answer has no Content-Length header and no bound was asked "
        "for: its body is not read"
    )
    assert type(info.value) is StorageError
    assert written < ENDLESS_PIECES * (1 << 20) // 4, written
    bounded = read_versioned(url, max_bytes=64, **store.options)
    assert (bounded.data, bounded.oversize) == (b"", 65)
    assert store.proxy.streamed.get(timeout=60) < ENDLESS_PIECES * (1 << 20) // 4
