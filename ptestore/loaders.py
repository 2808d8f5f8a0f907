"""DataLoaders: ranged, read-only access to a .pte/.ptd wherever it is stored.

``open_loader(url, **storage_options)`` returns a :class:`DataLoader` for local paths,
``file://``, ``memory://``, ``s3://`` and any other fsspec protocol. Every read is a
ranged read: parsing the metadata of a multi-GB object reads only its first bytes.

Local files are read with ``os.pread`` (thread-safe, no shared file position). Remote
reads retry transient failures (connection resets, timeouts, 5xx/SlowDown) with
exponential backoff through tenacity; permanent failures (missing object, access
denied) are raised at once as :class:`~ptestore.errors.StorageError` subclasses.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import fsspec
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from ._io import pread_all
from .errors import ConfigurationError, ObjectNotFound, StorageError

__all__ = [
    "BytesLoader",
    "DataLoader",
    "FsspecLoader",
    "LocalFileLoader",
    "open_loader",
    "split_url",
]

T = TypeVar("T")


@runtime_checkable
class DataLoader(Protocol):
    """Read-only, random-access view of one stored object."""

    #: The path or URL the bytes come from; used in every error message.
    name: str

    def size(self) -> int:
        """Total size of the object in bytes."""
        ...

    def load(self, offset: int, size: int) -> bytes | bytearray | memoryview:
        """Return exactly ``size`` bytes starting at ``offset``.

        Raises :class:`~ptestore.errors.StorageError` if the range is outside the object.
        """
        ...

    def close(self) -> None:
        """Release any resources; idempotent."""
        ...


def _check_range(name: str, offset: int, size: int, total: int) -> None:
    if offset < 0 or size < 0 or offset + size > total:
        raise StorageError(
            f"{name}: read of {size} bytes at offset {offset} is outside the object (size {total})"
        )


class BytesLoader:
    """A loader over bytes already in memory (zero-copy slices)."""

    def __init__(self, data: bytes | bytearray | memoryview, name: str = "<bytes>") -> None:
        self._view = memoryview(data).cast("B")
        self.name = name

    def size(self) -> int:
        return self._view.nbytes

    def load(self, offset: int, size: int) -> memoryview:
        _check_range(self.name, offset, size, self._view.nbytes)
        return self._view[offset : offset + size]

    def close(self) -> None:
        pass

    def __enter__(self) -> BytesLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalFileLoader:
    """Positional reads (``os.pread``) from a local file.

    The file descriptor is opened once; ``load`` is safe from several threads.
    ``path`` and ``fileno()`` let local writers copy ranges in the kernel.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.path}: no such file") from exc
        except IsADirectoryError as exc:
            raise StorageError(f"{self.path}: is a directory, not a file") from exc
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot open for reading: {exc.strerror}") from exc
        st = os.fstat(self._fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(self._fd)
            self._fd = None
            raise StorageError(f"{self.path}: is a directory, not a file")
        self._size = st.st_size
        self._stamp = (st.st_size, st.st_mtime_ns)
        self._lock = threading.Lock()

    def fileno(self) -> int:
        if self._fd is None:
            raise StorageError(f"{self.name}: loader is closed")
        return self._fd

    def size(self) -> int:
        return self._size

    def check_unchanged(self) -> None:
        """Raise if the file was modified in place since it was opened (a file renamed
        over the path does not matter: reads go to the opened one)."""
        st = os.fstat(self.fileno())
        if (st.st_size, st.st_mtime_ns) != self._stamp:
            raise StorageError(
                f"{self.name}: modified while being read (size {self._stamp[0]} -> "
                f"{st.st_size}); its content may be a mix of two versions"
            )

    def load(self, offset: int, size: int) -> bytes:
        _check_range(self.name, offset, size, self._size)
        try:
            data = pread_all(self.fileno(), size, offset)
        except OSError as exc:
            raise StorageError(
                f"{self.name}: read of {size} bytes at offset {offset} failed: "
                f"{exc.strerror or exc}"
            ) from exc
        if len(data) != size:
            raise StorageError(
                f"{self.name}: file shrank while reading: wanted {size} bytes at offset "
                f"{offset}, got {len(data)}"
            )
        return data

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LocalFileLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


_TRANSIENT_NAMES = frozenset(
    {
        "ConnectionClosedError",
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientConnectionError",
        "IncompleteRead",
        "ProtocolError",
        "ResponseStreamingError",
    }
)
_TRANSIENT_WORDS = (
    "SlowDown",
    "Throttl",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "503",
    "500",
    "502",
    "504",
    "Connection reset",
)


#: S3/botocore error codes worth retrying (the service asks the client to try again).
TRANSIENT_S3_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "EC2ThrottledException",
        "PriorRequestNotComplete",
    }
)


