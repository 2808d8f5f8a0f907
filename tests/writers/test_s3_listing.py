"""Pending uploads listed page by page as each server pages them (``gc`` saw only
SeaweedFS's first page), and a writer with SSE-C keys that can abort its upload
(``AbortMultipartUpload`` takes no SSE-C keys: botocore refused the request)."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from typing import Any

import pytest

from ptestore.gc import collect_s3
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, open_writer
from ptestore.writers.s3 import MIN_PART_SIZE, listing
from ptestore.writers.s3.config import S3Connection

pytestmark = pytest.mark.s3


def _part(server: S3TestServer) -> int:
    return max(MIN_PART_SIZE, server.min_part_size)


def _writer(server: S3TestServer, url: str, **kw: Any) -> S3Writer:
    opts = {"part_size": _part(server), "skip_instance_cache": True, **kw}
    w = open_writer(url, **server.storage_options, **opts)
    assert isinstance(w, S3Writer)
    return w


def _abandoned(server: S3TestServer, url: str) -> str:
    """A ptestore upload nobody aborts (a crashed writer): its marker part only."""
    w = _writer(server, url)
    w.write(bytes(2 * _part(server)), 0)
    w.wait_uploads()
    assert w.upload_id is not None and w._finalizer is not None
    w._finalizer.detach()
    return w.upload_id


def _pending(client: Any, bucket: str, prefix: str) -> list[str]:
    # one page of everything (these tests make a handful)
    page = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return sorted(u["UploadId"] for u in page.get("Uploads", []))


def test_gc_goes_past_the_first_page(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"pages-{uuid.uuid4().hex[:6]}/"
    made = sorted(_abandoned(s3_server, f"s3://{s3_bucket}/{prefix}{i}.pte") for i in range(5))
    assert _pending(s3_client, s3_bucket, prefix) == made
    monkeypatch.setattr(listing, "PAGE", 2)  # SeaweedFS pages by 2: three pages

    done = collect_s3(f"s3://{s3_bucket}/{prefix}", older_than=0, **s3_server.storage_options)
    assert sorted(e.location.rsplit("=", 1)[1] for e in done) == made
    assert {e.action for e in done} == {"removed"}
    assert _pending(s3_client, s3_bucket, prefix) == []


def test_pages_list_every_upload_once(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"once-{uuid.uuid4().hex[:6]}/"
    keys = [f"{prefix}{i}" for i in (0, 0, 1, 2, 3)]  # two uploads of one key
    made = sorted(
        s3_client.create_multipart_upload(Bucket=s3_bucket, Key=k)["UploadId"] for k in keys
    )
    monkeypatch.setattr(listing, "PAGE", 2)
    conn = S3Connection(f"s3://{s3_bucket}/{prefix}", dict(s3_server.storage_options))
    try:
        pages = list(listing.upload_pages(conn, s3_bucket, prefix))
        first = list(listing.upload_pages(conn, s3_bucket, prefix, max_pages=1))
    finally:
        conn.close()
    listed = [u["UploadId"] for _, uploads in pages for u in uploads]
    assert sorted(listed) == made  # each once
    assert len(first) == 1 and first[0][1] == pages[0][1]
    for u in s3_client.list_multipart_uploads(Bucket=s3_bucket, Prefix=prefix).get("Uploads", []):
        s3_client.abort_multipart_upload(Bucket=s3_bucket, Key=u["Key"], UploadId=u["UploadId"])


def _sse_c() -> dict[str, str]:
    key = os.urandom(32)
    return {
        "SSECustomerAlgorithm": "AES256",
        "SSECustomerKey": base64.b64encode(key).decode(),
        "SSECustomerKeyMD5": base64.b64encode(hashlib.md5(key).digest()).decode(),
    }


def test_a_writer_with_sse_c_keys_discards_its_upload(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    prefix = f"ssec-{uuid.uuid4().hex[:6]}/"
    w = _writer(s3_server, f"s3://{s3_bucket}/{prefix}m.pte", s3_additional_kwargs=_sse_c())
    w.write(b"x" * (12 << 20), 0)
    assert len(_pending(s3_client, s3_bucket, prefix)) == 1
    w.discard()  # raised StorageError: "Unknown parameter in input: SSECustomerAlgorithm"
    assert _pending(s3_client, s3_bucket, prefix) == []


def test_a_writer_with_sse_c_keys_publishes(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    sse = _sse_c()
    key = f"ssec-{uuid.uuid4().hex[:6]}/m.pte"
    data = os.urandom(12 << 20)
    w = _writer(s3_server, f"s3://{s3_bucket}/{key}", s3_additional_kwargs=sse)
    w.write(data, 0)
    w.publish()
    got = s3_client.get_object(Bucket=s3_bucket, Key=key, **sse)["Body"].read()
    assert got == data
