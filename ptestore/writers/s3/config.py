"""S3 connection: the s3fs filesystem, its botocore client, the retry policy, limits.

The client comes from s3fs itself (``S3FileSystem(**storage_options)``), so options,
credentials, endpoints, profiles, config files, fsspec's ``s3`` configuration and
``AWS_*``/``FSSPEC_S3_*`` environment variables resolve exactly as for every fsspec user
and for ptestore's own S3 loader. ptestore adds two defaults: botocore's retries off
(``RetryPolicy`` is the one retry layer) unless ``config_kwargs`` sets ``retries``, and
a connection pool large enough for ``max_concurrency`` uploads. Each connection has a
filesystem and client of its own (``skip_instance_cache=True`` unless the options say
otherwise): hooks on one writer's client stay on that writer, and the environment is
read when the writer is opened. With ``skip_instance_cache=False`` (the fleet index's
many small objects) the filesystem is shared within bounds, per option set and state of
the credentials, never from fsspec's unbounded instance cache
(:func:`~ptestore.storage.filesystems.s3_filesystem`).

What is shared is the expensive part underneath: the aiobotocore session a client is
made from (botocore's parsed service models and endpoint rules, resolved default
credentials), one per process and per everything that decides what the session
resolves (:func:`~ptestore.storage.filesystems.session_key`: the process id, s3fs's
session arguments such as ``profile``, every ``AWS_*`` environment variable, the size
and modification time of the AWS config and credentials files), the same cache the S3
loader's sessions come from (:mod:`ptestore.storage.filesystems`). A client from a fresh
session costs about 75 ms of CPU, one from a shared session a few ms. botocore gives
every client a copy of its session's event emitter, so hooks registered on one client's
``meta.events`` never reach another; options that reach the client (``key``,
``secret``, ``endpoint_url``, ``client_kwargs``, ``config_kwargs``, ``anon``) are the
writer's own. A ``session`` given in the options is used as it is.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any, TypeVar

from ..._retry import RETRY_OPTIONS, RetryPolicy
from ...errors import ConfigurationError
from ...storage._options import fsspec_options
from ...storage.filesystems import (
    SESSION_CACHE_SIZE,
    close_filesystem,
    s3_filesystem,
    session_key,
    shared_session,
)
from .marker import MAX_DATA_PARTS

__all__ = [
    "DEFAULT_PART_SIZE",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "SESSION_CACHE_SIZE",
    "S3Connection",
    "check_part_size",
    "connection_options",
    "largest_object",
    "session_key",
    "shared_session",
]

T = TypeVar("T")

#: S3's smallest part (every part but the last), 5 MiB.
MIN_PART_SIZE = 5 << 20
#: S3's largest part, 5 GiB.
MAX_PART_SIZE = 5 << 30
DEFAULT_PART_SIZE = 8 << 20
_SSE_C_KEYS = ("SSECustomerAlgorithm", "SSECustomerKey", "SSECustomerKeyMD5")


def check_part_size(url: str, part_size: object, minimum: int = MIN_PART_SIZE) -> int:
    """``part_size`` if S3 accepts it (``minimum`` <= part_size <= 5 GiB), else
    :class:`~ptestore.errors.ConfigurationError` naming the value and the limit."""
    if isinstance(part_size, bool) or not isinstance(part_size, int):
        raise ConfigurationError(f"{url}: option part_size = {part_size!r}: must be an int (bytes)")
    if not minimum <= part_size <= MAX_PART_SIZE:
        raise ConfigurationError(
            f"{url}: option part_size = {part_size}: must be between {minimum} (5 MiB, S3's "
            f"smallest part) and {MAX_PART_SIZE} (5 GiB, S3's largest part)"
        )
    return part_size


def largest_object(part_size: int) -> int:
    """The largest object a writer with ``part_size`` can publish (9,999 data parts)."""
    return part_size * MAX_DATA_PARTS


def connection_options() -> frozenset[str]:
    """Every storage option of s3fs's ``S3FileSystem`` plus the retry options."""
    try:
        from s3fs import S3FileSystem
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(f"S3 needs s3fs: install ptestore[s3] ({exc})") from exc
    return fsspec_options(S3FileSystem) | set(RETRY_OPTIONS)


