"""Ranged reads of one version of an object, for :mod:`.fetch`: every request of a
download reads the version it started with, or fails with :class:`ObjectChanged`.

On S3 each request is a ``GetObject`` with ``Range`` and ``If-Match: <ETag>`` (and the
version id, on a versioned bucket): a replaced object answers 412, never a mix of two
versions. :meth:`PinnedReader.stream` reads ``[start, end)`` with **one** such request
and hands its body over in pieces as it arrives (a run of many chunks costs one request
and one piece of memory); a connection lost in the middle of a body, or a transient
answer (5xx, throttling), is retried from the first byte not yet received, under the
caller's retry policy (the ``retry_*`` storage options the download's loader was opened
with, :attr:`~ptestore.storage.remote.FsspecLoader.retry`; its attempts count failures
in a row, so a long download with an occasional fault goes on). A response that holds another range
than the one asked for (its ``Content-Range``; a whole object where a part was asked
for) is refused at once, as such: an :class:`~ptestore.errors.IntegrityError` naming
both ranges, never bytes hashed against the wrong chunks. Other stores (a local file, ``memory://``,
any fsspec filesystem) are read through their loader, one ``load`` per piece; the
loader's own ``check_unchanged`` is what pins them (see :mod:`.fetch`).

:attr:`PinnedReader.requests` and :attr:`PinnedReader.received` count what was asked of
the store (what ``fetch`` reports as moved).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._retry import DEFAULT_RETRY, Category, RetryPolicy, classify, to_storage_error
from ..errors import IntegrityError, StorageError
from ..storage.pinned import answered_range, get_params, other_range_message, read_at_most
from ..storage.types import DataLoader

__all__ = ["ObjectChanged", "PinnedReader", "pinned_attempts", "retry_of"]


class ObjectChanged(Exception):
    """The object's ETag is not the one the download is pinned to (412)."""


def _changed(exc: BaseException) -> bool:
    if classify(exc) is Category.PRECONDITION:
        return True
    text = str(exc)
    return "PreconditionFailed" in text or "(412)" in text


