"""The one classification of storage failures, the retry policy and the error mapping."""

from __future__ import annotations

import errno
import logging
import ssl

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
)

from ptestore._retry import (
    DEFAULT_RETRY,
    Category,
    RetryPolicy,
    classify,
    error_code,
    to_storage_error,
)
from ptestore.errors import (
    AlreadyExists,
    ConfigurationError,
    ObjectNotFound,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
)


def client_error(code: str, status: int, message: str = "") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message or f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "HeadObject",
    )


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        # the service's code first, then its status
        (client_error("SlowDown", 503), Category.TRANSIENT),
        (client_error("RequestTimeout", 400), Category.TRANSIENT),
        (client_error("Anything", 500), Category.TRANSIENT),
        (client_error("Anything", 507), Category.TRANSIENT),
        (client_error("Anything", 429), Category.TRANSIENT),
        (client_error("Anything", 408), Category.TRANSIENT),
        # every not-found code, in one list (HEAD answers a bare "404")
        (client_error("NoSuchKey", 404), Category.NOT_FOUND),
        (client_error("NoSuchBucket", 404), Category.NOT_FOUND),
        (client_error("NotFound", 404), Category.NOT_FOUND),
        (client_error("404", 404), Category.NOT_FOUND),
        (client_error("Anything", 404), Category.NOT_FOUND),
        # wrong credentials are not "server busy"
        (client_error("AccessDenied", 403), Category.PERMISSION),
        (client_error("InvalidAccessKeyId", 403), Category.PERMISSION),
        (client_error("SignatureDoesNotMatch", 403), Category.PERMISSION),
        (client_error("Anything", 401), Category.PERMISSION),
        (client_error("PreconditionFailed", 412), Category.PRECONDITION),
        (client_error("ConditionalRequestConflict", 409), Category.PRECONDITION),
        (client_error("InvalidArgument", 400), Category.PERMANENT),
        # exception types
        (ConnectionResetError(), Category.TRANSIENT),
        (BrokenPipeError(), Category.TRANSIENT),
        (TimeoutError(), Category.TRANSIENT),
        (ConnectionClosedError(endpoint_url="http://x"), Category.TRANSIENT),
        (EndpointConnectionError(endpoint_url="http://x"), Category.TRANSIENT),
        (ssl.SSLCertVerificationError("certificate verify failed"), Category.PERMANENT),
        (NoCredentialsError(), Category.PERMISSION),
        (FileNotFoundError(), Category.NOT_FOUND),
        (PermissionError(), Category.PERMISSION),
        (FileExistsError(), Category.ALREADY_EXISTS),
        # errno
        (OSError(errno.EAGAIN, "Resource temporarily unavailable"), Category.TRANSIENT),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), Category.TRANSIENT),
        (OSError(errno.EACCES, "Permission denied"), Category.PERMISSION),
        (OSError(errno.EPERM, "Operation not permitted"), Category.PERMISSION),
        (OSError(errno.ENOSPC, "No space left on device"), Category.PERMANENT),
        # never the text of a message
        (OSError("short read: wanted 5000 bytes"), Category.PERMANENT),
        (OSError("SlowDown 503 Connection reset"), Category.PERMANENT),
        (ValueError("500"), Category.PERMANENT),
        # ptestore's own errors are final
        (StorageError("ours"), Category.PERMANENT),
        (ObjectNotFound("ours"), Category.NOT_FOUND),
    ],
)
def test_classify(exc: BaseException, category: Category) -> None:
    assert classify(exc) is category


def test_the_service_answer_in_the_cause_chain_decides() -> None:
    wrapped = OSError(errno.EIO, "Please reduce your request rate.")  # what s3fs raises
    wrapped.__cause__ = client_error("SlowDown", 503)
    assert classify(wrapped) is Category.TRANSIENT
    assert error_code(wrapped) == "SlowDown"
    outer = RuntimeError("while reading")
    outer.__context__ = wrapped
    assert classify(outer) is Category.TRANSIENT


