"""The remote loader: ranged reads through any fsspec filesystem (``memory://``,
``s3://``, ...), with retries (:mod:`ptestore._retry`) and the small-object whole read
(:data:`WHOLE_READ_LIMIT`). Imported by :func:`~ptestore.storage.loaders.open_loader` for
the first remote URL only: a local run never loads it, nor fsspec, nor the retry policy.

On S3 every read is a ``GetObject`` of the object's bucket and key, pinned to the
version the loader opened (``If-Match: <ETag>``, and ``VersionId`` on a versioned
bucket), and the ETag (and version) of each answer is compared with the pinned one: an
object replaced while it is read, even by one put back before the end (A, B, A: same
ETag), fails the read with :class:`~ptestore.errors.PreconditionFailed` ("replaced
while being read"), never bytes of two versions. That is not retried; nor is a ``HEAD``
or ``GetObject`` answer without an ETag, a StorageError (:func:`.pinned.answer_etag`).

Every read holds at most one byte more than it asked for: on S3 the ``GetObject`` body,
on ``http(s)://`` the ranged GET's body, are read as streams, no further
(:func:`.pinned.read_at_most`); any other protocol through its file API. An answer that
goes on past the range asked for (a proxy sending an endless body) is an
:class:`~ptestore.errors.IntegrityError` naming the object, the range and the bytes read
(:func:`.pinned.longer_body_message`), never held in memory; nor is it retried.

One retry layer: the loader's :class:`~ptestore._retry.RetryPolicy`. On S3
(:func:`one_retry_layer`) s3fs's own retry loop around each request (``_call_s3``, 5
attempts with its own backoff) is cut to one attempt, and botocore's retries are off
(``total_max_attempts=1``) unless ``config_kwargs`` sets ``retries``, as for the S3
writer: nested, the three multiplied (3 x 5 x 5 = 75 requests for a read on a dropped
connection with ``retry_attempts=3``). :func:`open_filesystem` makes such a filesystem
and its policy from a URL's storage options, for the loader and for what calls fsspec
itself (the fleet's orphan sweep and re-use listing).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from .._retry import DEFAULT_RETRY, RETRY_OPTIONS, Category, RetryPolicy, classify, to_storage_error
from ..errors import (
    ConfigurationError,
    IntegrityError,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
)
from ._options import fsspec_options
from ._s3source import S3Source, s3_source_of
from .base import LoaderBase, check_range
from .types import StorageURL

__all__ = [
    "WHOLE_READ_LIMIT",
    "FsspecLoader",
    "S3Source",
    "fresh_info",
    "fs_class",
    "one_retry_layer",
    "open_filesystem",
    "s3_options",
]

#: A remote object no larger than this is read whole at its second read (one request).
WHOLE_READ_LIMIT = 1 << 20

#: What s3fs takes, in a key, for the start of a version id (``split_path``).
_VERSION_IN_KEY = "?versionId="


def fresh_info(fs: Any, path: str) -> dict[str, Any]:
    """``fs.info(path)`` asked of the store itself, never of a listing cached earlier.

    fsspec filesystems cache directory listings per instance and fsspec shares
    instances per option set, so an application's own ``ls`` would otherwise answer a
    later "is the source unchanged" question with what it saw before. The cached entry
    is invalidated and s3fs is asked with ``refresh=True`` (a HEAD every time)."""
    invalidate = getattr(fs, "invalidate_cache", None)
    if callable(invalidate):
        invalidate(path)
    if _is_s3fs(fs):
        info: dict[str, Any] = fs.info(path, refresh=True)
        return info
    out: dict[str, Any] = fs.info(path)
    return out


def _is_s3fs(fs: Any) -> bool:
    return type(fs).__module__.split(".")[0] == "s3fs"


def _is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP filesystem (``http://``, ``https://``), or made
    from it (known by its class, without importing aiohttp)."""
    return any(
        c.__name__ == "HTTPFileSystem" and c.__module__ == "fsspec.implementations.http"
        for c in type(fs).__mro__
    )


