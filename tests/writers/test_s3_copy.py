"""S3 to S3 server-side copies: which parts the service copies, what travels through
the client, pinning to the version read at the start.

The tests run against every server of the ``server`` fixture (moto and SeaweedFS). Two facts
differ between servers and are declared per server: whether ``UploadPartCopy`` enforces
``CopySourceIfMatch`` (moto ignores it, AWS and SeaweedFS answer 412) and whether
``CopyPartResult`` carries the part's CRC-32 (moto: no). The refusal of a copy of a
replaced source is a real test on SeaweedFS; on moto the writer's side of the contract
(the parameters it sends, its own check after the last part copy) is checked instead.
"""

from __future__ import annotations

import logging
import os
import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ptestore.checksums import crc
from ptestore.errors import PermissionDenied, PreconditionFailed
from ptestore.storage.loaders import BytesLoader, DataLoader, FsspecLoader, open_loader
from ptestore.testing.s3_traffic import Traffic
from ptestore.testing.s3server import S3TestServer
from ptestore.testing.seaweedfs import SeaweedS3
from ptestore.writers import S3Writer, WriterState, open_writer
from ptestore.writers.s3 import MARKER_PART_NUMBER, MIN_PART_SIZE, PartState, marker_bytes
from ptestore.writers.s3.checksum import published_checksum

from .s3_faults import error_response

pytestmark = pytest.mark.s3

