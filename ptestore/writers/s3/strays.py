"""Uploads a retried ``CreateMultipartUpload`` left behind, found and aborted.

An attempt of ``CreateMultipartUpload`` that fails after its request may have reached
the service (its answer lost to a timeout or a dropped connection, a 5xx) is retried,
and the retry creates a second upload. The first one, if the service made it, was
never named to the writer: it stays pending, empty and without the gc marker part, so
``ptestore gc`` can never prove it is ptestore's. After a create that needed more than
one attempt, and once the upload it keeps holds its marker, the writer lists this key's
pending uploads (``ListMultipartUploads`` with ``Prefix=key``) and aborts each one that

- is for exactly this key and is not the upload it keeps;
- was initiated while its create ran: ``Initiated`` no earlier than the kept upload's
  ``Initiated`` minus the time the create took (measured locally with a monotonic
  clock) and no later than the kept upload's, with :data:`SLACK` seconds either side.
  Only the server's clock is compared with itself (both times are ``Initiated``
  values of one listing), so the client's clock, however wrong, plays no part;
- carries what the kept upload's listing entry carries where the create decided it
  (storage class, owner, initiator, checksum algorithm and type): an upload another
  tool started differs there as a rule;
- holds no part (``ListParts``): every ptestore upload holds its marker one round trip
  after its creation, and an upload with parts is somebody's work.

What each server reports decides how narrow that is (``tests/writers/test_s3_faults.py``):
AWS reports all of it; SeaweedFS 4.48 reports ``Initiated`` (to the second) but none of
the other fields; moto 5.2 reports the fields but the same fixed ``Initiated``
(2010-11-10T20:48:33Z) for every upload, so there the window holds every upload of the
key. Nothing here ever fails the writer: a listing or an abort that fails is logged as
a warning, and what it leaves is the lifecycle rule's.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from ..._log import get_logger
from ..._retry import error_code
from .config import S3Connection
from .listing import upload_pages

__all__ = ["SLACK", "abort_strays"]

log = get_logger("ptestore.writers.s3")

#: Seconds allowed either side of the window an orphan's ``Initiated`` must lie in:
#: SeaweedFS reports it to the second, and a distributed service's nodes' clocks differ
#: slightly.
SLACK = 2.0
#: Fields of a ``ListMultipartUploads`` entry the create request (or who sent it)
#: decides: an orphan of this writer's create has the kept upload's values.
SAME_FIELDS = ("StorageClass", "Owner", "Initiator", "ChecksumAlgorithm", "ChecksumType")
#: Listing pages read at most (1,000 uploads each).
MAX_PAGES = 10


def abort_strays(conn: S3Connection, bucket: str, key: str, keep: str, took: float) -> list[str]:
    """Abort the uploads of ``key`` that a create of ``keep`` which took ``took``
    seconds (its retries included) may have left behind (see the module docstring);
    return their ids. Never raises for a storage failure: it is logged."""
    where = f"s3://{bucket}/{key}"
    try:
        uploads = [u for u in _uploads(conn, bucket, key) if u.get("Key") == key]
    except Exception as exc:
        log.warning(
            "%s: cannot list the uploads a retried CreateMultipartUpload may have left "
            "behind: %s; an AbortIncompleteMultipartUpload lifecycle rule removes them",
            where,
            exc,
        )
        return []
    kept = next((u for u in uploads if u.get("UploadId") == keep), None)
    if kept is None or kept.get("Initiated") is None:
        log.warning(
            "%s: upload %s is not listed with its initiation time: the uploads a retried "
            "CreateMultipartUpload may have left behind are left to a lifecycle rule",
            where,
            keep,
        )
        return []
    aborted: list[str] = []
    for upload in uploads:
        upload_id = upload.get("UploadId")
        if upload_id == keep or not isinstance(upload_id, str):
            continue
        if not _made_with(upload, kept, took) or not _empty(conn, bucket, key, upload_id):
            continue
        if _abort(conn, bucket, key, upload_id):
            log.info(
                "%s: aborted upload %s, left behind by a retried CreateMultipartUpload",
                where,
                upload_id,
            )
            aborted.append(upload_id)
    return aborted


def _uploads(conn: S3Connection, bucket: str, key: str) -> Iterator[dict[str, Any]]:
    for _, uploads in upload_pages(conn, bucket, key, max_pages=MAX_PAGES):
        yield from uploads


def _made_with(upload: dict[str, Any], kept: dict[str, Any], took: float) -> bool:
    """Whether ``upload`` may come from the create that made ``kept``: initiated while
    it ran, with the same fields the request decided."""
    initiated = upload.get("Initiated")
    if initiated is None:
        return False
    latest = kept["Initiated"] + timedelta(seconds=SLACK)
    earliest = kept["Initiated"] - timedelta(seconds=took + SLACK)
    if not earliest <= initiated <= latest:
        return False
    return all(upload.get(name) == kept.get(name) for name in SAME_FIELDS)


def _empty(conn: S3Connection, bucket: str, key: str, upload_id: str) -> bool:
    """Whether the upload holds no part (False when it cannot be told, or is gone)."""
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id, "MaxParts": 1}
    try:
        page = conn.request("ListParts", "list_parts", **params, **conn.extras)
    except Exception as exc:
        if error_code(exc) != "NoSuchUpload":
            log.warning(
                "s3://%s/%s: cannot list the parts of upload %s: %s", bucket, key, upload_id, exc
            )
        return False
    return not page.get("Parts")


def _abort(conn: S3Connection, bucket: str, key: str, upload_id: str) -> bool:
    try:
        conn.request(
            "AbortMultipartUpload",
            "abort_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            **conn.plain_extras,
        )
    except Exception as exc:
        if error_code(exc) == "NoSuchUpload":
            return False  # gone meanwhile
        log.warning(
            "s3://%s/%s: cannot abort upload %s, left behind by a retried "
            "CreateMultipartUpload: %s; an AbortIncompleteMultipartUpload lifecycle rule "
            "removes it",
            bucket,
            key,
            upload_id,
            exc,
        )
        return False
    return True
