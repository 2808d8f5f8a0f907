"""The S3 behaviours ptestore relies on, pinned against each test server.

Every test asserts what AWS S3 documents. Where a server differs the test is a strict
``s3_xfail`` on that server, naming the difference: ptestore may rely only on the AWS
behaviour, so a gap of moto (a mock) never shapes the writer, and a test passing only on
moto proves nothing about it. The first group talks to the server with plain boto3; the
second drives S3Writer into the cases a real server enforces (checksums, a vanished
upload, racing Completes). docs/storage.md has the table; scripts/probe_s3.py prints it.
"""

from __future__ import annotations

import base64
import hashlib
import random
import threading
import uuid
import zlib
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ptestore.checksums import crc, encode
from ptestore.errors import AlreadyExists, StorageError
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import PublishResult, S3Writer, WriterState, open_writer
from ptestore.writers.s3 import MARKER_PART_NUMBER
from ptestore.writers.s3.checksum import WRITER_ALGORITHMS
from ptestore.writers.s3.config import MIN_PART_SIZE

pytestmark = pytest.mark.s3

MOTO_NO_COPY_CONDITIONS = "moto ignores x-amz-copy-source-if-match on UploadPartCopy"
MOTO_NO_CRC_CHECK = "moto accepts a wrong CRC32"
MOTO_NO_FULL_OBJECT_CHECK = "moto accepts a wrong FULL_OBJECT CRC32 at Complete"
MOTO_NO_COMPOSITE = "moto returns no checksum for a COMPOSITE multipart object"
MOTO_500_AFTER_ABORT = "moto answers 500 (a KeyError), not 404 NoSuchUpload, after Abort"
MOTO_IF_MATCH_COMPLETE = "moto ignores If-Match on CompleteMultipartUpload"
MOTO_NO_PAGINATION = "moto ignores MaxUploads on ListMultipartUploads"
MOTO_SMALL_PARTS = "the session's moto server lowers the 5 MiB minimum on purpose"


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    resp = exc.value.response
    return resp["ResponseMetadata"]["HTTPStatusCode"], resp["Error"]["Code"]


class Server:
    """A fresh bucket on the server under test and a few multipart helpers."""

    def __init__(self, server: S3TestServer, bucket: str, client: Any) -> None:
        self.server, self.bucket, self.c = server, bucket, client
        self.part = server.min_part_size  # the smallest non-last part it takes
        #: The writers' part size: S3's 5 MiB minimum, which S3Writer enforces.
        self.wpart = max(self.part, MIN_PART_SIZE)

    def key(self) -> str:
        return f"b/{uuid.uuid4().hex}"

    def mpu(self, key: str, bodies: list[bytes], **create: Any) -> tuple[str, list[dict[str, Any]]]:
        up: str = self.c.create_multipart_upload(Bucket=self.bucket, Key=key, **create)["UploadId"]
        parts = []
        for n, body in enumerate(bodies, 1):
            extra = {"ChecksumCRC32": crc32_b64(body)} if create else {}
            r = self.c.upload_part(
                Bucket=self.bucket, Key=key, UploadId=up, PartNumber=n, Body=body, **extra
            )
            parts.append({"PartNumber": n, "ETag": r["ETag"], **extra})
        return up, parts

    def complete(self, key: str, up: str, parts: list[dict[str, Any]], **kw: Any) -> Any:
        return self.c.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts}, **kw
        )

    def uploads(self, prefix: str) -> list[str]:
        resp = self.c.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return [u["UploadId"] for u in resp.get("Uploads", [])]

    def get(self, key: str) -> bytes | None:
        try:
            body: bytes = self.c.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.c.exceptions.NoSuchKey:
            return None
        return body


@pytest.fixture
def srv(s3_server: S3TestServer, s3_bucket: str, s3_client: Any) -> Server:
    return Server(s3_server, s3_bucket, s3_client)


# -- the server, through plain boto3 ------------------------------------------------


def test_put_if_none_match_over_existing_is_412(srv: Server) -> None:
    k = srv.key()
    srv.c.put_object(Bucket=srv.bucket, Key=k, Body=b"old")
    with pytest.raises(ClientError) as exc:
        srv.c.put_object(Bucket=srv.bucket, Key=k, Body=b"new", IfNoneMatch="*")
    assert error_of(exc) == (412, "PreconditionFailed")
    assert srv.get(k) == b"old"


def test_complete_if_none_match_over_existing_is_412(srv: Server) -> None:
    k = srv.key()
    srv.c.put_object(Bucket=srv.bucket, Key=k, Body=b"old")
    up, parts = srv.mpu(k, [b"new"])
    with pytest.raises(ClientError) as exc:
        srv.complete(k, up, parts, IfNoneMatch="*")
    assert error_of(exc) == (412, "PreconditionFailed")
    assert srv.get(k) == b"old"


