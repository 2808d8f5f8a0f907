"""S3Writer specifics: the part grid, spool rewrites, options, metadata, integrity, gc."""

from __future__ import annotations

import hashlib
import random
import re
import subprocess
import sys
import textwrap
import uuid
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptestore.checksums import crc, encode
from ptestore.errors import ConfigurationError, IntegrityError
from ptestore.gc import collect_s3, collect_stale
from ptestore.storage.loaders import open_loader
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, WriterState, open_writer
from ptestore.writers.s3 import (
    MARKER_PART_NUMBER,
    MIN_PART_SIZE,
    PartState,
    crc32_combine,
    is_marker_part,
    marker_bytes,
)

from .s3_faults import fake_response

pytestmark = pytest.mark.s3

PART = MIN_PART_SIZE  # S3's smallest part: multipart tests write >= 3 parts


def part_of(server: S3TestServer) -> int:
    """The part size for ``server``: PART, or its minimum (real S3: 5 MiB) if larger."""
    return max(PART, server.min_part_size)


@pytest.fixture
def part(s3_server: S3TestServer) -> int:
    return part_of(s3_server)


@pytest.fixture
def url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/models/{uuid.uuid4().hex}.pte"


def key_of(url: str) -> str:
    return url.split("/", 3)[3]


def writer(server: S3TestServer, url: str, **kw: Any) -> S3Writer:
    # A client of its own (s3fs shares clients between equal options): hooks stay local.
    opts = {"part_size": part_of(server), "skip_instance_cache": True, **kw}
    w = open_writer(url, **server.storage_options, **opts)
    assert isinstance(w, S3Writer)
    return w


def uploaded_parts(client: Any, bucket: str, w: S3Writer) -> list[int]:
    assert w.upload_id is not None
    resp = client.list_parts(Bucket=bucket, Key=w.key, UploadId=w.upload_id)
    return sorted(p["PartNumber"] for p in resp.get("Parts", []))


