"""Classification of storage failures and their mapping to :mod:`ptestore.errors`: by
the code and status of a botocore ``ClientError`` or the status of an aiohttp
``ClientResponseError`` anywhere in the cause chain, by type and ``errno``, never by a
message's text. fsspec's HTTP ``info`` raises ``FileNotFoundError`` *from* whatever
failed (a 503, a refused connection, a redirect loop): its cause decides."""

from __future__ import annotations

import enum
import errno
import functools
import sys

from .._dataclass import dataclass
from ..errors import (
    AlreadyExists,
    ObjectNotFound,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
)
from ..storage.types import redact_urls

__all__ = [
    "NOT_FOUND_CODES",
    "PERMISSION_CODES",
    "PRECONDITION_CODES",
    "REDIRECT_REFUSED",
    "TRANSIENT_CODES",
    "TRANSIENT_ERRNOS",
    "TRANSIENT_STATUSES",
    "Category",
    "ErrorInfo",
    "classify",
    "error_code",
    "error_info",
    "find_error_info",
    "shown",
    "is_conflict",
    "is_transient",
    "retry_after_seconds",
    "to_storage_error",
]

#: Error codes of S3 (and botocore) that ask the client to try again later.
TRANSIENT_CODES = frozenset(
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
#: HTTP statuses worth retrying: request timeout, too many requests, server errors.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: The object, its bucket or its version does not exist (HEAD answers a bare "404").
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "NotFound", "404"})
#: The storage refused the credentials or the access.
PERMISSION_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "Unauthorized",
        "401",
        "403",
    }
)
#: A condition of the request (If-None-Match, If-Match) did not hold.
PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412"})
#: errno values of transport failures worth retrying.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
    }
)
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


class Category(enum.Enum):
    """What a failure means for the caller."""

    #: Worth retrying: the same request may succeed later.
    TRANSIENT = "transient"
    #: The object (or its bucket/directory) does not exist.
    NOT_FOUND = "not found"
    #: Wrong credentials or no access.
    PERMISSION = "permission"
    #: A conditional request was refused (412, or 409 ConditionalRequestConflict).
    PRECONDITION = "precondition"
    #: Something exists where ``create`` wanted nothing.
    ALREADY_EXISTS = "already exists"
    #: Any other failure: not retried.
    PERMANENT = "permanent"


@dataclass(frozen=True)
class ErrorInfo:
    """Code, HTTP status and service message of a botocore ``ClientError`` or an aiohttp
    ``ClientResponseError`` (no code), and the seconds its ``Retry-After`` header asks
    to wait (None: none, or not a number of seconds nor a date)."""

    code: str | None
    status: int | None
    message: str | None
    retry_after: float | None = None

    def describe(self) -> str:
        """``"SlowDown (HTTP 503): Please reduce..."``, the parts that are known (an
        answer without a code: ``"HTTP 503: Service Unavailable"``)."""
        if self.code is None and self.status is not None:
            text = f"HTTP {self.status}"
        else:
            text = self.code or "error"
            if self.status is not None:
                text += f" (HTTP {self.status})"
        if self.message:
            text += f": {self.message}"
        return text


#: aiohttp's error of an answer (its status, message, headers), known by name: not imported.
_AIOHTTP_RESPONSE = frozenset({"aiohttp.client_exceptions.ClientResponseError"})


def error_info(exc: BaseException) -> ErrorInfo | None:
    """The :class:`ErrorInfo` of an exception carrying a botocore ``response`` dict, or
    of an aiohttp ``ClientResponseError`` (a status of 0, as its ``TooManyRedirects``
    has: None)."""
    if _is_type(exc, _AIOHTTP_RESPONSE):
        status = getattr(exc, "status", None)
        message = getattr(exc, "message", None)
        return ErrorInfo(
            None,
            status if isinstance(status, int) and status > 0 else None,
            str(message) if message else None,
            retry_after_seconds(_header(getattr(exc, "headers", None), "Retry-After")),
        )
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error")
    meta = response.get("ResponseMetadata")
    code = error.get("Code") if isinstance(error, dict) else None
    message = error.get("Message") if isinstance(error, dict) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
    headers = meta.get("HTTPHeaders") if isinstance(meta, dict) else None
    return ErrorInfo(
        str(code) if code is not None else None,
        status if isinstance(status, int) and not isinstance(status, bool) else None,
        str(message) if message else None,
        retry_after_seconds(_header(headers, "retry-after")),
    )


def _header(headers: object, name: str) -> str | None:
    """Header ``name`` of ``headers`` (a mapping: aiohttp's is case-insensitive,
    botocore's has lower-case names), or None."""
    get = getattr(headers, "get", None)
    value = get(name) if callable(get) else None
    return value if isinstance(value, str) else None