P = MIN_PART_SIZE
SIZE = 6 * P + 1234
GAP = (4 * P + 100, 4 * P + 300)  # zero padding in the source, written as zeros
REPLACED = (2 * P + P // 2, 3 * P + P // 2)  # straddles parts 3 and 4
META = 300  # "metadata" written last at offset 0, different from the source's
#: Whether SeaweedFS's CopyPartResult carries the part's CRC-32.
SEAWEED_COPY_CRC = True


@dataclass(frozen=True)
class Server:
    s3: S3TestServer
    #: UploadPartCopy answers 412 when CopySourceIfMatch no longer matches.
    enforces_copy_if_match: bool
    #: CopyPartResult carries ChecksumCRC32 (the upload was created with CRC32).
    returns_copy_checksums: bool


@pytest.fixture(params=["moto", "seaweedfs"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == "moto":
        # moto 5.2: CopySourceIfMatch ignored, no checksum in CopyPartResult.
        yield Server(
            request.getfixturevalue("moto_s3"),
            enforces_copy_if_match=False,
            returns_copy_checksums=False,
        )
        return
    weed: SeaweedS3 = request.getfixturevalue("seaweedfs_s3")
    # SeaweedFS 4.48: 412 on a changed CopySourceIfMatch.
    yield Server(weed, enforces_copy_if_match=True, returns_copy_checksums=SEAWEED_COPY_CRC)
    weed.delete_buckets()


@pytest.fixture
def bucket(server: Server) -> str:
    return server.s3.new_bucket()


def source_bytes() -> bytes:
    data = bytearray(random.randbytes(SIZE))
    data[GAP[0] : GAP[1]] = bytes(GAP[1] - GAP[0])
    return bytes(data)


def put_source(server: Server, bucket: str, data: bytes) -> str:
    key = f"src/{uuid.uuid4().hex}.pte"
    server.s3.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def new_writer(server: Server, bucket: str, **kw: Any) -> S3Writer:
    url = f"s3://{bucket}/out/{uuid.uuid4().hex}.pte"
    w = open_writer(url, part_size=P, skip_instance_cache=True, **server.s3.storage_options, **kw)
    assert isinstance(w, S3Writer)
    return w


def build(w: S3Writer, src: DataLoader, new: bytes, meta: bytes) -> None:
    """What the coordinator does: padding zeros, unchanged runs, the replacement, the
    metadata last."""
    w.write(bytes(GAP[1] - GAP[0]), GAP[0])
    w.copy_from(src, META, REPLACED[0] - META, META)
    w.write(new, REPLACED[0])
    w.copy_from(src, REPLACED[1], GAP[0] - REPLACED[1], REPLACED[1])
    w.copy_from(src, GAP[1], SIZE - GAP[1], GAP[1])
    w.write(meta, 0)


def expected(data: bytes, new: bytes, meta: bytes) -> bytes:
    out = bytearray(data)
    out[REPLACED[0] : REPLACED[1]] = new
    out[:META] = meta
    return bytes(out)


def copy_all(w: S3Writer, src: DataLoader) -> None:
    w.copy_from(src, 0, SIZE, 0)
    w.publish()


def part_numbers(traffic: Traffic, op: str) -> list[int]:
    return sorted(int(p["PartNumber"]) for p in traffic.params.get(op, []))


def read(server: Server, url: str) -> bytes:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    body: bytes = server.s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def test_unchanged_parts_are_copied_by_the_service(server: Server, bucket: str) -> None:
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    new, meta = random.randbytes(REPLACED[1] - REPLACED[0]), random.randbytes(META)
    src = open_loader(src_url, **server.s3.storage_options)
    assert isinstance(src, FsspecLoader)
    w = new_writer(server, bucket)
    traffic = Traffic().attach(w.client.meta.events)
    build(w, src, new, meta)
    result = w.publish()
    assert read(server, w.url) == expected(data, new, meta)

    # Parts 2, 5 (its zero gap equals the source's) and 6 and the short last part 7 are
    # copied; part 1 (metadata) and parts 3-4 (straddling the replacement) are uploaded.
    assert part_numbers(traffic, "UploadPartCopy") == [2, 5, 6, 7]
    assert part_numbers(traffic, "UploadPart") == [1, 3, 4, MARKER_PART_NUMBER]
    etag = src.etag
    for params in traffic.params["UploadPartCopy"]:
        assert params["CopySourceIfMatch"] == etag
        assert params["CopySource"] == {"Bucket": bucket, "Key": src_url.split("/", 3)[3]}
    copy2 = next(p for p in traffic.params["UploadPartCopy"] if p["PartNumber"] == 2)
    assert copy2["CopySourceRange"] == f"bytes={P}-{2 * P - 1}"
    last = next(p for p in traffic.params["UploadPartCopy"] if p["PartNumber"] == 7)
    assert last["CopySourceRange"] == f"bytes={6 * P}-{SIZE - 1}"
    # Every read of the source is pinned to the ETag read at the start.
    assert traffic.params["GetObject"]
    assert all(p["IfMatch"] == etag for p in traffic.params["GetObject"])

    # Through the client: the replaced bytes, the metadata and the two straddling parts,
    # plus the marker part and the XML of the calls.
    replaced = REPLACED[1] - REPLACED[0]
    budget = replaced + META + 2 * P
    assert traffic.sent["UploadPart"] == 3 * P + len(marker_bytes(w.key))
    assert 3 * P <= traffic.bytes_sent <= budget + (64 << 10)
    assert traffic.bytes_received <= budget + (64 << 10)
    assert traffic.received["GetObject"] == (P - META) + P // 2 + P // 2 + META + (GAP[1] - GAP[0])
    if server.returns_copy_checksums:
        want = crc(w.algorithm, expected(data, new, meta))
        assert result.checksum == published_checksum(w.algorithm, want)
        assert not w.checksum_degraded
    else:
        assert result.checksum is None  # verified: size and writer token only
        assert w.checksum_degraded


def test_output_is_identical_to_the_streaming_path(server: Server, bucket: str) -> None:
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    new, meta = random.randbytes(REPLACED[1] - REPLACED[0]), random.randbytes(META)
    outputs = []
    for src in (open_loader(src_url, **server.s3.storage_options), BytesLoader(data)):
        w = new_writer(server, bucket)
        traffic = Traffic().attach(w.client.meta.events)
        build(w, src, new, meta)
        w.publish()
        outputs.append((read(server, w.url), part_numbers(traffic, "UploadPartCopy")))
    (copied, copies), (streamed, no_copies) = outputs
    assert copied == streamed == expected(data, new, meta)
    assert copies and not no_copies


@pytest.mark.parametrize("other", ["key", "endpoint"])
def test_other_credentials_or_endpoint_stream(server: Server, bucket: str, other: str) -> None:
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    options = dict(server.s3.storage_options)
    if other == "key":
        options["key"] = "someone-else"  # moto accepts any key: readable, but not ours
    else:  # the same server under another name: not provably the same service
        options["endpoint_url"] = options["endpoint_url"].replace("127.0.0.1", "localhost")
    if other == "key" and isinstance(server.s3, SeaweedS3):
        # SeaweedFS checks credentials: another key cannot even read the source.
        with pytest.raises(PermissionDenied, match="403"):
            open_loader(src_url, **options)
        return
    src = open_loader(src_url, **options)
    w = new_writer(server, bucket)
    assert w.copy_source(src) is None
    traffic = Traffic().attach(w.client.meta.events)
    w.copy_from(src, 0, SIZE, 0)
    w.publish()
    assert read(server, w.url) == data
    assert not traffic.params.get("UploadPartCopy")
    assert part_numbers(traffic, "UploadPart") == [*range(1, 8), MARKER_PART_NUMBER]


def test_source_replaced_mid_run_fails_the_run(server: Server, bucket: str) -> None:
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket)
    new = random.randbytes(REPLACED[1] - REPLACED[0])
    w.write(bytes(GAP[1] - GAP[0]), GAP[0])
    w.copy_from(src, META, REPLACED[0] - META, META)
    w.write(new, REPLACED[0])
    w.copy_from(src, REPLACED[1], SIZE - REPLACED[1], REPLACED[1])
    w.wait_uploads()
    bucket_, _, key = src_url.removeprefix("s3://").partition("/")
    server.s3.client().put_object(Bucket=bucket_, Key=key, Body=random.randbytes(SIZE))
    # Part 1 mixes written bytes and source bytes: its pinned ranged GET meets the new
    # version (412), so does the copy of part 7 where the server enforces If-Match.
    w.write(random.randbytes(META), 0)
    with pytest.raises(PreconditionFailed, match=r"replaced since it was opened \(ETag "):
        w.publish()
    assert w.state is WriterState.DISCARDED
    assert not server.s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not server.s3.client().list_objects_v2(Bucket=bucket, Prefix=w.key).get("Contents")


def test_source_replaced_after_the_last_part_copy_stops_before_complete(
    server: Server, bucket: str
) -> None:
    """Every part copied before the source is replaced (no copy meets the new version,
    so no server refuses one): the writer's own check after the last part copy stops
    the run before Complete, on moto (which ignores CopySourceIfMatch) as on SeaweedFS."""
    data = random.randbytes(2 * P)
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket)
    traffic = Traffic().attach(w.client.meta.events)
    w.copy_from(src, 0, 2 * P, 0)
    w.wait_uploads()
    assert part_numbers(traffic, "UploadPartCopy") == [1, 2]
    bucket_, _, key = src_url.removeprefix("s3://").partition("/")
    new_etag = server.s3.client().put_object(Bucket=bucket_, Key=key, Body=random.randbytes(2 * P))[
        "ETag"
    ]
    assert isinstance(src, FsspecLoader)
    with pytest.raises(PreconditionFailed) as info:
        w.publish()
    assert str(info.value) == (
        f"{src_url}: replaced since it was opened (ETag {src.etag} -> {new_etag}, checked "
        "after the last part copy): the run stops before Complete instead of publishing a "
        "mix of two versions"
    )
    assert "CompleteMultipartUpload" not in traffic.params
    assert w.state is WriterState.DISCARDED
    assert not server.s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not server.s3.client().list_objects_v2(Bucket=bucket, Prefix=w.key).get("Contents")


def test_copy_refused_412_fails_the_run(server: Server, bucket: str) -> None:
    """The service's answer to a copy whose source changed (injected here: moto ignores
    CopySourceIfMatch) discards the writer with a message naming the source."""
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket)
    w.client.meta.events.register(
        "before-send.s3.UploadPartCopy", lambda request, **_: error_response(request.url, "412")
    )
    with pytest.raises(PreconditionFailed) as info:
        copy_all(w, src)
    assert isinstance(src, FsspecLoader) and src.etag
    assert re.fullmatch(
        re.escape(f"{src_url}: replaced since it was opened (ETag {src.etag} no longer matches; ")
        + r"UploadPartCopy \d from "
        + re.escape(f"{src_url} answered 412): the run stops instead of mixing two versions"),
        str(info.value),
    )
    assert w.state is WriterState.DISCARDED
    assert not server.s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_copy_of_a_replaced_source_is_refused_by_the_server(server: Server, bucket: str) -> None:
    """SeaweedFS refuses the copy (412 to the UploadPartCopy: ``refused_by`` "storage");
    moto copies the new version, and the writer's own check after the last part copy
    stops the run before Complete (``refused_by`` "ptestore"). The two are told apart,
    so the test fails on SeaweedFS if the writer stops sending ``CopySourceIfMatch``."""
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    bucket_, _, key = src_url.removeprefix("s3://").partition("/")
    server.s3.client().put_object(Bucket=bucket_, Key=key, Body=random.randbytes(SIZE))
    w = new_writer(server, bucket)
    with pytest.raises(PreconditionFailed, match="replaced since it was opened") as info:
        copy_all(w, src)
    assert info.value.url == src_url
    if server.enforces_copy_if_match:
        assert info.value.refused_by == "storage"
        assert re.search(
            r"UploadPartCopy \d+ from " + re.escape(f"{src_url} answered 412"), str(info.value)
        ), str(info.value)
    else:
        assert info.value.refused_by == "ptestore"
        assert "checked after the last part copy" in str(info.value)


