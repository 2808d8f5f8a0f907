"""One classification of storage failures, one retry policy, one mapping to ptestore errors.

Every loader and writer asks this module three questions about a failure:

- :func:`classify`: which :class:`Category` is it? Decided by the error *code* and
  HTTP *status* of a botocore ``ClientError`` (or anything carrying the same
  ``response`` dict), by the ``errno`` of an ``OSError`` and by the exception *type*
  (connection and timeout errors of the standard library, botocore, urllib3 and
  aiohttp). Never by the text of a message: ``OSError("short read: wanted 5000
  bytes")`` is not a server error because it contains "500".
- :class:`RetryPolicy`: retry the :attr:`Category.TRANSIENT` ones, with jittered
  exponential backoff (tenacity), logging each retry on ``ptestore.retry``.
- :func:`to_storage_error`: the :mod:`ptestore.errors` exception to raise (missing ->
  :class:`~ptestore.errors.ObjectNotFound`, 401/403/EACCES ->
  :class:`~ptestore.errors.PermissionDenied`, 412 ->
  :class:`~ptestore.errors.PreconditionFailed`, ...).
"""

from __future__ import annotations

import enum
import errno
import functools
import http.client
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from .errors import (
    AlreadyExists,
    ConfigurationError,
    ObjectNotFound,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
)

__all__ = [
    "DEFAULT_RETRY",
    "NOT_FOUND_CODES",
    "PERMISSION_CODES",
    "PRECONDITION_CODES",
    "RETRY_OPTIONS",
    "TRANSIENT_CODES",
    "TRANSIENT_ERRNOS",
    "TRANSIENT_STATUSES",
    "Category",
    "ErrorInfo",
    "RetryPolicy",
    "classify",
    "error_code",
    "error_info",
    "is_transient",
    "to_storage_error",
]

log = logging.getLogger("ptestore.retry")
T = TypeVar("T")

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
    """Code, HTTP status and service message of a botocore ``ClientError``."""

    code: str | None
    status: int | None
    message: str | None

    def describe(self) -> str:
        """``"SlowDown (HTTP 503): Please reduce..."``, the parts that are known."""
        text = self.code or "error"
        if self.status is not None:
            text += f" (HTTP {self.status})"
        if self.message:
            text += f": {self.message}"
        return text


def error_info(exc: BaseException) -> ErrorInfo | None:
    """The :class:`ErrorInfo` of an exception carrying a botocore ``response`` dict."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error")
    meta = response.get("ResponseMetadata")
    code = error.get("Code") if isinstance(error, dict) else None
    message = error.get("Message") if isinstance(error, dict) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
    return ErrorInfo(
        str(code) if code is not None else None,
        status if isinstance(status, int) and not isinstance(status, bool) else None,
        str(message) if message else None,
    )


@functools.cache
def _transient_types() -> tuple[type[BaseException], ...]:
    """Connection and timeout exception types of the transports storage goes through."""
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
    if isinstance(exc, ssl.SSLError) or _is_type(exc, _TLS_ERRORS):
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


def classify(exc: BaseException) -> Category:
    """The :class:`Category` of a failure.

    ptestore's own errors are final. Otherwise the service's answer decides when the
    cause chain holds one (s3fs raises ``OSError(EIO)`` or ``PermissionError`` *from*
    the botocore ``ClientError``), else the first exception of the chain whose type or
    errno says; :attr:`Category.PERMANENT` when nothing does.
    """
    ours = _classify_ours(exc)
    if ours is not None:
        return ours
    chain = _chain(exc)
    for e in chain:
        info = error_info(e)
        if info is not None:
            return _classify_answer(info)
    for e in chain:
        category = _classify_local(e)
        if category is not None:
            return category
    return Category.PERMANENT


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same request may succeed (:attr:`Category.TRANSIENT`)."""
    return classify(exc) is Category.TRANSIENT


def _info_in_chain(exc: BaseException) -> ErrorInfo | None:
    for e in _chain(exc):
        info = error_info(e)
        if info is not None:
            return info
    return None


def error_code(exc: BaseException) -> str | None:
    """The service's error code (``"NoSuchUpload"``...) found in ``exc``'s cause chain."""
    info = _info_in_chain(exc)
    return info.code if info is not None else None


def to_storage_error(exc: BaseException, where: str, action: str) -> StorageError:
    """The :mod:`ptestore.errors` exception for ``exc``, raised while ``action`` ran on
    ``where``: ``"<where>: <action> failed: <code> (HTTP <status>): <message>"``.

    A :class:`~ptestore.errors.StorageError` is returned unchanged.
    """
    if isinstance(exc, StorageError):
        return exc
    info = _info_in_chain(exc)
    if info is not None:
        detail = info.describe()
    elif isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    else:
        detail = str(exc) or type(exc).__name__
    text = f"{where}: {action} failed: {detail}"
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


#: Storage options that configure :class:`RetryPolicy` (accepted by every remote
#: loader and writer).
RETRY_OPTIONS = ("retry_attempts", "retry_initial", "retry_max")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry transient failures (:func:`is_transient`) with jittered exponential backoff.

    Retried: 5xx answers, 408/429, throttling codes (``SlowDown``, ``Throttling``...),
    connection resets and timeouts. Never retried: missing objects, permission
    problems, failed preconditions, other 4xx answers, anything of ptestore's own.
    """

    #: Attempts in total, the first one included.
    attempts: int = 6
    #: Seconds before the first retry (doubling each time, plus up to this much jitter).
    initial: float = 0.1
    #: Upper bound of one wait, in seconds.
    maximum: float = 5.0

    def __post_init__(self) -> None:
        _check_number("retry_attempts", self.attempts, int, 1)
        _check_number("retry_initial", self.initial, float, 0)
        _check_number("retry_max", self.maximum, float, 0)

    @classmethod
    def from_options(cls, url: str, options: dict[str, Any]) -> RetryPolicy:
        """Take ``retry_attempts``/``retry_initial``/``retry_max`` out of ``options``."""
        given = {name: options.pop(name) for name in RETRY_OPTIONS if name in options}
        try:
            return cls(
                attempts=given.get("retry_attempts", cls.attempts),
                initial=given.get("retry_initial", cls.initial),
                maximum=given.get("retry_max", cls.maximum),
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{url}: {exc}") from None

    def call(
        self,
        fn: Callable[[], T],
        *,
        what: str = "storage call",
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run ``fn``; retry transient failures; re-raise the last failure as it is.

        ``what`` names the call in the retry log; ``on_retry`` runs before each retry.
        """

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            info = _info_in_chain(exc) if exc is not None else None
            reason = info.describe() if info is not None else f"{type(exc).__name__}: {exc}"
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.2fs",
                what,
                state.attempt_number,
                self.attempts,
                reason,
                wait,
            )
            if on_retry is not None:
                on_retry()

        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.initial, max=self.maximum)
            + wait_random(0, self.initial),
            reraise=True,
            before_sleep=before_sleep,
        )
        return retrying(fn)


def _check_number(name: str, value: object, kind: type, minimum: float) -> None:
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or value < minimum:  # type: ignore[operator]
        what = "an int" if kind is int else "a number"
        raise ConfigurationError(f"{name} = {value!r}: must be {what} >= {minimum:g}")


#: The policy used when no retry option is given.
DEFAULT_RETRY = RetryPolicy()