def retry_after_seconds(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header value asks to wait: a number of seconds, or
    an HTTP date (from now; 0 when past); None when absent or neither."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        import datetime

        when = when.replace(tzinfo=datetime.timezone.utc)
    import time

    return max(0.0, when.timestamp() - time.time())


@functools.cache
def _transient_types() -> tuple[type[BaseException], ...]:
    """Connection and timeout exception types of the transports storage goes through
    (imported when a failure is first classified: http.client costs start-up time)."""
    import http.client

    types: list[type[BaseException]] = [
        ConnectionError,  # resets, aborts, refusals, broken pipes
        TimeoutError,  # socket.timeout, asyncio.TimeoutError
        http.client.IncompleteRead,
        http.client.RemoteDisconnected,
    ]
    try:
        from botocore import exceptions as be

        # HTTPClientError covers ConnectionClosedError, ReadTimeoutError and
        # ResponseStreamingError; ConnectionError covers EndpointConnectionError and
        # ConnectTimeoutError.
        types += [be.HTTPClientError, be.ConnectionError]
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    try:
        from urllib3 import exceptions as ue

        types += [ue.ProtocolError, ue.TimeoutError]
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    return tuple(types)


#: TLS failures of botocore and aiohttp (subclasses of their connection errors).
_TLS_ERRORS = frozenset(
    {"botocore.exceptions.SSLError", "aiohttp.client_exceptions.ClientSSLError"}
)


#: botocore's "no usable credentials" errors (raised before any request is sent).
_CREDENTIAL_ERRORS = frozenset(
    {"botocore.exceptions.NoCredentialsError", "botocore.exceptions.PartialCredentialsError"}
)


def _is_type(exc: BaseException, qualified_names: frozenset[str]) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" in qualified_names for c in type(exc).__mro__)


#: The attribute marking ptestore's refusal of a redirect (``storage/redirects.py``).
REDIRECT_REFUSED = "ptestore_redirect_target"
#: ptestore's own errors are final: their class is their category.
_OURS: tuple[tuple[type[BaseException], Category], ...] = (
    (ObjectNotFound, Category.NOT_FOUND),
    (PermissionDenied, Category.PERMISSION),
    (PreconditionFailed, Category.PRECONDITION),
    (AlreadyExists, Category.ALREADY_EXISTS),
    (StorageError, Category.PERMANENT),  # already final (after any retries)
)
#: The service's verdict: its error code first ...
_BY_CODE: tuple[tuple[frozenset[str], Category], ...] = (
    (TRANSIENT_CODES, Category.TRANSIENT),
    (NOT_FOUND_CODES, Category.NOT_FOUND),
    (PERMISSION_CODES, Category.PERMISSION),
    (PRECONDITION_CODES, Category.PRECONDITION),
)
#: ... then the HTTP status (any other 5xx is transient too).
_BY_STATUS: tuple[tuple[frozenset[int], Category], ...] = (
    (TRANSIENT_STATUSES, Category.TRANSIENT),
    (frozenset({404}), Category.NOT_FOUND),
    (frozenset({401, 403}), Category.PERMISSION),
    (frozenset({412}), Category.PRECONDITION),
)
#: Builtin exception types that name their category.
_BY_TYPE: tuple[tuple[type[BaseException], Category], ...] = (
    (FileNotFoundError, Category.NOT_FOUND),
    (PermissionError, Category.PERMISSION),
    (FileExistsError, Category.ALREADY_EXISTS),
)


def _classify_ours(exc: BaseException) -> Category | None:
    return next((cat for cls, cat in _OURS if isinstance(exc, cls)), None)


def _classify_answer(info: ErrorInfo) -> Category:
    """The service's verdict: its error code first, then the HTTP status."""
    for codes, category in _BY_CODE:
        if info.code in codes:
            return category
    status = info.status
    if status is None:
        return Category.PERMANENT
    for statuses, category in _BY_STATUS:
        if status in statuses:
            return category
    return Category.TRANSIENT if status >= 500 else Category.PERMANENT


def _classify_local(exc: BaseException) -> Category | None:
    """The category an exception's type or errno shows, or None when they do not say."""
    by_type = next((cat for cls, cat in _BY_TYPE if isinstance(exc, cls)), None)
    if by_type is not None:
        return by_type
    if _is_type(exc, _CREDENTIAL_ERRORS):
        return Category.PERMISSION
    ssl = sys.modules.get("ssl")  # no SSLError exists unless ssl was imported
    if (ssl is not None and isinstance(exc, ssl.SSLError)) or _is_type(exc, _TLS_ERRORS):
        return Category.PERMANENT  # a bad certificate stays bad
    if isinstance(exc, _transient_types()):
        return Category.TRANSIENT
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in TRANSIENT_ERRNOS:
            return Category.TRANSIENT
        if exc.errno in _PERMISSION_ERRNOS:
            return Category.PERMISSION
        if exc.errno == errno.ENOENT:
            return Category.NOT_FOUND
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), without cycles."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in out):
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _wraps_http_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``FileNotFoundError`` raised from an aiohttp error (fsspec's
    HTTP ``info``, whatever failed): it does not mean the object is missing."""
    cause = exc.__cause__
    return (
        isinstance(exc, FileNotFoundError)
        and cause is not None
        and any(c.__module__.startswith("aiohttp.") for c in type(cause).__mro__)
    )


def shown(exc: BaseException) -> BaseException:
    """``exc``, or the aiohttp failure under fsspec's wrapper (its text the bare URL)."""
    cause = exc.__cause__
    return cause if cause is not None and _wraps_http_failure(exc) else exc


