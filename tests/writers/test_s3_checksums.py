"""What each S3 server stores, returns and checks for each checksum algorithm.

As in test_s3_server_behaviour.py, every test asserts what AWS documents and is a strict
``s3_xfail`` on a server that differs, naming the difference (docs/storage.md has the
table). ptestore trusts an object by its stored checksum (tests/fleet/test_checksum_trust.py)
only in ways that hold on AWS; the gaps below cost a read there, never a wrong trust.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from support.s3clients import no_checksum_client

from ptestore.checksums import checksum_of, composite, encode
from ptestore.storage.s3checksum import stored_checksum
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3

MiB = 1 << 20
ALL = ("CRC32", "CRC32C", "CRC64NVME", "SHA256", "SHA1")
FULL_OBJECT_CRCS = ("CRC32", "CRC32C", "CRC64NVME")

MOTO_NO_CHECK = "moto accepts a wrong checksum"
MOTO_CRC32C_IS_CRC32 = "moto stores the CRC-32 of a multipart CRC32C object, not its CRC32C"
MOTO_NO_COMPOSITE = "moto returns a composite without its -N (and Complete returns none)"
MOTO_COMPOSITE_CRC64 = "moto accepts a COMPOSITE CRC64NVME upload (AWS: full object only)"
MOTO_NO_COPY_CHECKSUM = "moto returns no checksum for a part it copied"
MOTO_NO_PART_LIST = "moto lists no ObjectParts in GetObjectAttributes"
NO_DEFAULT = "S3 stores CRC64NVME for an upload that sends none; {} stores nothing"


def value(algorithm: str, data: bytes) -> str:
    return encode(algorithm, checksum_of(algorithm, data))


def head(c: Any, bucket: str, key: str, **kw: Any) -> dict[str, Any]:
    answer: dict[str, Any] = c.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED", **kw)
    return answer


def bad_digest(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    resp = exc.value.response
    return resp["ResponseMetadata"]["HTTPStatusCode"], resp["Error"]["Code"]


def multipart(
    c: Any, bucket: str, key: str, parts: list[bytes], algorithm: str, kind: str, **complete: Any
) -> dict[str, Any]:
    up = c.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm=algorithm, ChecksumType=kind
    )["UploadId"]
    listed = []
    for n, body in enumerate(parts, 1):
        field = {f"Checksum{algorithm}": value(algorithm, body)}
        r = c.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=body, **field)
        listed.append({"PartNumber": n, "ETag": r["ETag"], **field})
    answer: dict[str, Any] = c.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=up,
        MultipartUpload={"Parts": listed},
        ChecksumType=kind,
        **complete,
    )
    return answer


@pytest.fixture
def parts(s3_server: S3TestServer) -> list[bytes]:
    size = max(s3_server.min_part_size, 64 << 10)
    return [os.urandom(size), os.urandom(size), os.urandom(1234)]


@pytest.mark.parametrize("algorithm", ALL)
def test_put_object_stores_the_checksum_of_each_algorithm(
    s3_bucket: str, s3_client: Any, algorithm: str
) -> None:
    data = os.urandom(3000)
    s3_client.put_object(Bucket=s3_bucket, Key="k", Body=data, ChecksumAlgorithm=algorithm)
    stored = stored_checksum(head(s3_client, s3_bucket, "k"))
    assert stored is not None
    assert (stored.algorithm, stored.value, stored.parts) == (
        algorithm,
        value(algorithm, data),
        None,
    )
    # AWS says FULL_OBJECT; SeaweedFS and moto name no type for a PutObject
    assert stored.type in (None, "FULL_OBJECT")


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_CHECK)
@pytest.mark.parametrize("algorithm", ALL)
def test_put_object_with_a_wrong_checksum_is_bad_digest(
    s3_bucket: str, s3_client: Any, algorithm: str
) -> None:
    with pytest.raises(ClientError) as exc:
        s3_client.put_object(
            Bucket=s3_bucket,
            Key="k",
            Body=b"data",
            **{f"Checksum{algorithm}": value(algorithm, b"x")},
        )
    assert bad_digest(exc) == (400, "BadDigest")


@pytest.mark.parametrize(
    "algorithm",
    [
        "CRC32",
        pytest.param("CRC32C", marks=pytest.mark.s3_xfail("moto", reason=MOTO_CRC32C_IS_CRC32)),
        "CRC64NVME",
    ],
)
def test_full_object_multipart_stores_the_whole_objects_checksum(
    s3_bucket: str, s3_client: Any, parts: list[bytes], algorithm: str
) -> None:
    whole = b"".join(parts)
    multipart(
        s3_client,
        s3_bucket,
        "k",
        parts,
        algorithm,
        "FULL_OBJECT",
        **{f"Checksum{algorithm}": value(algorithm, whole)},
    )
    stored = stored_checksum(head(s3_client, s3_bucket, "k"))
    assert stored is not None
    assert (stored.algorithm, stored.value, stored.type, stored.parts) == (
        algorithm,
        value(algorithm, whole),
        "FULL_OBJECT",
        None,
    )


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_CHECK)
@pytest.mark.parametrize("algorithm", FULL_OBJECT_CRCS)
def test_a_wrong_full_object_checksum_at_complete_is_bad_digest(
    s3_bucket: str, s3_client: Any, parts: list[bytes], algorithm: str
) -> None:
    with pytest.raises(ClientError) as exc:
        multipart(
            s3_client,
            s3_bucket,
            "k",
            parts,
            algorithm,
            "FULL_OBJECT",
            **{f"Checksum{algorithm}": value(algorithm, b"not the object")},
        )
    assert bad_digest(exc) == (400, "BadDigest")


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_COMPOSITE)
@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "SHA256", "SHA1"])
def test_composite_multipart_stores_the_checksum_of_the_part_checksums(
    s3_bucket: str, s3_client: Any, parts: list[bytes], algorithm: str
) -> None:
    answer = multipart(s3_client, s3_bucket, "k", parts, algorithm, "COMPOSITE")
    want = composite(algorithm, [checksum_of(algorithm, p) for p in parts])
    assert answer[f"Checksum{algorithm}"] == want
    stored = stored_checksum(head(s3_client, s3_bucket, "k"))
    assert stored is not None
    assert (f"{stored.value}-{stored.parts}", stored.type) == (want, "COMPOSITE")


@pytest.mark.s3_xfail("moto", reason=MOTO_COMPOSITE_CRC64)
def test_crc64nvme_is_full_object_only(s3_bucket: str, s3_client: Any) -> None:
    with pytest.raises(ClientError) as exc:
        s3_client.create_multipart_upload(
            Bucket=s3_bucket, Key="k", ChecksumAlgorithm="CRC64NVME", ChecksumType="COMPOSITE"
        )
    assert bad_digest(exc)[0] == 400


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_COPY_CHECKSUM)
@pytest.mark.parametrize("algorithm", FULL_OBJECT_CRCS)
def test_a_copied_part_returns_its_checksum(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, algorithm: str
) -> None:
    source = os.urandom(max(s3_server.min_part_size, 5 * MiB) + 4096)
    s3_client.put_object(Bucket=s3_bucket, Key="src", Body=source)
    up = s3_client.create_multipart_upload(
        Bucket=s3_bucket, Key="k", ChecksumAlgorithm=algorithm, ChecksumType="FULL_OBJECT"
    )["UploadId"]
    try:
        first, last = 1000, len(source) - 1
        r = s3_client.upload_part_copy(
            Bucket=s3_bucket,
            Key="k",
            UploadId=up,
            PartNumber=1,
            CopySource={"Bucket": s3_bucket, "Key": "src"},
            CopySourceRange=f"bytes={first}-{last}",
        )
        got = r["CopyPartResult"].get(f"Checksum{algorithm}")
        assert got == value(algorithm, source[first : last + 1])
    finally:
        s3_client.abort_multipart_upload(Bucket=s3_bucket, Key="k", UploadId=up)


def test_part_one_tells_its_size_and_the_part_count(
    s3_bucket: str, s3_client: Any, parts: list[bytes]
) -> None:
    multipart(s3_client, s3_bucket, "k", parts, "CRC32", "COMPOSITE")
    one = s3_client.head_object(Bucket=s3_bucket, Key="k", PartNumber=1)
    assert (one["ContentLength"], one["PartsCount"]) == (len(parts[0]), len(parts))


@pytest.mark.s3_xfail("moto", reason=MOTO_NO_PART_LIST)
def test_get_object_attributes_lists_the_part_sizes(
    s3_bucket: str, s3_client: Any, parts: list[bytes]
) -> None:
    multipart(s3_client, s3_bucket, "k", parts, "CRC32", "COMPOSITE")
    answer = s3_client.get_object_attributes(
        Bucket=s3_bucket, Key="k", ObjectAttributes=["ObjectParts"]
    )
    listed = answer["ObjectParts"]["Parts"]
    assert [p["Size"] for p in listed] == [len(p) for p in parts]


@pytest.mark.s3_xfail("moto", reason=NO_DEFAULT.format("moto"))
@pytest.mark.s3_xfail("seaweedfs", reason=NO_DEFAULT.format("SeaweedFS 4.48"))
def test_an_upload_without_a_checksum_gets_crc64nvme(
    s3_server: S3TestServer, s3_bucket: str
) -> None:
    bare = no_checksum_client(s3_server.storage_options)
    data = os.urandom(2000)
    key = uuid.uuid4().hex
    bare.put_object(Bucket=s3_bucket, Key=key, Body=data)
    stored = stored_checksum(head(bare, s3_bucket, key))
    assert stored is not None and (stored.algorithm, stored.value) == (
        "CRC64NVME",
        value("CRC64NVME", data),
    )