def _versioned_copy(server: Server, bucket: str, data: bytes) -> tuple[Any, Any, Any, Traffic]:
    """In a bucket made versioned, ``data`` stored as the source: its loader, its
    ``s3_source()`` (with a version id), a new writer and the writer's traffic."""
    client = server.s3.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    src = open_loader(put_source(server, bucket, data), **server.s3.storage_options)
    assert isinstance(src, FsspecLoader)
    source = src.s3_source()
    assert source is not None and source.version_id
    w = new_writer(server, bucket)
    return src, source, w, Traffic().attach(w.client.meta.events)


def test_versioned_source_is_pinned_to_the_version_read(server: Server, bucket: str) -> None:
    data = source_bytes()
    src, source, w, traffic = _versioned_copy(server, bucket, data)
    w.copy_from(src, 0, SIZE, 0)
    w.publish()
    assert read(server, w.url) == data
    copies = traffic.params["UploadPartCopy"]
    assert len(copies) == 7
    assert all(p["CopySource"]["VersionId"] == source.version_id for p in copies)


def test_rewriting_a_copied_part_with_spool(server: Server, bucket: str) -> None:
    data = source_bytes()
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket, spool=True)
    traffic = Traffic().attach(w.client.meta.events)
    w.copy_from(src, 0, SIZE, 0)
    w.wait_uploads()
    assert w.parts[1].state is PartState.UPLOADED
    w.write(b"PATCH", P + 10)  # part 2 was copied: back to its source range, then patched
    w.publish()
    out = bytearray(data)
    out[P + 10 : P + 15] = b"PATCH"
    assert read(server, w.url) == bytes(out)
    assert part_numbers(traffic, "UploadPart") == [2, MARKER_PART_NUMBER]


