"""Trusting an S3 object by the checksum the server keeps (fleet/binding.py), on moto and
SeaweedFS: every way an object is commonly uploaded, each algorithm, and damaged bytes
of the right size, which are never trusted.

The object is what the binding checks: a content (random bytes, hashed as a run records
them, :class:`ContentHasher`) followed by a tail (a trailer's bytes), or a content alone
(a shared .ptd). ``trusted`` True means "no read needed", None "read once", False "not
these bytes".
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from support.fixtures import get_fixture
from support.s3clients import no_checksum_client

from ptestore.checksums import checksum_of, encode
from ptestore.fleet.binding import HeadVerdict, bytes_mismatch, content_verdict, trust_by_head
from ptestore.provenance import Provenance, read_trailer
from ptestore.provenance.crcs import LOCAL_CRCS, STORE_CRCS, expected_checksums
from ptestore.provenance.digest import ContentHasher
from ptestore.provenance.record import ContentDigest
from ptestore.storage.loaders import open_loader
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer

pytestmark = pytest.mark.s3

MiB = 1 << 20
#: boto3's and the AWS CLI's default part size: two 4 MiB chunks of the record's grid.
PART = 8 * MiB
CONTENT = PART + 3 * MiB + 12345  # two parts, the second holding the tail too
TAIL = os.urandom(2500)

MOTO_CRC32C_IS_CRC32 = "moto stores the CRC-32 of a multipart CRC32C object, not its CRC32C"
MOTO_NO_STORED = "moto stores no checksum sent as a value (only one sent as a trailer)"


def digest(
    content: bytes, crcs: tuple[str, ...] = STORE_CRCS, *, whole: bool = False
) -> ContentDigest:
    """The content's digest as a run records it for an output to S3 (every CRC), or
    with ``crcs=LOCAL_CRCS`` for a local output (the per-chunk CRC-32 only); ``whole``:
    as a record of version 1 or 2 names it (the whole SHA-256, not the chunk root)."""
    h = ContentHasher(len(content), crcs=crcs, whole=whole)
    h.update(content)
    return h.digest()


class Bucket:
    def __init__(self, server: S3TestServer) -> None:
        self.server = server
        self.c = server.client()
        self.name = server.new_bucket()

    def loader(self, key: str) -> Any:
        return open_loader(f"s3://{self.name}/{key}", **self.server.storage_options)

    def judge(
        self, key: str, content: bytes, tail: bytes = TAIL, *, whole: bool = False
    ) -> HeadVerdict:
        loader = self.loader(key)
        try:
            if not tail:
                return content_verdict(loader, digest(content, whole=whole))
            return trust_by_head(loader, expected_checksums(digest(content), tail))
        finally:
            loader.close()

    def multipart(self, key: str, data: bytes, sizes: list[int], algorithm: str, kind: str) -> None:
        c = self.c
        up = c.create_multipart_upload(
            Bucket=self.name, Key=key, ChecksumAlgorithm=algorithm, ChecksumType=kind
        )["UploadId"]
        listed, start = [], 0
        for n, size in enumerate(sizes, 1):
            body = data[start : start + size]
            start += size
            field = {f"Checksum{algorithm}": encode(algorithm, checksum_of(algorithm, body))}
            r = c.upload_part(
                Bucket=self.name, Key=key, UploadId=up, PartNumber=n, Body=body, **field
            )
            listed.append({"PartNumber": n, "ETag": r["ETag"], **field})
        extra = {}
        if kind == "FULL_OBJECT":
            extra[f"Checksum{algorithm}"] = encode(algorithm, checksum_of(algorithm, data))
        c.complete_multipart_upload(
            Bucket=self.name,
            Key=key,
            UploadId=up,
            MultipartUpload={"Parts": listed},
            ChecksumType=kind,
            **extra,
        )

    def upload_file(self, key: str, data: bytes) -> None:
        """boto3's ``upload_file`` with its defaults (8 MiB parts, composite CRC-32)."""
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            self.c.upload_file(f.name, self.name, key, Config=TransferConfig())


@pytest.fixture
def bucket(s3_server: S3TestServer) -> Bucket:
    return Bucket(s3_server)


@pytest.fixture(scope="module")
def content() -> bytes:
    return os.urandom(CONTENT)


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