class PinnedReader:
    """Reads of the object behind ``loader``, pinned to ``etag`` on S3, each request
    retried under ``retry`` (:func:`retry_of`: the loader's)."""

    def __init__(
        self, loader: DataLoader, etag: str | None, retry: RetryPolicy = DEFAULT_RETRY
    ) -> None:
        self.loader = loader
        self.name = loader.name
        self.retry = retry
        #: Requests asked of the store, and the object bytes they returned.
        self.requests = 0
        self.received = 0
        fs: Any = getattr(loader, "fs", None)
        path = getattr(loader, "path", None)
        #: ``(filesystem, bucket, key, ETag, version id)`` of an S3 object.
        self._s3: tuple[Any, str, str, str, str | None] | None = None
        s3 = fs is not None and type(fs).__name__ == "S3FileSystem"
        if etag and s3 and isinstance(path, str):
            bucket, key, version = fs.split_path(path)
            self._s3 = (fs, bucket, key, etag, version or None)

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``, in one request."""
        if size <= 0:
            return b""
        out = bytearray()
        for piece in self.stream(offset, offset + size, size):
            out += piece
        return bytes(out)

    def stream(self, start: int, end: int, piece: int) -> Iterator[bytes]:
        """``[start, end)`` in pieces of ``piece`` bytes (the last may be shorter):
        one request on S3 (another only to retry a failure), one ``load`` per piece
        elsewhere. Raises :class:`ObjectChanged` when the version is gone."""
        if self._s3 is None:
            yield from self._loader_pieces(start, end, piece)
        else:
            yield from self._s3_pieces(start, end, piece)

    def _loader_pieces(self, start: int, end: int, piece: int) -> Iterator[bytes]:
        offset = start
        while offset < end:
            n = min(piece, end - offset)
            self.requests += 1
            data = bytes(self.loader.load(offset, n))
            if len(data) != n:
                raise StorageError(f"{self.name}: short read at offset {offset}")
            self.received += n
            offset += n
            yield data

    def _s3_pieces(self, start: int, end: int, piece: int) -> Iterator[bytes]:
        import fsspec.asyn

        assert self._s3 is not None
        fs, bucket, key, etag, version = self._s3
        offset = start
        body: Any = None
        failures = 0

        def run(fn: Callable[..., Any], *args: Any) -> Any:
            return fsspec.asyn.sync(fs.loop, fn, *args)

        async def open_body(first: int) -> Any:
            params = get_params(bucket, key, etag, version, first, end)
            resp = await fs._call_s3("get_object", **params)
            return resp["Body"], answered_range(resp, first, end)

        async def read_piece(b: Any, n: int) -> bytes:
            return await read_at_most(b, n)  # never past the range: the rest is not read

        async def close(b: Any) -> None:
            await b.aclose()

        try:
            while offset < end:
                n = min(piece, end - offset)
                try:
                    if body is None:
                        self.requests += 1
                        body, other = run(open_body, offset)
                        if other is not None:
                            raise _OtherRange(
                                other_range_message(self.name, offset, end, other),
                                published=False,
                            )
                    data = run(read_piece, body, n)
                    if len(data) != n:
                        raise StorageError(
                            f"{self.name}: short read: wanted {n} bytes at offset {offset}, "
                            f"got {len(data)}"
                        )
                except _OtherRange:
                    raise  # not the bytes asked for: refused, not asked again
                except Exception as exc:
                    if _changed(exc):
                        raise ObjectChanged(f"{self.name}: {exc}") from exc
                    failures += 1
                    transient = classify(exc) is Category.TRANSIENT or isinstance(exc, StorageError)
                    if body is not None:
                        _quietly(run, close, body)
                        body = None
                    if not transient or failures >= self.retry.attempts:
                        what = f"read of bytes {offset}:{end}"
                        raise to_storage_error(exc, self.name, what) from exc
                    _backoff(self.retry, failures, self.name, offset, exc)
                    continue
                self.received += n
                offset += n
                failures = 0  # the retries bound failures in a row, not in a whole download
                yield data
        finally:
            if body is not None:
                _quietly(run, close, body)


class _OtherRange(IntegrityError):
    """The server answered a ranged GET with another range than the one asked for."""


def _quietly(run: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> None:
    try:
        run(fn, *args)
    except Exception:  # closing a body that failed: nothing to add
        pass


def retry_of(loader: DataLoader) -> RetryPolicy:
    """The retry policy ``loader``'s storage options made (a remote loader's
    :attr:`~ptestore.storage.remote.FsspecLoader.retry`), else the default one."""
    retry = getattr(loader, "retry", None)
    return retry if isinstance(retry, RetryPolicy) else DEFAULT_RETRY


def _backoff(retry: RetryPolicy, failures: int, name: str, offset: int, exc: BaseException) -> None:
    import random
    import time

    from .._log import get_logger

    wait = min(retry.maximum, retry.initial * 2 ** (failures - 1))
    wait += random.uniform(0, retry.initial)
    get_logger("ptestore.retry").warning(
        "%s: read at offset %d failed (%s: %s); retrying from there in %.2fs",
        name,
        offset,
        type(exc).__name__,
        exc,
        wait,
    )
    time.sleep(wait)


T = TypeVar("T")


def pinned_attempts(
    url: str,
    options: dict[str, Any],
    dest: str,
    run: Callable[[DataLoader, PinnedReader, dict[str, Any]], T],
) -> T:
    """``run(loader, reader, state)`` for the object at ``url``: ``reader`` pinned to
    its version, its requests retried under the policy of the ``retry_*`` in ``options``
    (the loader's: :func:`retry_of`), ``state`` what pins ``DEST.part.json`` to it
    (``url``, ``size`` and :func:`.download.pinned_version`). When the object changes meanwhile
    (:class:`ObjectChanged`, or the loader sees another version afterwards), ``DEST.part``
    is discarded and it starts again, at most 3 times in all. An error names ``url`` as
    a report prints a string from a file (:func:`.index_bounds.names_shown`: an index
    names it)."""
    from .index_bounds import names_shown

    with names_shown([url]):
        return _pinned_attempts(url, options, dest, run)


def _pinned_attempts(
    url: str,
    options: dict[str, Any],
    dest: str,
    run: Callable[[DataLoader, PinnedReader, dict[str, Any]], T],
) -> T:
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader
    from .download import discard_part, pinned_version

    for _attempt in range(3):
        loader = open_loader(url, **options_for_loader(url, options))
        try:
            etag = getattr(loader, "etag", None)
            state = {"url": url, "size": loader.size(), **pinned_version(url, loader)}
            pinned = etag if isinstance(etag, str) else None
            reader = PinnedReader(loader, pinned, retry_of(loader))  # the caller's policy
            try:
                got = run(loader, reader, state)
            except ObjectChanged:
                discard_part(dest)  # the object changed: start again
                continue
            try:
                loader.check_unchanged()
            except StorageError:  # changed since it was read: start again
                discard_part(dest)
                continue
        finally:
            loader.close()
        return got
    raise StorageError(f"{url}: the object changed during every one of 3 downloads")