def _is_s3fs_class(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "s3fs"


#: botocore's retries off: :class:`~ptestore._retry.RetryPolicy` is the one layer.
NO_BOTOCORE_RETRIES = {"total_max_attempts": 1, "mode": "standard"}


def s3_options(fs_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for an s3fs filesystem class with botocore's retries off (unless
    ``config_kwargs`` sets ``retries``); other classes' options as they are."""
    if not _is_s3fs_class(fs_cls):
        return options
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", dict(NO_BOTOCORE_RETRIES))
    return {**options, "config_kwargs": config}


def one_retry_layer(fs: Any) -> Any:
    """``fs`` with s3fs's own retry loop cut to one attempt (an s3fs filesystem; any
    other is returned as it is): every request of the loader (``GetObject``, the
    ``HEAD`` of ``info``) is then retried by its :class:`RetryPolicy` only. s3fs reads
    ``retries`` per call from the instance; fsspec may share the instance with other
    users of the same options (botocore's retries, :func:`s3_options`, make those
    options ptestore's own unless ``config_kwargs`` sets ``retries``)."""
    if _is_s3fs(fs):
        fs.retries = 1
    return fs


def open_filesystem(
    url: StorageURL, options: Mapping[str, Any], *, fresh: bool = False
) -> tuple[Any, str, RetryPolicy]:
    """``(filesystem, path, policy)`` for the remote ``url``: the fsspec filesystem of
    its protocol made from ``options`` (a loader's: the filesystem's own and the
    ``retry_*`` ones), the path it gives ``url``, and the :class:`RetryPolicy` the
    ``retry_*`` options make, the one retry layer of every request made through that
    filesystem (:func:`s3_options`, :func:`one_retry_layer`: s3fs's and botocore's
    retries off). ``fresh``: a filesystem of its own, never an instance fsspec shares
    (nor its cached listings). :class:`~ptestore.errors.ConfigurationError` for a
    bad retry option or options the filesystem class refuses."""
    fs_cls = fs_class(url)
    opts = dict(options)
    retry = RetryPolicy.from_options(url.text, opts)
    opts = s3_options(fs_cls, opts)
    if fresh:
        opts["skip_instance_cache"] = True
    try:
        fs = one_retry_layer(fs_cls(**opts))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{url.text}: bad storage options: {exc}") from exc
    path = url.path if url.protocol in ("s3", "memory") else fs._strip_protocol(url.text)
    return fs, path, retry


class FsspecLoader(LoaderBase):
    """Ranged reads through any fsspec filesystem (``memory://``, ``s3://``, ...)."""

    #: The retry options; the filesystem's own are added per URL.
    options: ClassVar[frozenset[str]] = frozenset(RETRY_OPTIONS)

    @classmethod
    def accepted_options(cls, url: StorageURL) -> frozenset[str]:
        """:attr:`options` plus every option of the URL's fsspec filesystem class."""
        return cls.options | fsspec_options(fs_class(url))

    def __init__(
        self,
        fs: Any,
        path: str,
        url: str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.fs = fs
        self.path = path
        self.name = url
        #: The policy of every request for the object (its ``retry_*`` options).
        self.retry = retry
        #: ``(bucket, key)`` of an S3 object (read by GetObject, pinned), else None.
        self._s3: tuple[str, str] | None = None
        if _is_s3fs(fs):
            if _VERSION_IN_KEY in path:
                raise ConfigurationError(
                    f"{url}: an S3 key containing {_VERSION_IN_KEY!r} cannot be read: s3fs "
                    "takes what follows it for a version id of the key before it, and "
                    "would read another object; rename the object"
                )
            bucket, _, key = path.lstrip("/").partition("/")
            if key.endswith("/"):  # as S3Writer refuses such a destination
                raise ConfigurationError(
                    f"{url}: an S3 key ending in '/' cannot be read: s3fs asks for the "
                    "key without its '/' (another object, or none) where a read asks "
                    "for the key itself; rename the object"
                )
            self._s3 = (bucket, key)
        info = self._info("no such object")
        if info.get("type") == "directory":
            raise StorageError(f"{url}: is a directory, not an object")
        self._size = int(info["size"])
        #: Entity tag / version of the object when the storage reports one (an S3
        #: object's HEAD must: every read is pinned to it).
        self.etag: str | None = self._etag_of(info, "HeadObject")
        #: Version id of the object read (S3 versioned buckets), else None.
        self.version_id: str | None = info.get("VersionId") or None
        #: When the object was made, where the store says so (``memory://``: each publish
        #: installs a new object), else None.
        self.created: object = info.get("created")
        #: Bytes asked of the store so far (whole-object reads included).
        self.bytes_fetched = 0
        self._reads = 0
        self._whole: bytes | None = None
        self._whole_lock = threading.Lock()
        from fsspec.implementations.memory import MemoryFileSystem

        self._read_whole = self._size <= WHOLE_READ_LIMIT and not isinstance(fs, MemoryFileSystem)

    @property
    def in_memory(self) -> bool:
        """True once every byte of the object is held in memory (an object of at most
        :data:`WHOLE_READ_LIMIT` bytes, after its second read): reads cost no request."""
        return self._whole is not None

    def size(self) -> int:
        return self._size

    def _info(self, missing: str) -> dict[str, Any]:
        try:
            info: dict[str, Any] = self.retry.call(
                lambda: fresh_info(self.fs, self.path), what=f"{self.name}: stat"
            )
        except Exception as exc:
            if classify(exc) is Category.NOT_FOUND:
                raise ObjectNotFound(f"{self.name}: {missing}") from exc
            raise to_storage_error(exc, self.name, "stat") from exc
        return info

    def check_unchanged(self) -> None:
        """Raise :class:`~ptestore.errors.PreconditionFailed` if the object's size, entity
        tag or version id changed since it was opened."""
        info = self._info("object disappeared while reading")
        etag = self._etag_of(info, "HeadObject")
        version = info.get("VersionId") or None
        if (
            int(info["size"]) != self._size
            or (self.etag is not None and etag != self.etag)
            or (self.version_id is not None and version != self.version_id)
        ):
            versions = (
                f", version {self.version_id} -> {version}" if self.version_id is not None else ""
            )
            raise PreconditionFailed(
                f"{self.name}: replaced while being read (size {self._size} -> "
                f"{info['size']}, etag {self.etag} -> {etag}{versions}); its content may be "
                "a mix of two versions",
                url=self.name,
                expected=self.etag,
                found=etag,
                refused_by="ptestore",
            )

    def _etag_of(self, answer: dict[str, Any], request: str) -> str | None:
        """The ETag of ``request``'s answer (a HEAD's ``info``, a GetObject's): on S3
        one it must name (:func:`.pinned.answer_etag`: never read unpinned), elsewhere
        one the store may report, else None."""
        if self._s3 is not None:
            from .pinned import answer_etag

            return answer_etag(answer, self.name, request)
        etag = answer.get("ETag") or answer.get("etag")
        return etag if isinstance(etag, str) else None

    def s3_source(self) -> S3Source | None:
        """The S3 object this loader reads (bucket, key, the version and ETag read when it
        was opened, its endpoint and credential identity), or None when the filesystem is
        not s3fs: what lets an S3 writer on the same service copy ranges server-side."""
        return s3_source_of(self.fs, self.path, self.etag, self.version_id, self._size)

    def load(self, offset: int, size: int) -> bytes:
        check_range(self.name, offset, size, self._size)
        if size == 0:
            return b""
        if self._read_whole and (self._whole is not None or self._reads):
            if self._whole is None:
                with self._whole_lock:
                    if self._whole is None:
                        self._whole = self._read(0, self._size)
            return self._whole[offset : offset + size]
        self._reads += 1
        return self._read(offset, size)

    def _read(self, offset: int, size: int) -> bytes:
        def read() -> tuple[bytes, str | None, str | None, str | None]:
            if self._s3 is not None:
                return self._get(offset, size)
            return self._get_other(offset, size)

        what = f"read of {size} bytes at offset {offset}"
        self.bytes_fetched += size
        try:
            data, etag, version, other = self.retry.call(read, what=f"{self.name}: {what}")
        except Exception as exc:
            category = classify(exc)
            if category is Category.PRECONDITION:  # 412: If-Match no longer holds
                raise self._replaced(what, "answered 412", self._etag_now()) from exc
            if category is Category.NOT_FOUND:
                gone = "object" if self.version_id is None else f"version {self.version_id}"
                raise ObjectNotFound(f"{self.name}: {gone} disappeared while reading") from exc
            raise to_storage_error(exc, self.name, what) from exc
        if self.etag is not None and etag is not None and etag != self.etag:
            raise self._replaced(what, "answered another ETag", etag)
        if self.version_id is not None and version is not None and version != self.version_id:
            raise self._replaced(what, f"answered version {version}", etag)
        if other is not None or len(data) > size:  # not the bytes asked for: refused
            from .pinned import longer_body_message, other_range_message

            end = offset + size
            if other is not None:
                message = other_range_message(self.name, offset, end, other)
            else:
                message = longer_body_message(self.name, offset, end)
            raise IntegrityError(message, published=False)
        if len(data) != size:
            raise StorageError(
                f"{self.name}: short read: wanted {size} bytes at offset {offset}, "
                f"got {len(data)} (object changed while reading?)"
            )
        return data

    def _get(self, offset: int, size: int) -> tuple[bytes, str | None, str | None, str | None]:
        """One ranged ``GetObject`` pinned to the version opened: the bytes (at most one
        more than asked for, :func:`.pinned.read_at_most`: a longer body is never held),
        the ETag and version id the answer names, and what it holds when that is another
        range than the one asked for (:func:`.pinned.answered_range`; None when it is
        the range)."""
        import fsspec.asyn

        from .pinned import answered_range, get_params, read_at_most

        assert self._s3 is not None
        bucket, key = self._s3
        params = get_params(bucket, key, self.etag, self.version_id, offset, offset + size)
        fs = self.fs

        async def get() -> tuple[bytes, str | None, str | None, str | None]:
            resp = await fs._call_s3("get_object", **params)
            body = resp["Body"]
            try:
                data = await read_at_most(body, size + 1)
            finally:
                body.close()
            other = answered_range(resp, offset, offset + size)
            return data, self._etag_of(resp, "GetObject"), resp.get("VersionId"), other

        got: tuple[bytes, str | None, str | None, str | None] = fsspec.asyn.sync(fs.loop, get)
        return got

    def _get_other(
        self, offset: int, size: int
    ) -> tuple[bytes, str | None, str | None, str | None]:
        """A read through any other fsspec filesystem, of at most one byte more than
        asked for: ``memory://`` a slice of the object (held in this process already);
        ``http(s)://`` one ranged GET whose body is read as a stream
        (:meth:`_get_http`); any other protocol through its file API (``fs.open``
        without read-ahead, a seek, a read of ``size`` bytes: as far as that protocol's
        file reads are bounded, so is this one). Returns what :meth:`_get` does (no
        ETag, no version)."""
        from fsspec.implementations.memory import MemoryFileSystem

        fs = self.fs
        if isinstance(fs, MemoryFileSystem):
            data = fs.cat_file(self.path, start=offset, end=offset + size)
            return bytes(data), None, None, None
        if _is_http(fs):
            return self._get_http(offset, size)
        with fs.open(self.path, "rb", cache_type="none") as f:
            f.seek(offset)
            return bytes(f.read(size)), None, None, None

    def _get_http(self, offset: int, size: int) -> tuple[bytes, str | None, str | None, str | None]:
        """One GET with ``Range`` through fsspec's HTTP session, its body read as a
        stream, at most ``size + 1`` bytes of it (fsspec's own ``cat_file`` and file
        reads hold the whole body of an answer, whatever range was asked for)."""
        import fsspec.asyn

        from .pinned import answered_range, read_at_most

        fs = self.fs
        end = offset + size

        async def get() -> tuple[bytes, str | None, str | None, str | None]:
            session = await fs.set_session()
            kw = dict(fs.kwargs)
            headers = dict(kw.pop("headers", None) or {})
            headers["Range"] = f"bytes={offset}-{end - 1}"
            async with session.get(fs.encode_url(self.path), headers=headers, **kw) as r:
                if r.status == 404:
                    raise FileNotFoundError(self.name)
                r.raise_for_status()
                data = await read_at_most(r.content, size + 1)
                if len(data) > size:
                    r.close()  # the rest is never read, nor the connection used again
                length = r.headers.get("Content-Length")
                if r.status == 200:  # the whole object, whatever its length says
                    whole: int | None = self._size
                else:
                    whole = int(length) if length and length.isdigit() else None
                answer = {
                    "ContentRange": r.headers.get("Content-Range"),
                    "ContentLength": whole,
                    "ResponseMetadata": {"HTTPStatusCode": r.status},
                }
            return data, None, None, answered_range(answer, offset, end)

        got: tuple[bytes, str | None, str | None, str | None] = fsspec.asyn.sync(fs.loop, get)
        return got

    def _etag_now(self) -> str | None:
        """The object's ETag now (for a message; None when it cannot be asked)."""
        try:
            info = fresh_info(self.fs, self.path)
        except Exception:  # gone, or the store refuses: the message says "unknown"
            return None
        etag = info.get("ETag") or info.get("etag")
        return etag if isinstance(etag, str) else None

    def _replaced(self, what: str, answer: str, found: str | None) -> PreconditionFailed:
        """The error of a read whose answer is not the version the loader opened."""
        pinned = f"ETag {self.etag}"
        if self.version_id is not None:
            pinned += f", version {self.version_id}"
        return PreconditionFailed(
            f"{self.name}: replaced while being read: the {what}, pinned to {pinned}, "
            f"{answer} (the object's ETag is now {found or 'unknown'}); the read stops "
            "instead of mixing two versions",
            url=self.name,
            expected=self.etag,
            found=found,
            refused_by="storage" if answer == "answered 412" else "ptestore",
        )


def fs_class(url: StorageURL) -> type:
    import fsspec  # imported by the first remote URL: local files never need it

    try:
        cls: type = fsspec.get_filesystem_class(url.protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(
            f"{url.text}: cannot read protocol {url.protocol!r}: {exc}"
        ) from exc
    return cls