@given(st.binary(max_size=300), st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_crc32_combine_matches_zlib(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_crc32_combine_large_lengths() -> None:
    a, b = random.randbytes(1000), bytes(5 << 20)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_complete_parts_upload_before_publish_and_first_part_waits(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, url: str, part: int
) -> None:
    data = random.randbytes(5 * part + 77)
    w = writer(s3_server, url, max_concurrency=2)
    w.write(data[part:], part)  # parts 2..6 (6 is partial: the object's size is unknown)
    w.write(data[100:part], 100)  # part 1 still has a hole: it waits
    w.wait_uploads()
    assert uploaded_parts(s3_client, s3_bucket, w) == [2, 3, 4, 5, MARKER_PART_NUMBER]
    held = sorted(i for i, p in w.parts.items() if p.held)
    assert held == [0, 5]  # only the partial parts
    assert w.parts[5].state is PartState.SPARSE  # 77 bytes: no part-sized buffer
    w.write(data[:100], 0)  # part 1 complete now: uploaded at once
    w.wait_uploads()
    assert uploaded_parts(s3_client, s3_bucket, w) == [1, 2, 3, 4, 5, MARKER_PART_NUMBER]
    result = w.publish()
    body = s3_client.get_object(Bucket=s3_bucket, Key=key_of(url))["Body"].read()
    assert body == data
    # the checksum S3 stores by default, computed with awscrt (botocore[crt], ptestore[s3])
    assert w.algorithm == "CRC64NVME"
    assert result.checksum == "crc64nvme:" + encode("CRC64NVME", crc("CRC64NVME", data))


def test_memory_stays_bounded_for_sequential_writes(
    s3_server: S3TestServer, url: str, part: int
) -> None:
    w = writer(s3_server, url, max_concurrency=2)
    chunk = random.randbytes(part // 4 + 3)
    off = 0
    peak = 0
    for _ in range(18):
        w.write(chunk, off)
        off += len(chunk)
        buffered = sum(p.state is PartState.BUFFERED for p in w.parts.values())
        peak = max(peak, buffered + w.in_flight)
    assert peak <= 1 + 2  # one partial part + max_concurrency in flight
    w.publish()


def test_rewriting_an_uploaded_part_reuploads_it(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, url: str, part: int
) -> None:
    data = bytearray(random.randbytes(3 * part))
    w = writer(s3_server, url, spool=True)
    calls: list[str] = []
    w.client.meta.events.register(
        "before-send.s3.UploadPart", lambda request, **_: calls.append(request.url) and None
    )
    w.write(data, 0)
    w.write(b"PATCH", part + 10)  # part 2 was uploaded: reload from the spool
    data[part + 10 : part + 15] = b"PATCH"
    w.publish()
    assert s3_client.get_object(Bucket=s3_bucket, Key=key_of(url))["Body"].read() == data
    part2 = [c for c in calls if "partNumber=2&" in c or c.endswith("partNumber=2")]
    assert len(part2) == 2


def test_rewrite_without_spool_is_refused(s3_server: S3TestServer, url: str, part: int) -> None:
    w = writer(s3_server, url)  # spool=False is the default: no local disk used
    w.write(bytes(2 * part), 0)
    with pytest.raises(
        ConfigurationError,
        match=rf"part 1 \(bytes 0\.\.{part}\) was already uploaded and cannot be rewritten "
        r"with spool=False \(open the writer with spool=True to rewrite uploaded parts\)",
    ):
        w.write(b"x", 5)
    assert w.state is WriterState.OPEN
    w.write(b"tail", 2 * part)
    assert w.publish().size == 2 * part + 4
    w.discard()


def test_a_copy_through_the_client_over_an_uploaded_part_is_refused_whole(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, url: str, part: int, tmp_path: Any
) -> None:
    """A local source is copied in 8 MiB pieces: a copy that reaches a part already
    uploaded (spool=False) is refused before its first piece, not after it."""
    k = -(-(8 << 20) // part)  # the first part past the copy's first piece
    source = tmp_path / "src.bin"
    source.write_bytes(b"S" * ((k + 1) * part))
    w = writer(s3_server, url)
    w.write(b"W" * part, k * part)  # a whole part: uploaded
    w.wait_uploads()
    with pytest.raises(ConfigurationError, match=rf"part {k + 1} \(bytes {k * part}\.\."):
        w.copy_from(open_loader(str(source)), 0, (k + 1) * part, 0)
    assert w.state is WriterState.OPEN
    w.publish()
    data = s3_client.get_object(Bucket=s3_bucket, Key=key_of(url))["Body"].read()
    assert b"S" not in data and data.endswith(b"W" * part)


def test_metadata_and_additional_kwargs(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, url: str, part: int
) -> None:
    for size in (10, 3 * part):  # PutObject and multipart
        w = writer(
            s3_server,
            url,
            metadata={"device": "pixel-9", "model": "llama"},
            s3_additional_kwargs={"ContentType": "application/x-pte"},
        )
        w.write(bytes(size), 0)
        w.publish()
        head = s3_client.head_object(Bucket=s3_bucket, Key=key_of(url))
        assert head["Metadata"] == {
            "device": "pixel-9",
            "model": "llama",
            "ptestore-writer": w.token,
        }
        assert head["ContentType"] == "application/x-pte"


def test_objects_are_readable_through_s3fs_with_the_same_options(
    s3_server: S3TestServer, url: str, part: int
) -> None:
    data = random.randbytes(2 * part + 3)
    w = writer(s3_server, url)
    w.write(data, 0)
    w.publish()
    loader = open_loader(url, **s3_server.storage_options)
    assert loader.size() == len(data)
    assert loader.load(part - 2, 10) == data[part - 2 : part + 8]


def test_credentials_from_the_environment(
    s3_server: S3TestServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real server checks credentials (moto takes any): use the server's, from the env.
    options = s3_server.storage_options
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    w = open_writer(url)
    creds = w.client._request_signer._credentials  # type: ignore[attr-defined]
    assert creds.access_key == options["key"]
    w.write(b"env", 0)
    w.publish()


def _corrupt_put_body(params: dict[str, Any], **_: Any) -> None:
    body = bytearray(params["Body"])
    body[0] ^= 0xFF
    params["Body"] = bytes(body)


def test_hooks_on_one_writer_do_not_reach_another_with_equal_options(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    """s3fs caches filesystems by their options; a writer must not share its client
    (a hook altering one writer's PutObject once broke every later upload to SeaweedFS
    with ``BadDigest``, and silently published altered bytes on moto)."""
    urls = [f"s3://{s3_bucket}/hooks/{name}" for name in ("a", "b")]
    a, b = (open_writer(u, **s3_server.storage_options) for u in urls)
    assert isinstance(a, S3Writer) and isinstance(b, S3Writer)
    seen: list[str] = []
    a.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: seen.append(request.url) and None
    )
    a.client.meta.events.register("before-parameter-build.s3.PutObject", _corrupt_put_body)
    b.write(b"bytes of b", 0)
    b.publish()
    assert seen == []
    assert s3_client.get_object(Bucket=s3_bucket, Key="hooks/b")["Body"].read() == b"bytes of b"
    assert a.client is not b.client
    a.discard()


def test_each_writer_reads_the_environment_when_opened(
    s3_server: S3TestServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers opened with no options, under different credentials and endpoints in
    the environment: the second uses the second (not a cached client of the first)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    first = open_writer(url)
    assert isinstance(first, S3Writer)
    assert first.client._request_signer._credentials.access_key == "first-key"
    options = s3_server.storage_options
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    second = open_writer(url)
    assert isinstance(second, S3Writer)
    assert second.client._request_signer._credentials.access_key == options["key"]
    assert second.client.meta.endpoint_url == s3_server.endpoint_url
    second.write(b"env", 0)
    second.publish()
    first.discard()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"bogus": 1},
            r"options \['bogus'\] do not apply to s3:// \(accepted: \[.*'anon', .*"
            r"'client_kwargs', .*'endpoint_url', .*'part_size', .*'profile', .*"
            r"'retry_attempts', .*'spool'",
        ),
        ({"session": object()}, r"cannot create an S3 client: "),
        (
            {"part_size": 0},
            r"option part_size = 0: must be between 5242880 \(5 MiB, S3's smallest part\) "
            r"and 5368709120 \(5 GiB, S3's largest part\)",
        ),
        ({"part_size": (5 << 20) - 1}, r"part_size = 5242879: must be between 5242880"),
        ({"part_size": (5 << 30) + 1}, r"part_size = 5368709121: must be between"),
        ({"part_size": "8M"}, r"option part_size = '8M': must be an int \(bytes\)"),
        ({"max_concurrency": 0}, r"option max_concurrency = 0: must be an int >= 1"),
        ({"client_kwargs": [1]}, r"option client_kwargs = \[1\]: must be a dict"),
        ({"retry_attempts": "x"}, r"option retry_attempts = 'x': must be an int"),
        ({"retry_initial": -1}, r"retry_initial = -1: must be a number >= 0"),
        ({"anon": "yes"}, r"option anon = 'yes': must be a bool"),
        ({"metadata": {"ptestore-writer": "x"}}, r"metadata key 'ptestore-writer' is reserved"),
        ({"metadata": {"a": 1}}, r"metadata keys and values must be str: 'a'"),
    ],
)
def test_bad_options(
    s3_server: S3TestServer, url: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        open_writer(url, **{**s3_server.storage_options, **options})


def test_s3fs_only_options_are_accepted(s3_server: S3TestServer, url: str) -> None:
    opts = dict(s3_server.storage_options)
    opts["username"] = opts.pop("key")
    opts["password"] = opts.pop("secret")
    w = open_writer(url, **opts, default_block_size=5 << 20, use_listings_cache=False)
    w.write(b"ok", 0)
    w.publish()


@pytest.mark.parametrize("bad", ["s3://bucket-only", "s3://bucket/dir/", "s3:///key"])
def test_bad_urls(s3_server: S3TestServer, bad: str) -> None:
    with pytest.raises(ConfigurationError, match=r"expected s3://bucket/key"):
        open_writer(bad, **s3_server.storage_options)


def test_write_beyond_largest_object(s3_server: S3TestServer, url: str) -> None:
    """At most 9,999 data parts (+ the gc marker): refused at the write, before any
    upload, and the writer stays usable."""
    w = writer(s3_server, url)
    with pytest.raises(
        ConfigurationError,
        match=r"write ending at byte 52423557121 exceeds the largest object this writer can "
        r"publish, part_size \* 9999 = 52423557120 bytes; use a larger part_size",
    ):
        w.write(b"x", 52423557120)
    assert w.state is WriterState.OPEN
    assert w.upload_id is None
    w.write(b"x", 0)
    assert w.publish().size == 1


def _fake_head(w: S3Writer, *, size: int, value: str) -> None:
    def hook(request: Any, **_: Any) -> Any:
        headers = {
            "Content-Length": str(size),
            "x-amz-meta-ptestore-writer": w.token,
            f"x-amz-checksum-{w.algorithm.lower()}": value,
            "ETag": '"abc"',
        }
        return fake_response(request.url, 200, headers, b"")

    w.client.meta.events.register("before-send.s3.HeadObject", hook)


@pytest.mark.parametrize("algorithm", ["CRC64NVME", "CRC32", "CRC32C"])
def test_integrity_check_detects_a_wrong_checksum(
    s3_server: S3TestServer, url: str, algorithm: str
) -> None:
    w = writer(s3_server, url, checksum_algorithm=algorithm)
    w.write(b"abc", 0)
    wrong = encode(algorithm, 0)
    _fake_head(w, size=3, value=wrong)
    with pytest.raises(
        IntegrityError,
        match=rf"published object has {algorithm} {re.escape(wrong)}, but the bytes written "
        rf"have {re.escape(encode(algorithm, crc(algorithm, b'abc')))}",
    ):
        w.publish()


def test_integrity_check_detects_a_wrong_size(s3_server: S3TestServer, url: str, part: int) -> None:
    w = writer(s3_server, url)
    w.write(bytes(3 * part), 0)
    _fake_head(w, size=5, value="AAAAAAAAAAA=")
    with pytest.raises(IntegrityError, match=rf"published object has 5 bytes, but {3 * part} were"):
        w.publish()


def test_gc_aborts_only_ptestore_uploads(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, part: int
) -> None:
    prefix = f"gc-{uuid.uuid4().hex[:6]}/"
    ours = writer(s3_server, f"s3://{s3_bucket}/{prefix}ours.pte")
    ours.write(bytes(2 * part), 0)
    ours.wait_uploads()
    assert ours._finalizer is not None
    ours._finalizer.detach()  # simulate a crash: nobody aborts it
    foreign = s3_client.create_multipart_upload(Bucket=s3_bucket, Key=f"{prefix}foreign.bin")
    s3_client.upload_part(
        Bucket=s3_bucket,
        Key=f"{prefix}foreign.bin",
        UploadId=foreign["UploadId"],
        PartNumber=MARKER_PART_NUMBER,
        Body=b"not a ptestore marker",
    )
    other_prefix = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="elsewhere.bin")
    target = f"s3://{s3_bucket}/{prefix}"

    dry = collect_stale(target, older_than=0, dry_run=True, **s3_server.storage_options)
    assert [(e.location.split("?")[0], e.action) for e in dry] == [
        (f"{target}ours.pte", "would remove")
    ]
    young = collect_s3(target, older_than=1e12, **s3_server.storage_options)
    # ownership before age: the foreign upload is not even reported as young
    assert [(e.location.split("?")[0], e.action) for e in young] == [
        (f"{target}ours.pte", "skipped: younger than 1e+12s")
    ]

    done = collect_s3(target, older_than=0, **s3_server.storage_options)
    assert [e.action for e in done] == ["removed"]
    assert done[0].kind == "multipart-upload"
    assert done[0].size is not None and done[0].size > 2 * part
    left = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert {u["UploadId"] for u in left} >= {foreign["UploadId"], other_prefix["UploadId"]}
    assert ours.upload_id not in {u["UploadId"] for u in left}


def test_marker_recognition() -> None:
    body = marker_bytes("a/b.pte")
    md5 = hashlib.md5(body).hexdigest()
    assert is_marker_part("a/b.pte", {"PartNumber": MARKER_PART_NUMBER, "ETag": f'"{md5}"'})
    assert not is_marker_part("a/c.pte", {"PartNumber": MARKER_PART_NUMBER, "ETag": f'"{md5}"'})
    assert not is_marker_part("a/b.pte", {"PartNumber": 3, "ETag": f'"{md5}"'})


def test_interpreter_exit_aborts_the_upload(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, part: int
) -> None:
    key = f"exit/{uuid.uuid4().hex}.pte"
    script = textwrap.dedent(
        f"""
        from ptestore.writers import open_writer
        w = open_writer("s3://{s3_bucket}/{key}", part_size={part},
                        **{s3_server.storage_options!r})
        w.write(bytes({3 * part}), 0)
        w.wait_uploads()
        print(w.upload_id, flush=True)
        # exit without publish or discard: the module-level writer is finalized at exit
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip()
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket, Prefix=key).get("Uploads", [])
    assert uploads == []
    assert "Contents" not in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix=key)


@pytest.mark.parametrize("mode", ["create", "overwrite"])
@pytest.mark.parametrize("size", [1000, 2 * PART + 3], ids=["put", "multipart"])
def test_create_sends_if_none_match_on_the_commit_request(
    s3_server: S3TestServer, url: str, mode: str, size: int
) -> None:
    """Whatever the server enforces: the request that commits carries If-None-Match: *
    in create mode and only then (moto enforces it; a server that ignores it would let
    a create replace an object, so the header is checked on the wire)."""
    w = writer(s3_server, url)
    sent: dict[str, str | None] = {}

    def record(request: Any, event_name: str, **_: Any) -> None:
        value = request.headers.get("If-None-Match")
        text = value.decode() if isinstance(value, bytes) else value
        sent[event_name.rsplit(".", 1)[1]] = text

    for op in ("PutObject", "CompleteMultipartUpload", "CreateMultipartUpload"):
        w.client.meta.events.register(f"before-send.s3.{op}", record)
    w.write(random.randbytes(size), 0)
    w.publish(mode)  # type: ignore[arg-type]
    commit = "PutObject" if size < PART else "CompleteMultipartUpload"
    assert sent[commit] == ("*" if mode == "create" else None), sent
    assert sent.get("CreateMultipartUpload") is None