def _client_error_info(exc: BaseException) -> tuple[str | None, int | None] | None:
    """``(code, http status)`` of a botocore ``ClientError``-like exception, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = error.get("Code") if isinstance(error, dict) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
    return (str(code) if code is not None else None, status if isinstance(status, int) else None)


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: timeouts, resets, 5xx and throttling.

    Never true for missing objects, permission problems, failed preconditions or any
    other 4xx answer (except 408 request timeout and 429 too many requests).
    """
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, StorageError)):
        return False
    info = _client_error_info(exc)
    if info is not None:
        code, status = info
        if code in TRANSIENT_S3_CODES:
            return True
        return status is not None and (status >= 500 or status in (408, 429))
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSIENT_NAMES:
            return True
    if isinstance(exc, OSError) and exc.errno in (errno.ETIMEDOUT, errno.ECONNRESET, errno.EPIPE):
        return True
    text = str(exc)
    if isinstance(exc, OSError) and any(w in text for w in _TRANSIENT_WORDS):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)


def call_with_retries(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    initial: float = 0.1,
    maximum: float = 5.0,
    before_sleep: Callable[[Any], None] | None = None,
) -> T:
    """Run ``fn`` and retry only transient failures, with jittered exponential backoff.

    ``before_sleep`` (a tenacity hook) is called before each retry.
    """
    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=initial, max=maximum) + wait_random(0, initial),
        reraise=True,
        before_sleep=before_sleep,
    )
    return retrying(fn)


class FsspecLoader:
    """Ranged reads through any fsspec filesystem (``memory://``, ``s3://``, ...)."""

    def __init__(
        self,
        fs: Any,
        path: str,
        url: str,
        *,
        retry_attempts: int = 5,
    ) -> None:
        self.fs = fs
        self.path = path
        self.name = url
        self._attempts = retry_attempts
        info = self._info("no such object")
        if info.get("type") == "directory":
            raise StorageError(f"{url}: is a directory, not an object")
        self._size = int(info["size"])
        #: Entity tag / version of the object when the storage reports one.
        self.etag: str | None = info.get("ETag") or info.get("etag")

    def size(self) -> int:
        return self._size

    def _info(self, missing: str) -> dict[str, Any]:
        try:
            info: dict[str, Any] = call_with_retries(
                lambda: self.fs.info(self.path), attempts=self._attempts
            )
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.name}: {missing}") from exc
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"{self.name}: cannot stat object: {exc}") from exc
        return info

    def check_unchanged(self) -> None:
        """Raise if the object's size or entity tag changed since it was opened."""
        info = self._info("object disappeared while reading")
        etag = info.get("ETag") or info.get("etag")
        if int(info["size"]) != self._size or (self.etag is not None and etag != self.etag):
            raise StorageError(
                f"{self.name}: replaced while being read (size {self._size} -> "
                f"{info['size']}, etag {self.etag} -> {etag}); its content may be a mix of "
                "two versions"
            )

    def load(self, offset: int, size: int) -> bytes:
        _check_range(self.name, offset, size, self._size)
        if size == 0:
            return b""

        def read() -> bytes:
            data = self.fs.cat_file(self.path, start=offset, end=offset + size)
            return bytes(data) if not isinstance(data, bytes) else data

        try:
            data = call_with_retries(read, attempts=self._attempts)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.name}: object disappeared while reading") from exc
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"{self.name}: read of {size} bytes at offset {offset} failed: {exc}"
            ) from exc
        if len(data) != size:
            raise StorageError(
                f"{self.name}: short read: wanted {size} bytes at offset {offset}, "
                f"got {len(data)} (object changed while reading?)"
            )
        return data

    def close(self) -> None:
        pass

    def __enter__(self) -> FsspecLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(protocol, path)``; plain paths and ``file://`` give ``("file", abspath)``."""
    text = os.fspath(url)
    if "://" not in text:
        return "file", os.path.abspath(text)
    protocol, _, rest = text.partition("://")
    protocol = protocol.lower()
    if protocol in ("file", "local"):
        return "file", os.path.abspath(rest if rest.startswith("/") else "/" + rest)
    if protocol in ("s3", "s3a"):
        return "s3", rest
    if protocol == "memory":
        return "memory", "/" + rest.lstrip("/")
    return protocol, text


def open_loader(url: str | os.PathLike[str], **storage_options: Any) -> DataLoader:
    """Open a read-only :class:`DataLoader` for ``url``.

    ``url`` is a local path, ``file://``, ``memory://``, ``s3://`` or any fsspec URL.
    ``storage_options`` are passed to the fsspec filesystem (for S3, s3fs options such
    as ``endpoint_url``, ``key``, ``secret``, ``client_kwargs``).
    """
    protocol, path = split_url(url)
    if protocol == "file":
        if storage_options:
            raise ConfigurationError(
                f"{url}: storage options {sorted(storage_options)} do not apply to local files"
            )
        return LocalFileLoader(path)
    try:
        fs_cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"{url}: cannot read protocol {protocol!r}: {exc}") from exc
    fs = fs_cls(**storage_options)
    if protocol == "s3" or protocol == "memory":
        fs_path = path
    else:
        fs_path = fs._strip_protocol(os.fspath(url))
    return FsspecLoader(fs, fs_path, os.fspath(url))
