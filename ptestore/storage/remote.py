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

One retry layer: the loader's :class:`~ptestore._retry.RetryPolicy` (s3fs's and
botocore's retries off: :func:`.filesystems.one_retry_layer`, :func:`.filesystems.s3_options`).
:func:`~.filesystems.open_filesystem` makes the filesystem and its policy from a URL's
storage options; on S3 the process's shared one for those options and the credentials'
current state (bounded, never fsspec's instance cache, which kept one per option set
and the credentials it first read), or with ``skip_instance_cache=True`` one of the
loader's own; :meth:`FsspecLoader.close` lets it go (:mod:`.filesystems`).
"""

from __future__ import annotations

import threading
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
from .filesystems import (
    close_filesystem,
    fresh_info,
    fs_class,
    is_s3fs,
    one_retry_layer,
    open_filesystem,
    s3_options,
)
from .pinned import http_redirect_problem, no_size_message, other_size_message
from .redirects import is_http_class, refused_redirect
from .types import StorageURL, redacted_url

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


def _is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP filesystem (``http://``, ``https://``), or made
    from it (known by its class, without importing aiohttp)."""
    return is_http_class(type(fs))


class FsspecLoader(LoaderBase):
    """Ranged reads through any fsspec filesystem (``memory://``, ``s3://``, ...).
    ``owns_fs``: the loader holds ``fs`` from :func:`.filesystems.open_filesystem`
    (:func:`~ptestore.storage.loaders.open_loader`'s), and :meth:`close` lets it go
    (:func:`.filesystems.close_filesystem`: a shared S3 one released, one of its own
    closed); a filesystem the caller hands over otherwise stays the caller's."""

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
        owns_fs: bool = False,
    ) -> None:
        self.fs = fs
        self._owns_fs = owns_fs
        #: What the filesystem is asked for: a remote URL's credentials included (its
        #: user information, a presigned query), never shown nor recorded.
        self.path = path
        #: The URL as shown (:func:`~.types.redacted_url`): in messages and records.
        self.name = redacted_url(url)
        #: The URL as given, credentials included: what the loader is compared and keyed
        #: by (:func:`~.types.loader_url`), never shown nor recorded.
        self.url = url
        #: The policy of every request for the object (its ``retry_*`` options).
        self.retry = retry
        #: ``(bucket, key)`` of an S3 object (read by GetObject, pinned), else None.
        self._s3: tuple[str, str] | None = None
        if is_s3fs(fs):
            if _VERSION_IN_KEY in path:
                raise ConfigurationError(
                    f"{self.name}: an S3 key containing {_VERSION_IN_KEY!r} cannot be read: s3fs "
                    "takes what follows it for a version id of the key before it, and "
                    "would read another object; rename the object"
                )
            bucket, _, key = path.lstrip("/").partition("/")
            if key.endswith("/"):  # as S3Writer refuses such a destination
                raise ConfigurationError(
                    f"{self.name}: an S3 key ending in '/' cannot be read: s3fs asks for the "
                    "key without its '/' (another object, or none) where a read asks "
                    "for the key itself; rename the object"
                )
            self._s3 = (bucket, key)
        info = self._info("no such object")
        if info.get("type") == "directory":
            raise StorageError(f"{self.name}: is a directory, not an object")
        self._size = self._size_of(info)
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

    def close(self) -> None:
        """Let the filesystem go when the loader holds it (``owns_fs``): a shared S3
        one released (closed by its last user once the bounded cache dropped it), one of
        its own closed now, never left to a garbage collection; a second call does
        nothing."""
        if self._owns_fs:
            self._owns_fs = False
            close_filesystem(self.fs)

    def _info(self, missing: str) -> dict[str, Any]:
        try:
            info: dict[str, Any] = self.retry.call(
                lambda: fresh_info(self.fs, self.path), what=f"{self.name}: stat"
            )
        except Exception as exc:
            refused = refused_redirect(exc)  # fsspec's info: as a missing object
            if refused is not None:
                raise StorageError(f"{self.name}: {refused}") from refused
            problem = http_redirect_problem(exc)  # a loop, a file:// Location
            if problem is not None:
                raise StorageError(f"{self.name}: {problem}") from exc
            if classify(exc) is Category.NOT_FOUND:  # a 404, not fsspec's any failure
                raise ObjectNotFound(f"{self.name}: {missing}") from exc
            raise to_storage_error(exc, self.name, "stat") from exc
        return info

    def _size_of(self, info: dict[str, Any]) -> int:
        """The object's size ``info`` names, else (a server that names none: a
        ``Content-Encoding``, no ``Content-Length``) a StorageError saying why, as a
        ``HEAD`` of its own shows it (:func:`.pinned.no_size_message`)."""
        size = info.get("size")
        if size is not None:
            return int(size)
        headers: dict[str, str] | None = None
        if _is_http(self.fs):
            import fsspec.asyn

            fs = self.fs

            async def head() -> dict[str, str]:
                session = await fs.set_session()
                kw = dict(fs.kwargs)
                sent = {**(kw.pop("headers", None) or {}), "Accept-Encoding": "identity"}
                kw.setdefault("allow_redirects", True)
                async with session.head(fs.encode_url(self.path), headers=sent, **kw) as r:
                    return dict(r.headers)

            try:
                headers = fsspec.asyn.sync(fs.loop, head)
            except Exception:  # the message says what fsspec's info found: no size
                headers = None
        raise StorageError(no_size_message(self.name, headers))

    def check_unchanged(self) -> None:
        """Raise :class:`~ptestore.errors.PreconditionFailed` if the object's size, entity
        tag or version id changed since it was opened."""
        info = self._info("object disappeared while reading")
        etag = self._etag_of(info, "HeadObject")
        version = info.get("VersionId") or None
        if (
            self._size_of(info) != self._size
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
            refused = refused_redirect(exc)  # fsspec's info: as a missing object
            if refused is not None:
                raise StorageError(f"{self.name}: {refused}") from refused
            problem = http_redirect_problem(exc)
            if problem is not None:
                raise StorageError(f"{self.name}: {problem}") from exc
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
            # Not its total against the size known: a read here is pinned to the
            # object's ETag or version, whose answer _read compares (an object replaced
            # by one of another size is PreconditionFailed, as one of the same size).
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
            headers["Accept-Encoding"] = "identity"  # a range of the object's own bytes
            async with session.get(fs.encode_url(self.path), headers=headers, **kw) as r:
                if r.status == 404:
                    raise FileNotFoundError(self.name)
                if r.status == 416:  # a range past the end: of what size?
                    answer = {"ContentRange": r.headers.get("Content-Range")}
                    if (mismatch := other_size_message(self.name, self._size, answer)) is not None:
                        raise StorageError(mismatch)
                r.raise_for_status()  # 429/5xx retried, 401/403 PermissionDenied
                encoding = r.headers.get("Content-Encoding", "").strip().lower()
                if encoding not in ("", "identity"):  # aiohttp would decode a piece
                    raise StorageError(
                        f"{self.name}: the server answered a ranged GET with "
                        f"Content-Encoding: {encoding[:40]}: ranged reads need an "
                        "identity-encoded object of known size"
                    )
                data = await read_at_most(r.content, size + 1)
                if len(data) > size:
                    r.close()  # the rest is never read, nor the connection used again
                length = r.headers.get("Content-Length")
                answer = {
                    "ContentRange": r.headers.get("Content-Range"),
                    "ContentLength": int(length) if length and length.isdigit() else None,
                    "ResponseMetadata": {"HTTPStatusCode": r.status},
                }
            mismatch = other_size_message(self.name, self._size, answer)
            if mismatch is not None:
                raise StorageError(mismatch)
            if r.status == 200:  # the whole object, whatever its length says
                answer["ContentLength"] = self._size
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
