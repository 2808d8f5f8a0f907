"""An S3 object as a copy source: where it is, which version, and who may read it.

An :class:`~ptestore.writers.S3Writer` copies a range of another object on the service
(``UploadPartCopy``) only when its own client reaches the same endpoint with the same
credentials as the loader that read the source: then the copy reads exactly what the
loader could read, and nothing else. :func:`s3_identity` names that pair (endpoint URL,
region, requester-pays and a digest of the credential options) without exposing any
secret; two s3fs filesystems built from the same options, in the same process and
environment, have the same identity.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .._dataclass import dataclass

__all__ = ["S3Source", "matching_source", "s3_identity", "s3_source_of"]

#: s3fs options and client arguments that select the credentials.
_CREDENTIAL_KWARGS = ("profile", "aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_SSE_C = "SSECustomerKey"


@dataclass(frozen=True)
class S3Source:
    """One version of an S3 object, as read when its loader was opened."""

    bucket: str
    key: str
    #: The version read (versioned buckets), pinned by every copy and read.
    version_id: str | None
    #: The ETag read at the start: every copy sends ``CopySourceIfMatch`` with it.
    etag: str
    size: int
    #: :func:`s3_identity` of the loader's filesystem.
    identity: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def copy_source(self) -> dict[str, str]:
        """The ``CopySource`` parameter of ``UploadPartCopy``."""
        src = {"Bucket": self.bucket, "Key": self.key}
        if self.version_id:
            src["VersionId"] = self.version_id
        return src

    def pin(self) -> dict[str, str]:
        """Parameters of a ``GetObject`` that must read this version and no other."""
        params = {"IfMatch": self.etag}
        if self.version_id:
            params["VersionId"] = self.version_id
        return params


def s3_identity(fs: Any) -> str:
    """Endpoint, region and credential choice of an s3fs ``S3FileSystem`` (connected).

    Credentials are compared as a digest of the options that choose them (``key``,
    ``secret``, ``token``, ``anon``, ``profile``, the ``aws_*`` client arguments, an
    injected session); when none is given both sides use the same default chain.
    """
    client = fs.s3
    client_kwargs = dict(getattr(fs, "client_kwargs", None) or {})
    kwargs = dict(getattr(fs, "kwargs", None) or {})
    chosen = [
        getattr(fs, "anon", False),
        getattr(fs, "key", None),
        getattr(fs, "secret", None),
        getattr(fs, "token", None),
    ]
    chosen += [kwargs.get(k, client_kwargs.get(k)) for k in _CREDENTIAL_KWARGS]
    if not getattr(fs, "_session_is_owned", True):  # a session the caller injected
        chosen.append(id(fs.session))
    digest = hashlib.sha256(repr(chosen).encode()).hexdigest()[:16]
    endpoint = client.meta.endpoint_url
    region = client.meta.region_name
    payer = "requester-pays" if getattr(fs, "requester_pays", False) else "owner-pays"
    return f"{endpoint}|{region}|{payer}|{digest}"


def matching_source(loader: object, identity: str) -> S3Source | None:
    """``loader``'s :class:`S3Source` if it has one (``loader.s3_source()``) on the
    endpoint and credentials ``identity``, else None."""
    describe = getattr(loader, "s3_source", None)
    source = describe() if callable(describe) else None
    if isinstance(source, S3Source) and source.identity == identity:
        return source
    return None


def s3_source_of(
    fs: Any, path: str, etag: str | None, version_id: str | None, size: int
) -> S3Source | None:
    """The :class:`S3Source` of ``path`` on ``fs``, or None when the service cannot copy
    it for us: not s3fs, no ETag to pin it, or encrypted with a customer key (SSE-C)."""
    try:
        from s3fs import S3FileSystem
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    if not isinstance(fs, S3FileSystem) or not etag:
        return None
    if _SSE_C in (getattr(fs, "s3_additional_kwargs", None) or {}):
        return None
    bucket, _, key = path.lstrip("/").partition("/")
    if not bucket or not key:
        return None
    return S3Source(bucket, key, version_id or None, etag, size, s3_identity(fs))