def test_small_outputs_read_their_source_ranges(server: Server, bucket: str) -> None:
    data = random.randbytes(1000)
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket)
    w.copy_from(src, 100, 800, 0)
    w.write(b"x", 799)
    w.publish()
    assert read(server, w.url) == data[100:899] + b"x"


def test_holes_stay_zeros(server: Server, bucket: str) -> None:
    """A part referenced with a hole (never written: zeros) is not a copy of the source."""
    data = source_bytes()
    src = open_loader(put_source(server, bucket, data), **server.s3.storage_options)
    w = new_writer(server, bucket)
    traffic = Traffic().attach(w.client.meta.events)
    w.copy_from(src, 0, P, 0)
    w.copy_from(src, P, 1000, P)
    w.copy_from(src, P + 2000, P, P + 2000)  # [P + 1000, P + 2000) never written
    w.publish()
    out = bytearray(data[: 2 * P + 2000])
    out[P + 1000 : P + 2000] = bytes(1000)
    assert read(server, w.url) == bytes(out)
    assert part_numbers(traffic, "UploadPartCopy") == [1, 3]
    assert part_numbers(traffic, "UploadPart") == [2, MARKER_PART_NUMBER]


def test_sources_of_at_most_5_mib_are_read(server: Server, bucket: str) -> None:
    """S3 copies ranges only from sources larger than 5 MB: a last part that is a whole
    small object is read and uploaded."""
    small = random.randbytes(1000)
    src = open_loader(put_source(server, bucket, small), **server.s3.storage_options)
    w = new_writer(server, bucket)
    traffic = Traffic().attach(w.client.meta.events)
    head = random.randbytes(P)
    w.write(head, 0)
    w.copy_from(src, 0, 1000, P)
    w.publish()
    assert read(server, w.url) == head + small
    assert not traffic.params.get("UploadPartCopy")
    assert part_numbers(traffic, "UploadPart") == [1, 2, MARKER_PART_NUMBER]


