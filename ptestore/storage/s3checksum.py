"""What S3 says about an object's bytes without sending them: its stored checksum
(``HEAD`` with ``ChecksumMode=ENABLED``) and, for a multipart object, its parts.

Used to trust an object by its checksum (:mod:`ptestore.fleet.binding`). Every request
asks for the version the loader opened (``VersionId``: the one the loader's ``HEAD``
reported, on a versioned bucket), and a checksum or part list
whose ETag is not the one the loader read means the object was replaced: nothing is
reported then, so the caller reads the bytes instead. Each request is retried as every
other request for the object is: under the loader's :class:`~ptestore._retry.RetryPolicy`
(its ``retry_*`` options), transient failures (a dropped connection, 5xx, throttling)
asked again, permanent ones (403, 404, a 501 ``NotImplemented``) not. A failure that
remains (no permission for ``GetObjectAttributes``, a server without it, a transient one
after the policy's attempts) reports nothing: a checksum that cannot be had costs a
read, never a wrong trust.

The part sizes come from ``GetObjectAttributes`` (``ObjectParts``: AWS and SeaweedFS
list them, 1,000 per page; AWS also gives each part's checksum) or, where it lists
none (moto), from a ``HEAD`` of part 1 (``PartNumber=1``: its size and ``PartsCount``):
then every part but the last is assumed to have part 1's size, as every common
uploader makes them (``assumed``); a checksum computed on that grid that does not match
proves nothing and the caller reads. A part count past S3's 10,000 (:data:`MAX_PARTS`),
in ``PartsCount`` or a checksum's ``-N``, is not believed: nothing is reported (a read),
and nothing is built per claimed part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ..checksums import ALGORITHMS

if TYPE_CHECKING:
    from .._retry import RetryPolicy

__all__ = ["MAX_PARTS", "ObjectParts", "S3Object", "StoredChecksum", "s3_object", "stored_checksum"]


@dataclass(frozen=True)
class StoredChecksum:
    """The checksum a ``HEAD``/``GetObject`` with ``ChecksumMode=ENABLED`` (or an
    upload's answer) reported."""

    algorithm: str
    #: Base64 text, without the ``-N`` of a composite.
    value: str
    #: ``"FULL_OBJECT"``, ``"COMPOSITE"`` or None (the server did not say: moto and
    #: SeaweedFS for a single PutObject, moto for multipart objects).
    type: str | None
    #: The ``N`` of ``<base64>-N``, when the value carried it.
    parts: int | None = None

    @property
    def composite(self) -> bool:
        """Declared composite (by its type or its ``-N``)."""
        return self.type == "COMPOSITE" or self.parts is not None

    @property
    def full_object(self) -> bool:
        """Declared a checksum of the whole object's bytes."""
        return self.type == "FULL_OBJECT" and self.parts is None

    def __str__(self) -> str:
        suffix = "" if self.parts is None else f"-{self.parts}"
        kind = "" if self.type is None else f" ({self.type})"
        return f"{self.algorithm} {self.value}{suffix}{kind}"


def stored_checksum(answer: Mapping[str, Any]) -> StoredChecksum | None:
    """The checksum in an S3 answer (``ChecksumCRC64NVME``, ..., ``ChecksumType``), or
    None when it carries none."""
    kind = answer.get("ChecksumType")
    kind = kind if isinstance(kind, str) and kind else None
    for algorithm in ALGORITHMS:
        text = answer.get(f"Checksum{algorithm}")
        if not isinstance(text, str) or not text:
            continue
        value, dash, count = text.partition("-")
        parts = None
        if dash:
            if not (count.isascii() and count.isdigit() and len(count) <= 5):
                continue  # no part count S3 could have made
            if not 1 <= int(count) <= MAX_PARTS:
                continue
            parts = int(count)
        return StoredChecksum(algorithm, value, kind, parts)
    return None


#: The most parts S3 makes an object of: a server that claims more is not believed.
MAX_PARTS = 10_000

#: Pages of ``GetObjectAttributes`` asked for at most (1,000 parts each; S3 allows 10,000).
_MAX_PAGES = 10


@dataclass(frozen=True)
class ObjectParts:
    """The parts of a multipart object, in order."""

    sizes: tuple[int, ...]
    #: Each part's stored checksum as the service lists it (base64), when it does.
    checksums: tuple[str | None, ...]
    #: True when the sizes were inferred from part 1 (see the module's docstring).
    assumed: bool


#: The S3 name of each request :class:`S3Object` makes (what a retry's record names).
_REQUESTS = {"head_object": "HeadObject", "get_object_attributes": "GetObjectAttributes"}


class S3Object:
    """One version of an S3 object as a loader opened it (s3fs filesystem and path),
    each request retried under ``retry`` (the loader's policy; the default one when
    None) and counted in :attr:`requests`, every attempt included."""

    def __init__(
        self,
        fs: Any,
        path: str,
        etag: str | None,
        version: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        name: str | None = None,
    ) -> None:
        self.fs = fs
        self.bucket, self.key, in_path = fs.split_path(path)
        self.version = version or in_path
        self.etag = etag
        self.size: int | None = None
        self.requests = 0
        self.retry = retry
        self.name = name or f"s3://{self.bucket}/{self.key}"

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        import fsspec.asyn

        from .._retry import DEFAULT_RETRY

        params = {"Bucket": self.bucket, "Key": self.key, **params}
        if self.version:
            params["VersionId"] = self.version

        def attempt() -> dict[str, Any]:
            self.requests += 1
            answer: dict[str, Any] = fsspec.asyn.sync(
                self.fs.loop, self.fs._call_s3, operation, **params
            )
            return answer

        retry = self.retry or DEFAULT_RETRY
        what = f"{self.name}: {_REQUESTS.get(operation, operation)}"
        return retry.call(attempt, what=what, retry_on=_worth_asking_again)

    def _same(self, answer: dict[str, Any]) -> bool:
        return self.etag is None or answer.get("ETag") == self.etag

    def checksum(self) -> StoredChecksum | None:
        """The stored checksum (``HEAD``), or None (none, replaced, or no answer)."""
        try:
            head = self._call("head_object", ChecksumMode="ENABLED")
        except Exception:
            return None
        if not self._same(head):
            return None
        self.size = int(head.get("ContentLength", -1))
        return stored_checksum(head)

    def parts(self, algorithm: str) -> ObjectParts | None:
        """The object's parts (sizes, and ``algorithm``'s checksum of each where
        listed), or None when they cannot be had."""
        listed = self._listed(algorithm)
        return listed if listed is not None else self._from_part_one()

    def _listed(self, algorithm: str) -> ObjectParts | None:
        sizes: list[int] = []
        sums: list[str | None] = []
        marker = 0
        for _ in range(_MAX_PAGES):
            try:
                params: dict[str, Any] = {"ObjectAttributes": ["ObjectParts", "ETag"]}
                if marker:
                    params["PartNumberMarker"] = marker
                answer = self._call("get_object_attributes", **params)
            except Exception:
                return None
            etag = answer.get("ETag")
            if (
                self.etag is not None
                and etag is not None
                and etag.strip('"') != self.etag.strip('"')
            ):
                return None
            listing = answer.get("ObjectParts") or {}
            for part in listing.get("Parts") or []:
                sizes.append(int(part.get("Size", -1)))
                value = part.get(f"Checksum{algorithm}")
                sums.append(value if isinstance(value, str) and value else None)
            if not listing.get("IsTruncated"):
                break
            marker = int(listing.get("NextPartNumberMarker") or 0)
            if marker <= 0:
                return None
        else:
            return None
        if not sizes or any(n <= 0 for n in sizes):
            return None
        return ObjectParts(tuple(sizes), tuple(sums), assumed=False)

    def _from_part_one(self) -> ObjectParts | None:
        # Not pinned to the ETag (moto answers with part 1's ETag and compares If-Match
        # with it): the sizes are only a hint. A grid of another version can only make
        # the predicted checksum differ, which is then read, never trusted.
        try:
            head = self._call("head_object", PartNumber=1)
        except Exception:
            return None
        first = int(head.get("ContentLength", -1))
        count = int(head.get("PartsCount") or 0)
        size = self.size
        if size is None or first <= 0 or not 1 <= count <= MAX_PARTS:
            return None  # a count S3 cannot have made is no grid (and no list that long)
        last = size - (count - 1) * first
        if not 0 < last <= first:
            return None
        sizes = (first,) * (count - 1) + (last,)
        return ObjectParts(sizes, (None,) * count, assumed=True)


def _worth_asking_again(exc: BaseException) -> bool:
    """A transient failure (:func:`~ptestore._retry.is_transient`), unless it is a
    ``NotImplemented`` (HTTP 501): a server without ``GetObjectAttributes`` answers so
    every time, and its part sizes are asked of part 1's ``HEAD`` at once."""
    from .._retry import error_code, is_transient

    return is_transient(exc) and error_code(exc) != "NotImplemented"


def s3_object(loader: object) -> S3Object | None:
    """The :class:`S3Object` behind a loader of an S3 object (s3fs), else None; its
    requests retried under the loader's policy (``retry``: its ``retry_*`` options)."""
    from .._retry import RetryPolicy

    fs: Any = getattr(loader, "fs", None)
    path = getattr(loader, "path", None)
    if fs is None or not isinstance(path, str) or type(fs).__name__ != "S3FileSystem":
        return None
    etag = getattr(loader, "etag", None)
    version = getattr(loader, "version_id", None)  # the one it opened (versioned buckets)
    retry = getattr(loader, "retry", None)
    name = getattr(loader, "name", None)
    return S3Object(
        fs,
        path,
        etag if isinstance(etag, str) else None,
        version if isinstance(version, str) else None,
        retry=retry if isinstance(retry, RetryPolicy) else None,
        name=name if isinstance(name, str) else None,
    )