def classify(exc: BaseException) -> Category:
    """The :class:`Category` of a failure.

    ptestore's own errors are final. Otherwise the service's answer decides when the
    cause chain holds one (s3fs raises ``OSError(EIO)`` or ``PermissionError`` *from*
    the botocore ``ClientError``; fsspec's HTTP ``info`` ``FileNotFoundError`` *from*
    aiohttp's ``ClientResponseError``), else the first exception of the chain whose type
    or errno says (a ``FileNotFoundError`` raised from an aiohttp error says nothing);
    :attr:`Category.PERMANENT` when nothing does.
    """
    ours = _classify_ours(exc)
    if ours is not None:
        return ours
    chain = _chain(exc)
    if any(hasattr(e, REDIRECT_REFUSED) for e in chain):  # under aiohttp's ClientOSError
        return Category.PERMANENT
    for e in chain:
        info = error_info(e)
        if info is not None:
            return _classify_answer(info)
    for e in chain:
        if _wraps_http_failure(e):
            continue  # fsspec's "not found" for any failure: its cause decides
        category = _classify_local(e)
        if category is not None:
            return category
    return Category.PERMANENT


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same request may succeed (:attr:`Category.TRANSIENT`)."""
    return classify(exc) is Category.TRANSIENT


def is_conflict(exc: BaseException) -> bool:
    """True for a lost compare-and-swap: a condition that no longer held
    (:attr:`Category.PRECONDITION`, e.g. ``publish(mode="if-match")``'s
    :class:`~ptestore.errors.PreconditionFailed`) or an object created meanwhile
    (:attr:`Category.ALREADY_EXISTS`, ``mode="create"``). Retry by reading again."""
    return classify(exc) in (Category.PRECONDITION, Category.ALREADY_EXISTS)


def find_error_info(exc: BaseException) -> ErrorInfo | None:
    """The :class:`ErrorInfo` of the first exception of ``exc``'s cause chain with one."""
    for e in _chain(exc):
        info = error_info(e)
        if info is not None:
            return info
    return None


def error_code(exc: BaseException) -> str | None:
    """The service's error code (``"NoSuchUpload"``...) found in ``exc``'s cause chain."""
    info = find_error_info(exc)
    return info.code if info is not None else None


def to_storage_error(exc: BaseException, where: str, action: str) -> StorageError:
    """The :mod:`ptestore.errors` exception for ``exc``, raised while ``action`` ran on
    ``where``: ``"<where>: <action> failed: <code> (HTTP <status>): <message>"``.

    A :class:`~ptestore.errors.StorageError` is returned unchanged. The URLs in the
    message (``where``, and a client library's own text, which may name the URL with
    its credentials) are shown as :func:`~ptestore.storage.types.redacted_url` shows
    them.
    """
    if isinstance(exc, StorageError):
        return exc
    said = shown(exc)
    info = find_error_info(said)
    if info is not None:
        detail = info.describe()
    elif isinstance(said, OSError) and said.strerror:
        detail = said.strerror
    else:  # aiohttp's own words for a wrapped one: "Cannot connect to host ..."
        detail = (
            f"{type(said).__name__}: {said}" if said is not exc else str(exc) or type(exc).__name__
        )
    text = redact_urls(f"{where}: {action} failed: {detail}")
    category = classify(exc)
    if category is Category.NOT_FOUND:
        return ObjectNotFound(text)
    if category is Category.PERMISSION:
        return PermissionDenied(text)
    if category is Category.PRECONDITION:
        return PreconditionFailed(text)
    if category is Category.ALREADY_EXISTS:
        return AlreadyExists(text)
    return StorageError(text)