@pytest.mark.s3_xfail("moto", reason=MOTO_IF_MATCH_COMPLETE)
def test_complete_if_match_wrong_etag_is_412(srv: Server) -> None:
    k = srv.key()
    srv.c.put_object(Bucket=srv.bucket, Key=k, Body=b"old")
    up, parts = srv.mpu(k, [b"new"])
    with pytest.raises(ClientError) as exc:
        srv.complete(k, up, parts, IfMatch='"' + "0" * 32 + '"')
    assert error_of(exc) == (412, "PreconditionFailed")
    assert srv.get(k) == b"old"


def test_racing_completes_have_a_winner_and_412_losers(srv: Server) -> None:
    """AWS documents one winner; no server here guarantees it (SeaweedFS and moto both
    let several Completes win), so this pins what they all do: at least one winner,
    every loser 412, and the object is exactly one writer's bytes."""
    k = srv.key()
    payloads = [[bytes([65 + i]) * srv.part, bytes([97 + i]) * 10] for i in range(3)]
    uploads = [srv.mpu(k, p) for p in payloads]
    barrier = threading.Barrier(len(uploads))
    results: list[object] = [None] * len(uploads)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = srv.complete(k, *uploads[i], IfNoneMatch="*")["ETag"]
        except ClientError as exc:
            results[i] = (exc.response["ResponseMetadata"]["HTTPStatusCode"],)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(uploads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, str)]
    assert winners, results
    assert all(r == (412,) for r in results if not isinstance(r, str)), results
    assert srv.get(k) in {b"".join(p) for p in payloads}


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_COPY_CONDITIONS)
def test_upload_part_copy_if_match_wrong_etag_is_412(srv: Server) -> None:
    src, dst = srv.key(), srv.key()
    srv.c.put_object(Bucket=srv.bucket, Key=src, Body=b"s" * 1000)
    up = srv.c.create_multipart_upload(Bucket=srv.bucket, Key=dst)["UploadId"]
    with pytest.raises(ClientError) as exc:
        srv.c.upload_part_copy(
            Bucket=srv.bucket,
            Key=dst,
            UploadId=up,
            PartNumber=1,
            CopySource={"Bucket": srv.bucket, "Key": src},
            CopySourceRange="bytes=0-99",
            CopySourceIfMatch='"' + "0" * 32 + '"',
        )
    assert error_of(exc) == (412, "PreconditionFailed")
    srv.c.abort_multipart_upload(Bucket=srv.bucket, Key=dst, UploadId=up)


def test_upload_part_copy_of_a_range_pinned_to_the_etag(srv: Server) -> None:
    src, dst = srv.key(), srv.key()
    data = random.randbytes(1000)
    etag = srv.c.put_object(Bucket=srv.bucket, Key=src, Body=data)["ETag"]
    up = srv.c.create_multipart_upload(Bucket=srv.bucket, Key=dst)["UploadId"]
    r = srv.c.upload_part_copy(
        Bucket=srv.bucket,
        Key=dst,
        UploadId=up,
        PartNumber=1,
        CopySource={"Bucket": srv.bucket, "Key": src},
        CopySourceRange="bytes=10-109",
        CopySourceIfMatch=etag,
    )
    srv.complete(dst, up, [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}])
    assert srv.get(dst) == data[10:110]


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_CRC_CHECK)
def test_upload_part_with_a_wrong_crc32_is_bad_digest(srv: Server) -> None:
    k = srv.key()
    up = srv.c.create_multipart_upload(Bucket=srv.bucket, Key=k, ChecksumAlgorithm="CRC32")
    with pytest.raises(ClientError) as exc:
        srv.c.upload_part(
            Bucket=srv.bucket,
            Key=k,
            UploadId=up["UploadId"],
            PartNumber=1,
            Body=b"x" * 100,
            ChecksumCRC32=crc32_b64(b"y"),
        )
    assert error_of(exc) == (400, "BadDigest")


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_FULL_OBJECT_CHECK)
def test_full_object_crc32_is_verified_at_complete(srv: Server) -> None:
    k = srv.key()
    bodies = [b"a" * srv.part, b"b" * 10]
    up, parts = srv.mpu(k, bodies, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
    with pytest.raises(ClientError) as exc:
        srv.complete(k, up, parts, ChecksumCRC32=crc32_b64(b"wrong"), ChecksumType="FULL_OBJECT")
    assert error_of(exc) == (400, "BadDigest")
    assert srv.get(k) is None
    right = crc32_b64(b"".join(bodies))
    srv.complete(k, up, parts, ChecksumCRC32=right, ChecksumType="FULL_OBJECT")
    head = srv.c.head_object(Bucket=srv.bucket, Key=k, ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (right, "FULL_OBJECT")


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_COMPOSITE)
def test_composite_checksum_is_returned_for_multipart(srv: Server) -> None:
    k = srv.key()
    bodies = [b"a" * srv.part, b"b" * 10]
    up, parts = srv.mpu(k, bodies, ChecksumAlgorithm="CRC32")
    crcs = b"".join(zlib.crc32(b).to_bytes(4, "big") for b in bodies)
    want = f"{crc32_b64(crcs)}-2"
    assert srv.complete(k, up, parts).get("ChecksumCRC32") == want
    head = srv.c.head_object(Bucket=srv.bucket, Key=k, ChecksumMode="ENABLED")
    assert (head.get("ChecksumCRC32"), head.get("ChecksumType")) == (want, "COMPOSITE")


@pytest.mark.s3_xfail("moto", reason=MOTO_500_AFTER_ABORT)
def test_upload_part_after_abort_is_no_such_upload(srv: Server) -> None:
    k = srv.key()
    up, _ = srv.mpu(k, [b"a"])
    srv.c.abort_multipart_upload(Bucket=srv.bucket, Key=k, UploadId=up)
    with pytest.raises(ClientError) as exc:
        srv.c.upload_part(Bucket=srv.bucket, Key=k, UploadId=up, PartNumber=2, Body=b"late")
    assert error_of(exc) == (404, "NoSuchUpload")
    with pytest.raises(ClientError) as exc:
        srv.c.list_parts(Bucket=srv.bucket, Key=k, UploadId=up)
    assert error_of(exc) == (404, "NoSuchUpload")


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_PAGINATION)
def test_list_multipart_uploads_by_prefix_and_pages(srv: Server) -> None:
    base = srv.key()
    ups = [
        srv.c.create_multipart_upload(Bucket=srv.bucket, Key=f"{base}/{i}")["UploadId"]
        for i in range(3)
    ]
    srv.c.create_multipart_upload(Bucket=srv.bucket, Key=f"{base}-other")
    assert sorted(srv.uploads(f"{base}/")) == sorted(ups)
    page = srv.c.list_multipart_uploads(Bucket=srv.bucket, Prefix=f"{base}/", MaxUploads=2)
    assert (len(page["Uploads"]), page["IsTruncated"]) == (2, True)


