"""The version token of an S3 object (its ETag), with or without its bytes."""

from __future__ import annotations

from typing import Any

from ..._retry import Category, classify, error_code, to_storage_error
from ...errors import ConfigurationError
from ...storage.pinned import answer_etag
from ...storage.types import split_url
from ..base import Versioned
from .config import S3Connection

__all__ = ["s3_current_version", "s3_read_versioned"]


def _connect(url: str, options: dict[str, Any]) -> tuple[S3Connection, str, str]:
    protocol, rest = split_url(url)
    bucket, _, key = rest.partition("/")
    if protocol != "s3" or not bucket or not key or key.endswith("/"):
        raise ConfigurationError(f"{url}: expected s3://bucket/key")
    return S3Connection(url, dict(options)), bucket, key


def s3_read_versioned(url: str, max_bytes: int | None = None, **storage_options: Any) -> Versioned:
    """The object's bytes and the ETag they came with (one GetObject); the body of an
    object larger than ``max_bytes`` (its ``Content-Length``) is never read, nor more of
    any body than its ``Content-Length`` says (:meth:`.S3Connection.invoke_read`). An
    answer without a usable ETag is a StorageError naming the object and the header
    (:func:`~ptestore.storage.pinned.answer_etag`): ``ensure`` then serves the entry it
    fetched before, as when the store is unreachable."""
    conn, bucket, key = _connect(url, storage_options)
    try:
        resp, data = conn.call(
            "GetObject",
            lambda: conn.invoke_read(
                "get_object", max_bytes=max_bytes, Bucket=bucket, Key=key, **conn.extras
            ),
        )
    except Exception as exc:
        if classify(exc) is Category.NOT_FOUND and error_code(exc) != "NoSuchBucket":
            return Versioned(b"", None)
        raise to_storage_error(exc, f"s3://{bucket}/{key}", "GetObject") from exc
    finally:
        conn.close()
    etag = answer_etag(resp, f"s3://{bucket}/{key}", "GetObject")
    size = int(resp.get("ContentLength", len(data)))
    if max_bytes is not None and max(size, len(data)) > max_bytes:
        return Versioned(b"", etag, max(size, len(data)))
    return Versioned(bytes(data), etag)


def s3_current_version(url: str, **storage_options: Any) -> str | None:
    """The object's ETag (one HeadObject), or None when there is no object."""
    conn, bucket, key = _connect(url, storage_options)
    try:
        head = conn.request("HeadObject", "head_object", Bucket=bucket, Key=key, **conn.extras)
    except Exception as exc:
        if classify(exc) is Category.NOT_FOUND:
            return None
        raise to_storage_error(exc, f"s3://{bucket}/{key}", "HeadObject") from exc
    finally:
        conn.close()
    return answer_etag(head, f"s3://{bucket}/{key}", "HeadObject")