def test_degraded_checksum_is_logged(
    server: Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    if server.returns_copy_checksums:
        pytest.skip("this server returns the checksum of copied parts")
    src_url = put_source(server, bucket, source_bytes())
    src = open_loader(src_url, **server.s3.storage_options)
    w = new_writer(server, bucket)
    with caplog.at_level(logging.WARNING, logger="ptestore.writers.s3"):
        w.copy_from(src, 0, SIZE, 0)
        result = w.publish()
    assert result.checksum is None
    assert (
        f"{w.url}: the service returned no {w.algorithm} for parts it copied; publishing "
        "without the full-object checksum (size and writer token are still checked)"
    ) in caplog.text


def test_other_filesystems_are_not_copy_sources(server: Server, bucket: str) -> None:
    import fsspec

    path = f"/{uuid.uuid4().hex}/x.bin"
    fsspec.filesystem("memory").pipe(path, os.urandom(10))
    memory = open_loader(f"memory://{path}")
    assert isinstance(memory, FsspecLoader)
    assert memory.s3_source() is None
    w = new_writer(server, bucket)
    assert w.copy_source(memory) is None
    assert w.copy_source(BytesLoader(b"abc")) is None
    w.discard()


def test_a_small_source_read_whole_is_copied_from_memory(server: Server, bucket: str) -> None:
    """A source of at most 1 MiB is read whole by its loader: its ranges are taken from
    that copy, neither read again by a GET nor copied by the service."""
    data = random.randbytes(64 << 10)
    src_url = put_source(server, bucket, data)
    src = open_loader(src_url, **server.s3.storage_options)
    assert isinstance(src, FsspecLoader)
    src.load(0, 16)  # the pipeline reads the header, then the FlatBuffer
    src.load(16, 16)
    assert src.in_memory
    w = new_writer(server, bucket)
    traffic = Traffic().attach(w.client.meta.events)
    w.write(b"NEW!", 0)
    w.copy_from(src, 4, len(data) - 4, 4)
    w.publish()
    assert read(server, w.url) == b"NEW!" + data[4:]
    assert sorted(traffic.params) == ["HeadObject", "PutObject"]


def test_a_part_copied_from_another_version_stops_before_complete(
    server: Server, bucket: str
) -> None:
    """The service says a part was copied from another version than the one read (made
    up here by an ``after-call`` hook): the writer aborts the upload before Complete, so
    nothing was published (``published=False``: the CLI says "nothing", not "failed
    after publishing")."""
    from ptestore.cli.exits import error_json
    from ptestore.errors import IntegrityError

    data = random.randbytes(2 * P)
    src, source, w, traffic = _versioned_copy(server, bucket, data)
    client, src_url = server.s3.client(), source.url

    def another_version(parsed: dict[str, Any], **_: Any) -> None:
        parsed["CopySourceVersionId"] = "another-version"

    w.client.meta.events.register("after-call.s3.UploadPartCopy", another_version)
    w.copy_from(src, 0, 2 * P, 0)  # the part copies run in the background
    with pytest.raises(IntegrityError) as info:
        w.publish()
    assert re.fullmatch(
        re.escape(f"{w.url}: part ")
        + r"\d"
        + re.escape(
            f" was copied from version another-version of {src_url}, not from the version "
            f"read at the start ({source.version_id})"
        ),
        str(info.value),
    )
    assert info.value.published is False
    assert error_json("specialize", info.value, 1, publishes=True)["error"]["published"] == (
        "nothing"
    )
    assert "CompleteMultipartUpload" not in traffic.params
    assert w.state is WriterState.DISCARDED
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not client.list_objects_v2(Bucket=bucket, Prefix=w.key).get("Contents")