@pytest.mark.s3_xfail("moto", reason=MOTO_SMALL_PARTS)
def test_non_last_part_under_5_mib_is_entity_too_small(srv: Server) -> None:
    k = srv.key()
    up, parts = srv.mpu(k, [b"a" * ((5 << 20) - 1), b"b"])
    with pytest.raises(ClientError) as exc:
        srv.complete(k, up, parts)
    assert error_of(exc) == (400, "EntityTooSmall")


def test_gaps_in_part_numbers_and_part_10000(srv: Server) -> None:
    """ptestore's data parts may skip numbers and its gc marker is part 10000."""
    k = srv.key()
    up = srv.c.create_multipart_upload(Bucket=srv.bucket, Key=k)["UploadId"]
    parts = []
    for n, body in ((3, b"a" * srv.part), (10000, b"z")):
        r = srv.c.upload_part(Bucket=srv.bucket, Key=k, UploadId=up, PartNumber=n, Body=body)
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    listed = srv.c.list_parts(Bucket=srv.bucket, Key=k, UploadId=up)["Parts"]
    assert [p["PartNumber"] for p in listed] == [3, 10000]
    srv.complete(k, up, parts)
    assert srv.get(k) == b"a" * srv.part + b"z"


def test_ranged_get(srv: Server) -> None:
    k = srv.key()
    data = random.randbytes(1024)
    srv.c.put_object(Bucket=srv.bucket, Key=k, Body=data)
    r = srv.c.get_object(Bucket=srv.bucket, Key=k, Range="bytes=10-19")
    assert (r["ResponseMetadata"]["HTTPStatusCode"], r["Body"].read()) == (206, data[10:20])
    assert r["ContentRange"] == "bytes 10-19/1024"
    tail = srv.c.get_object(Bucket=srv.bucket, Key=k, Range="bytes=1020-5000")
    assert tail["Body"].read() == data[1020:]
    with pytest.raises(ClientError) as exc:
        srv.c.get_object(Bucket=srv.bucket, Key=k, Range="bytes=5000-5001")
    assert error_of(exc) == (416, "InvalidRange")


def test_etags_single_put_md5_and_multipart_md5_of_md5s(srv: Server) -> None:
    k, k2 = srv.key(), srv.key()
    assert srv.c.put_object(Bucket=srv.bucket, Key=k, Body=b"hello")["ETag"] == (
        f'"{hashlib.md5(b"hello").hexdigest()}"'
    )
    bodies = [b"a" * srv.part, b"b" * 10]
    up, parts = srv.mpu(k2, bodies)
    digest = hashlib.md5(b"".join(hashlib.md5(b).digest() for b in bodies)).hexdigest()
    assert srv.complete(k2, up, parts)["ETag"] == f'"{digest}-2"'