@pytest.mark.parametrize(
    "algorithm",
    [
        "CRC64NVME",
        "CRC32",
        pytest.param("CRC32C", marks=pytest.mark.s3_xfail("moto", reason=MOTO_CRC32C_IS_CRC32)),
    ],
)
def test_the_writers_own_objects_are_trusted_by_head(
    s3_server: S3TestServer, bucket: Bucket, content: bytes, algorithm: str
) -> None:
    """What ptestore publishes (FULL_OBJECT, copies combined) needs no read."""
    key = f"w-{algorithm}"
    w = open_writer(
        f"s3://{bucket.name}/{key}",
        part_size=5 * MiB,
        checksum_algorithm=algorithm,
        **s3_server.storage_options,
    )
    w.write(content + TAIL, 0)
    w.publish()
    verdict = bucket.judge(key, content)
    assert verdict.trusted is True, verdict
    assert verdict.stored is not None and verdict.stored.startswith(algorithm)
    assert verdict.requests == 1  # one HEAD


def test_default_upload_file_is_trusted_by_head(
    s3_server: S3TestServer, bucket: Bucket, content: bytes
) -> None:
    """boto3's defaults store a composite CRC-32 of 8 MiB parts: predicted from the
    record's chunk CRCs, so no read (SeaweedFS lists the parts; moto only tells part 1)."""
    bucket.upload_file("uf", content + TAIL)
    verdict = bucket.judge("uf", content)
    assert verdict.trusted is True, verdict
    assert verdict.stored is not None and verdict.stored.startswith("CRC32")
    # HEAD, then the parts: GetObjectAttributes (SeaweedFS, AWS), and HEAD of part 1 where
    # it lists none (moto)
    assert verdict.requests == (2 if s3_server.name == "seaweedfs" else 3)


@pytest.mark.parametrize("at", [10, PART + 5, CONTENT + 7])
def test_damaged_upload_file_objects_are_never_trusted(
    bucket: Bucket, content: bytes, at: int
) -> None:
    bucket.upload_file("uf", flipped(content + TAIL, at))
    verdict = bucket.judge("uf", content)
    assert verdict.trusted is not True, verdict


@pytest.mark.parametrize(
    "algorithm",
    [
        "CRC32",
        pytest.param("CRC32C", marks=pytest.mark.s3_xfail("moto", reason=MOTO_CRC32C_IS_CRC32)),
        "CRC64NVME",
    ],
)
def test_full_object_multipart_of_each_crc_is_trusted(
    bucket: Bucket, content: bytes, algorithm: str
) -> None:
    data = content + TAIL
    bucket.multipart("mp", data, [5 * MiB, len(data) - 5 * MiB], algorithm, "FULL_OBJECT")
    assert bucket.judge("mp", content).trusted is True
    bucket.multipart(
        "bad", flipped(data, 77), [5 * MiB, len(data) - 5 * MiB], algorithm, "FULL_OBJECT"
    )
    verdict = bucket.judge("bad", content)
    assert verdict.trusted is False, verdict
    assert f"the stored {algorithm}" in verdict.reason


@pytest.mark.parametrize(
    "algorithm",
    [
        "CRC32",
        pytest.param("CRC32C", marks=pytest.mark.s3_xfail("moto", reason=MOTO_CRC32C_IS_CRC32)),
    ],
)
def test_composite_on_the_chunk_grid_is_trusted(
    bucket: Bucket, content: bytes, algorithm: str
) -> None:
    data = content + TAIL
    bucket.multipart("c", data, [PART, len(data) - PART], algorithm, "COMPOSITE")
    assert bucket.judge("c", content).trusted is True
    bucket.multipart(
        "bad", flipped(data, PART + 1), [PART, len(data) - PART], algorithm, "COMPOSITE"
    )
    assert bucket.judge("bad", content).trusted is not True


def test_what_cannot_be_predicted_is_read(bucket: Bucket, content: bytes) -> None:
    data = content + TAIL
    # 5 MiB parts: a boundary inside a 4 MiB chunk
    bucket.multipart("five", data, [5 * MiB, len(data) - 5 * MiB], "CRC32", "COMPOSITE")
    assert bucket.judge("five", content).trusted is None
    # a composite SHA-256 and a whole-object SHA-256 of an object with a trailer
    bucket.multipart("sha", data, [PART, len(data) - PART], "SHA256", "COMPOSITE")
    assert bucket.judge("sha", content).trusted is None
    bucket.c.put_object(Bucket=bucket.name, Key="put", Body=data, ChecksumAlgorithm="SHA256")
    assert bucket.judge("put", content).trusted is None
    # SHA-1: nothing in the record
    bucket.c.put_object(Bucket=bucket.name, Key="sha1", Body=data, ChecksumAlgorithm="SHA1")
    assert bucket.judge("sha1", content).trusted is None


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA256"])
def test_single_put_of_each_algorithm(bucket: Bucket, algorithm: str) -> None:
    small = os.urandom(300_000)
    key = f"p-{algorithm}"
    bucket.c.put_object(Bucket=bucket.name, Key=key, Body=small, ChecksumAlgorithm=algorithm)
    # an object that is its content (a shared .ptd): its CRCs are predicted; a SHA-256
    # only from a record that names the whole SHA-256 (versions 1 and 2): since version 3
    # the record names the chunk root, and such an object is read
    if algorithm == "SHA256":
        verdict = bucket.judge(key, small, tail=b"")
        assert verdict.trusted is None and "no SHA256" in verdict.reason
        assert bucket.judge(key, small, tail=b"", whole=True).trusted is True
    else:
        assert bucket.judge(key, small, tail=b"").trusted is True
    if algorithm != "SHA256":
        bucket.c.put_object(
            Bucket=bucket.name, Key=key + "t", Body=small + TAIL, ChecksumAlgorithm=algorithm
        )
        assert bucket.judge(key + "t", small).trusted is True
    bad = f"bad-{uuid.uuid4().hex}"
    body = flipped(small, 1000)
    bucket.c.put_object(Bucket=bucket.name, Key=bad, Body=body, ChecksumAlgorithm=algorithm)
    # no ChecksumType on a PutObject here: a mismatch is read, never trusted
    assert bucket.judge(bad, small, tail=b"").trusted is not True


