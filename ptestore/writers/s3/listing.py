"""A prefix's pending multipart uploads, page by page, as each server pages them.

AWS S3 answers a truncated ``ListMultipartUploads`` with ``NextKeyMarker`` and
``NextUploadIdMarker``, and goes on after both. SeaweedFS (4.48) lists by upload id: a
truncated page names only ``NextUploadIdMarker``, and it goes on after an
``UploadIdMarker`` given alone (with the key marker as well it answers an empty page).
moto (5.2) ignores ``MaxUploads`` and lists everything at once. :func:`upload_pages`
follows whichever markers a page gives, and ends where a page brings no upload it has
not seen (a server that ignored the marker would otherwise be asked forever).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .config import S3Connection

__all__ = ["PAGE", "upload_pages"]

#: Uploads asked for per page (the most S3 gives).
PAGE = 1000


def upload_pages(
    conn: S3Connection, bucket: str, prefix: str, *, max_pages: int | None = None
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each ``ListMultipartUploads`` answer for ``prefix`` (its ``Date`` header tells
    the server's clock) with the uploads it lists that no earlier page did, in order; at
    most ``max_pages`` pages. Storage errors propagate as botocore raised them."""
    kwargs: dict[str, Any] = {
        "Bucket": bucket,
        "Prefix": prefix,
        "MaxUploads": PAGE,
        **conn.plain_extras,
    }
    seen: set[tuple[Any, Any]] = set()
    pages = 0
    while True:
        page = conn.request("ListMultipartUploads", "list_multipart_uploads", **kwargs)
        fresh = []
        for upload in page.get("Uploads") or []:
            ident = (upload.get("Key"), upload.get("UploadId"))
            if ident not in seen:
                seen.add(ident)
                fresh.append(upload)
        if pages and not fresh:
            return  # the marker was not followed: nothing new would come
        yield page, fresh
        pages += 1
        if not page.get("IsTruncated") or (max_pages is not None and pages >= max_pages):
            return
        key, upload_id = page.get("NextKeyMarker"), page.get("NextUploadIdMarker")
        if key:
            kwargs["KeyMarker"], kwargs["UploadIdMarker"] = key, upload_id or ""
        elif upload_id:
            kwargs.pop("KeyMarker", None)
            kwargs["UploadIdMarker"] = upload_id
        else:
            return  # truncated, and no marker to go on from