# -- S3Writer against what a real server enforces -------------------------------------


def _writer(srv: Server, url: str) -> S3Writer:
    w = open_writer(
        url,
        **srv.server.storage_options,
        part_size=srv.wpart,
        retry_attempts=2,
        retry_initial=0.001,
        retry_max=0.01,
    )
    assert isinstance(w, S3Writer)
    return w


def _corrupt_body(params: dict[str, Any], **_: Any) -> None:
    """Flip one byte of the body after the writer computed its checksum (data parts
    only: the gc marker part is left alone)."""
    if params.get("PartNumber") == MARKER_PART_NUMBER:
        return
    body = bytearray(params["Body"])
    body[len(body) // 2] ^= 0xFF
    params["Body"] = bytes(body)


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_CRC_CHECK + " (the corrupted part is published)")
@pytest.mark.parametrize("operation", ["UploadPart", "PutObject"])
def test_bytes_corrupted_after_their_checksum_are_never_published(
    srv: Server, operation: str
) -> None:
    k = srv.key()
    w = _writer(srv, f"s3://{srv.bucket}/{k}")
    w.client.meta.events.register(f"before-parameter-build.s3.{operation}", _corrupt_body)
    size = 2 * srv.wpart + 7 if operation == "UploadPart" else 1000

    def write_and_publish() -> None:
        w.write(random.randbytes(size), 0)  # a part's upload may fail already here
        w.publish()

    with pytest.raises(StorageError, match=rf"{operation}( 1)? failed: BadDigest \(HTTP 400\)"):
        write_and_publish()
    assert w.state is WriterState.DISCARDED
    assert srv.get(k) is None
    assert srv.uploads(k) == []


def _wrong_full_object_crc(params: dict[str, Any], **_: Any) -> None:
    for algorithm in WRITER_ALGORITHMS:  # the writer's algorithm (CRC64NVME by default)
        if f"Checksum{algorithm}" in params:
            params[f"Checksum{algorithm}"] = encode(algorithm, crc(algorithm, b"not the object"))


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_FULL_OBJECT_CHECK + " (the object is published)")
def test_full_object_checksum_mismatch_at_complete_publishes_nothing(srv: Server) -> None:
    k = srv.key()
    w = _writer(srv, f"s3://{srv.bucket}/{k}")
    w.client.meta.events.register(
        "before-parameter-build.s3.CompleteMultipartUpload", _wrong_full_object_crc
    )
    w.write(random.randbytes(2 * srv.wpart + 7), 0)
    with pytest.raises(
        StorageError, match=r"CompleteMultipartUpload failed: BadDigest \(HTTP 400\)"
    ):
        w.publish()
    assert srv.get(k) is None
    assert srv.uploads(k) == []


@pytest.mark.s3_xfail("moto", reason=MOTO_500_AFTER_ABORT + " (retried as transient)")
def test_upload_aborted_by_someone_else_fails_with_no_such_upload(srv: Server) -> None:
    k = srv.key()
    w = _writer(srv, f"s3://{srv.bucket}/{k}")
    calls: list[str] = []

    def count(request: Any, **_: Any) -> None:
        calls.append(request.url)

    w.client.meta.events.register("before-send.s3.UploadPart", count)
    w.write(random.randbytes(srv.wpart), 0)
    w.wait_uploads()
    assert w.upload_id is not None
    srv.c.abort_multipart_upload(Bucket=srv.bucket, Key=k, UploadId=w.upload_id)  # e.g. gc
    before = len(calls)
    w.write(random.randbytes(srv.wpart), srv.wpart)
    with pytest.raises(StorageError, match=r"UploadPart 2 failed: NoSuchUpload \(HTTP 404\)"):
        w.publish()
    assert len(calls) - before == 1  # a permanent error: not retried
    assert srv.get(k) is None


def test_racing_multipart_creates_have_a_winner_and_clean_losers(srv: Server) -> None:
    k = srv.key()
    url = f"s3://{srv.bucket}/{k}"
    payloads = [bytes([65 + i]) * (2 * srv.wpart + i) for i in range(3)]
    writers = [_writer(srv, url) for _ in payloads]
    for w, data in zip(writers, payloads, strict=True):
        w.write(data, 0)
        w.wait_uploads()
    barrier = threading.Barrier(len(writers))
    results: list[object] = [None] * len(writers)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = writers[i].publish("create")
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if isinstance(r, PublishResult)]
    assert winners, results
    assert all(isinstance(r, AlreadyExists) for r in results if not isinstance(r, PublishResult))
    assert srv.get(k) in {payloads[i] for i in winners}
    assert srv.uploads(k) == []