@pytest.mark.parametrize(
    ("exc", "cls", "text"),
    [
        (
            client_error("AccessDenied", 403, "Access Denied"),
            PermissionDenied,
            "s3://b/k: HeadObject failed: AccessDenied (HTTP 403): Access Denied",
        ),
        (
            client_error("InvalidAccessKeyId", 403),
            PermissionDenied,
            "s3://b/k: HeadObject failed: InvalidAccessKeyId (HTTP 403): injected "
            "InvalidAccessKeyId",
        ),
        (
            client_error("NoSuchBucket", 404),
            ObjectNotFound,
            "s3://b/k: HeadObject failed: NoSuchBucket (HTTP 404): injected NoSuchBucket",
        ),
        (
            client_error("PreconditionFailed", 412),
            PreconditionFailed,
            "s3://b/k: HeadObject failed: PreconditionFailed (HTTP 412): injected "
            "PreconditionFailed",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied"),
            PermissionDenied,
            "s3://b/k: HeadObject failed: Permission denied",
        ),
        (FileExistsError("there"), AlreadyExists, "s3://b/k: HeadObject failed: there"),
        (client_error("SlowDown", 503), StorageError, "HeadObject failed: SlowDown (HTTP 503)"),
    ],
)
def test_to_storage_error(exc: BaseException, cls: type[StorageError], text: str) -> None:
    mapped = to_storage_error(exc, "s3://b/k", "HeadObject")
    assert type(mapped) is cls
    assert text in str(mapped)
    assert isinstance(mapped, StorageError)


def test_permission_denied_is_a_permission_error() -> None:
    mapped = to_storage_error(client_error("AccessDenied", 403), "s3://b/k", "GetObject")
    assert isinstance(mapped, PermissionError)


def test_retries_only_transient_and_logs_each_retry(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[BaseException] = [client_error("SlowDown", 503), ConnectionResetError("rst")]
    calls = []

    def fn() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        assert (
            RetryPolicy(attempts=3, initial=0.001, maximum=0.001).call(fn, what="s3://b/k: X")
            == "ok"
        )
    assert len(calls) == 3
    messages = [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"]
    assert len(messages) == 2
    assert messages[0].startswith("s3://b/k: X: attempt 1 of 3 failed (SlowDown (HTTP 503): ")
    assert messages[1].startswith("s3://b/k: X: attempt 2 of 3 failed (ConnectionResetError: rst)")


def test_a_caller_says_in_words_why_an_attempt_is_made_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``reason``: the retry log says the caller's sentence, never the class of the
    exception it marks an attempt to make again with (a private one)."""

    class _Again(Exception):
        pass

    failures = [_Again("another run wrote it")]

    def fn() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    with caplog.at_level(logging.DEBUG, logger="ptestore.retry"):
        got = RetryPolicy(attempts=2, initial=0).call(
            fn,
            what="memory://x: merge",
            retry_on=lambda exc: isinstance(exc, _Again),
            level=logging.DEBUG,
            reason=lambda exc: f"{exc}: read again",
        )
    assert got == "ok"
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"] == [
        "memory://x: merge: attempt 1 of 2 failed (another run wrote it: read again); "
        "retrying in 0.00s"
    ]


def test_permanent_failures_are_raised_at_once() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise client_error("AccessDenied", 403)

    with pytest.raises(ClientError):
        RetryPolicy(attempts=5, initial=0.001).call(fn)
    assert len(calls) == 1


def test_one_set_of_defaults() -> None:
    assert (DEFAULT_RETRY.attempts, DEFAULT_RETRY.initial, DEFAULT_RETRY.maximum) == (6, 0.1, 5.0)
    options = {"retry_attempts": 2, "other": 1}
    policy = RetryPolicy.from_options("memory://x", options)
    assert policy == RetryPolicy(attempts=2)
    assert options == {"other": 1}  # taken out, the rest left


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_attempts": "x"}, r"memory://x: retry_attempts = 'x': must be an int >= 1"),
        ({"retry_attempts": 0}, r"memory://x: retry_attempts = 0: must be an int >= 1"),
        ({"retry_attempts": True}, r"retry_attempts = True: must be an int >= 1"),
        ({"retry_initial": "0.1"}, r"retry_initial = '0.1': must be a number >= 0"),
        ({"retry_max": -1.0}, r"retry_max = -1.0: must be a number >= 0"),
    ],
)
def test_bad_retry_options(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy.from_options("memory://x", options)