class S3Connection:
    """One s3fs filesystem and its client; every S3 call goes through :meth:`call`.

    ``client`` is s3fs's (aiobotocore) client; :meth:`call` runs a request on s3fs's
    event loop and waits for it, retrying transient failures with ``retry``.
    """

    def __init__(self, url: str, options: dict[str, Any], *, pool_size: int = 10) -> None:
        try:
            import fsspec.asyn
            from s3fs import S3FileSystem
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigurationError(f"{url}: S3 needs s3fs: install ptestore[s3] ({exc})") from exc
        options = dict(options)
        # A filesystem (hence a botocore client) of the writer's own: a shared one would
        # hand every writer with equal options the same client, so event hooks
        # registered on one writer's ``client.meta.events`` would fire for every other
        # writer in the process.
        options.setdefault("skip_instance_cache", True)
        #: Whether the filesystem is this connection's own: a shared one
        #: (``skip_instance_cache=False``, bounded: not fsspec's instance cache) is
        #: released by :meth:`close`, left open for its other users.
        self.owned = bool(options["skip_instance_cache"])
        #: Whether :meth:`close` ran (closing once is enough).
        self.closed = False
        self.url = url
        self.retry = RetryPolicy.from_options(url, options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("max_pool_connections", pool_size)
        fs: Any = None
        try:
            # its session the process's shared one (unless the options give one)
            options["config_kwargs"] = config
            fs = s3_filesystem(S3FileSystem, options, shared=not self.owned)
            self.client: Any = fs.s3  # connects: credentials and endpoint resolved
        except Exception as exc:
            if fs is not None:
                close_filesystem(fs)
            raise ConfigurationError(f"{url}: cannot create an S3 client: {exc}") from exc
        self.fs = fs
        self._sync = fsspec.asyn.sync
        additional = dict(self.fs.s3_additional_kwargs)
        #: Parameters every request on the object needs (requester pays, SSE-C keys).
        self.extras: dict[str, Any] = {k: additional[k] for k in _SSE_C_KEYS if k in additional}
        if self.fs.requester_pays:
            self.extras["RequestPayer"] = "requester"
        #: Parameters of the requests that create the object (``s3_additional_kwargs``).
        self.create_extras: dict[str, Any] = {**additional, **self.extras}
        #: Parameters of requests that take no SSE-C keys (``AbortMultipartUpload``, a
        #: read of another object): requester pays only.
        self.plain_extras: dict[str, Any] = {
            k: v for k, v in self.extras.items() if k == "RequestPayer"
        }

    def close(self) -> None:
        """Close the client's connections now, on s3fs's event loop. Left to garbage
        collection, s3fs closes them from whichever thread collects the filesystem (an
        fsspec filesystem is always in a reference cycle), and in a thread that runs an
        event loop of its own (a Dask worker's) that fails with "attached to a different
        loop"; a second call does nothing. A shared filesystem (:attr:`owned` False) is
        released: left open for its other users, closed with the last one once dropped
        from the bounded cache (:func:`~ptestore.storage.filesystems.close_filesystem`)."""
        if self.closed:
            return
        self.closed = True
        close_filesystem(self.fs)  # a failure logged: the connections go with the process

    def invoke(self, operation: str, **params: Any) -> dict[str, Any]:
        """One attempt of ``client.<operation>(**params)``, synchronously."""
        method = getattr(self.client, operation)
        result: dict[str, Any] = self._sync(self.fs.loop, method, **params)
        return result

    def submit(self, operation: str, **params: Any) -> cf.Future[dict[str, Any]]:
        """One attempt of ``client.<operation>(**params)`` started on s3fs's loop: its
        future (what :meth:`invoke` waits for). A caller interrupted while it waits can
        still learn what the request did."""
        import asyncio

        method = getattr(self.client, operation)

        async def run() -> dict[str, Any]:
            result: dict[str, Any] = await method(**params)
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.fs.loop)

    def invoke_read(
        self, operation: str, max_bytes: int | None = None, **params: Any
    ) -> tuple[dict[str, Any], bytes]:
        """One attempt of ``client.<operation>(**params)`` whose answer has a streaming
        ``Body`` (``get_object``): the answer and its body, read on s3fs's loop no
        further than one byte past what it announces (its ``ContentLength``) and past
        ``max_bytes``: a body longer than either shows, an endless one is never held
        (:func:`~ptestore.storage.pinned.read_at_most`). With ``max_bytes``, a body
        whose ``ContentLength`` is larger is not read; an answer without a
        ``ContentLength`` when no ``max_bytes`` is given is a
        :class:`~ptestore.errors.StorageError` (nothing bounds its body)."""
        from ...errors import StorageError
        from ...storage.pinned import read_at_most

        method = getattr(self.client, operation)

        async def run() -> tuple[dict[str, Any], bytes]:
            resp: dict[str, Any] = await method(**params)
            body = resp.pop("Body")
            async with body:
                announced = resp.get("ContentLength")
                length = int(announced) if announced is not None else max_bytes
                if length is None:
                    name = "".join(w.capitalize() for w in operation.split("_"))
                    raise StorageError(
                        f"{self.url}: the {name} answer has no Content-Length header and "
                        "no bound was asked for: its body is not read"
                    )
                if max_bytes is not None and length > max_bytes:
                    data = b""
                else:  # asked for as its length says, never as a bound (one past it:
                    # a body longer than announced shows)
                    data = await read_at_most(body, length + 1)
            return resp, data

        result: tuple[dict[str, Any], bytes] = self._sync(self.fs.loop, run)
        return result

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run ``fn`` (which calls :meth:`invoke`) under the retry policy."""
        return self.retry.call(fn, what=f"{self.url}: {what}", on_retry=on_retry)

    def request(self, what: str, operation: str, **params: Any) -> dict[str, Any]:
        """``client.<operation>(**params)`` with retries; ``what`` names it in logs."""
        return self.call(what, lambda: self.invoke(operation, **params))