def test_an_upload_without_a_checksum_is_read(s3_server: S3TestServer, bucket: Bucket) -> None:
    bare = no_checksum_client(s3_server.storage_options)
    small = os.urandom(5000)
    bare.put_object(Bucket=bucket.name, Key="bare", Body=small)
    verdict = bucket.judge("bare", small, tail=b"")
    assert verdict.trusted is None and verdict.stored is None


def test_a_local_record_trusts_crc32_and_reads_crc64nvme(bucket: Bucket, content: bytes) -> None:
    """A file made locally and uploaded by another tool: its record has the per-chunk
    CRC-32 only, so a composite CRC-32 is trusted and a CRC64NVME costs a read."""
    local = expected_checksums(digest(content, LOCAL_CRCS), TAIL)
    bucket.upload_file("uf", content + TAIL)
    data = content + TAIL
    bucket.multipart("c64", data, [5 * MiB, len(data) - 5 * MiB], "CRC64NVME", "FULL_OBJECT")
    for key, want in (("uf", True), ("c64", None)):
        loader = bucket.loader(key)
        try:
            assert trust_by_head(loader, local).trusted is want, key
        finally:
            loader.close()


def test_a_record_without_crcs_still_trusts_a_crc32(bucket: Bucket, content: bytes) -> None:
    """Records made before the CRCs were kept name the CRC-32 only."""
    data = content + TAIL
    bucket.multipart("old", data, [5 * MiB, len(data) - 5 * MiB], "CRC32", "FULL_OBJECT")
    full = digest(content)
    old = ContentDigest(full.size, full.sha256, full.crc32, full.chunks)
    loader = bucket.loader("old")
    try:
        assert trust_by_head(loader, expected_checksums(old, TAIL)).trusted is True
        bucket.upload_file("uf", data)
        loader2 = bucket.loader("uf")
        try:  # a composite needs the chunk CRCs: read
            assert trust_by_head(loader2, expected_checksums(old, TAIL)).trusted is None
        finally:
            loader2.close()
    finally:
        loader.close()


def test_a_fresh_cli_run_to_s3_records_what_its_writer_stores(
    s3_server: S3TestServer, bucket: Bucket, tmp_path: Path
) -> None:
    """A whole ``ptestore specialize`` process with a local source and an S3
    destination: its record names the CRC64NVME its writer stored (awscrt is loaded by
    the S3 client before the output is digested), so the object is trusted by one HEAD."""
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    url = f"s3://{bucket.name}/out.pte"
    opts = [f"-o{k}={v}" for k, v in s3_server.storage_options.items() if isinstance(v, str)]
    opts += ["-o", 'client_kwargs={"region_name": "us-east-1"}']
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ptestore",
            "specialize",
            str(fx.pte_path),
            url,
            "-q",
            "--allow-unchanged",
            *opts,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loader = bucket.loader("out.pte")
    try:
        trailer = read_trailer(loader)
        assert trailer is not None
        prov = Provenance.from_dict(trailer.record(), url)
        assert prov.content is not None and prov.content.crcs is not None
        assert "CRC64NVME" in prov.content.crcs.full
        verdict = trust_by_head(loader, expected_checksums(prov.content, trailer.raw()))
        assert verdict.trusted is True and verdict.requests == 1, verdict
        assert verdict.stored is not None and verdict.stored.startswith("CRC64NVME")
        assert bytes_mismatch(loader, trailer, prov) is None
    finally:
        loader.close()
