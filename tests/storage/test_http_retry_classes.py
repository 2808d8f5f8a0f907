"""aiohttp's errors classified as botocore's are (ptestore/_retry/categories.py): a
``ClientResponseError`` by its status (429/5xx transient, 401/403 permission, 404 not
found), also under the ``FileNotFoundError`` fsspec's HTTP ``info`` raises from any
failure; that ``FileNotFoundError`` alone (no cause) still "not found". A
``Retry-After`` (seconds or a date; aiohttp's headers or botocore's) lengthens the wait
before the next attempt up to the policy's ``maximum``, never beyond it
(``RetryPolicy.wait_for``: nothing here sleeps)."""

from __future__ import annotations

import email.utils
import time

import aiohttp
import pytest
import yarl
from botocore.exceptions import ClientError
from multidict import CIMultiDict, CIMultiDictProxy

from ptestore._retry import Category, RetryPolicy, classify, to_storage_error
from ptestore._retry.categories import retry_after_seconds
from ptestore.errors import ObjectNotFound, PermissionDenied, StorageError

URL = yarl.URL("http://cdn.example/m.pte")


def _answer(status: int, message: str = "", **headers: str) -> aiohttp.ClientResponseError:
    info = aiohttp.RequestInfo(URL, "HEAD", CIMultiDictProxy(CIMultiDict()), URL)
    return aiohttp.ClientResponseError(
        info, (), status=status, message=message, headers=CIMultiDict(headers)
    )


def _fsspec_info_failure(cause: BaseException) -> FileNotFoundError:
    """What fsspec's HTTPFileSystem._info raises for any failure of its GET."""
    try:
        raise FileNotFoundError(str(URL)) from cause
    except FileNotFoundError as exc:
        return exc


@pytest.mark.parametrize(
    ("status", "category"),
    [
        (429, Category.TRANSIENT),
        (500, Category.TRANSIENT),
        (502, Category.TRANSIENT),
        (503, Category.TRANSIENT),
        (504, Category.TRANSIENT),
        (401, Category.PERMISSION),
        (403, Category.PERMISSION),
        (404, Category.NOT_FOUND),
        (400, Category.PERMANENT),
    ],
)
def test_an_http_answer_is_classified_by_its_status(status: int, category: Category) -> None:
    assert classify(_answer(status)) is category
    assert classify(_fsspec_info_failure(_answer(status))) is category


def test_fsspec_s_not_found_means_its_cause() -> None:
    """No cause: not found, as before; a refused connection under it: transient (was
    "no such object"); a redirect loop (status 0): permanent."""
    assert classify(FileNotFoundError(str(URL))) is Category.NOT_FOUND
    refused = aiohttp.ClientConnectionError("Connection refused")
    assert classify(_fsspec_info_failure(refused)) is Category.TRANSIENT
    info = aiohttp.RequestInfo(URL, "GET", CIMultiDictProxy(CIMultiDict()), URL)
    loop = aiohttp.TooManyRedirects(info, ())
    assert classify(_fsspec_info_failure(loop)) is Category.PERMANENT


def test_the_storage_error_of_an_http_answer_names_its_status() -> None:
    denied = to_storage_error(_answer(403, "Forbidden"), "http://cdn.example/m.pte", "stat")
    assert type(denied) is PermissionDenied
    assert str(denied) == "http://cdn.example/m.pte: stat failed: HTTP 403: Forbidden"
    gone = to_storage_error(_fsspec_info_failure(_answer(404)), "u", "stat")
    assert type(gone) is ObjectNotFound
    assert str(gone) == "u: stat failed: HTTP 404"
    busy = to_storage_error(_answer(503, "Service Unavailable"), "u", "stat")
    assert type(busy) is StorageError


def test_a_connection_failure_under_fsspec_s_wrapper_is_what_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused connection (or an unknown host) under fsspec's "not found" wrapper: the
    error and each retry's log line say the connection failed, not the wrapper's bare
    URL ("stat failed: http://...", "(FileNotFoundError: http://...)")."""
    refused = aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:1")
    wrapped = _fsspec_info_failure(refused)
    error = to_storage_error(wrapped, "http://h/m.pte", "stat")
    assert type(error) is StorageError
    assert str(error) == (
        "http://h/m.pte: stat failed: ClientConnectionError: Cannot connect to host 127.0.0.1:1"
    )
    calls = []

    def fail() -> None:
        calls.append(1)
        raise wrapped

    policy = RetryPolicy(attempts=2, initial=0, maximum=0)
    with caplog.at_level("WARNING"), pytest.raises(FileNotFoundError):
        policy.call(fail, what="http://h/m.pte: stat")
    assert len(calls) == 2
    assert "(ClientConnectionError: Cannot connect to host 127.0.0.1:1)" in caplog.text


def test_retry_after_is_honoured_up_to_the_maximum_wait() -> None:
    policy = RetryPolicy(attempts=3, initial=0.1, maximum=5.0)
    assert policy.wait_for(_answer(503), 0.2) == 0.2  # none: the backoff
    assert policy.wait_for(_answer(429, **{"Retry-After": "2"}), 0.2) == 2.0
    assert policy.wait_for(_answer(429, **{"Retry-After": "3600"}), 0.2) == 5.0
    assert policy.wait_for(_answer(429, **{"Retry-After": "1"}), 3.0) == 3.0  # never shorter
    later = email.utils.formatdate(time.time() + 86400, usegmt=True)
    assert policy.wait_for(_answer(503, **{"Retry-After": later}), 0.2) == 5.0
    earlier = email.utils.formatdate(time.time() - 86400, usegmt=True)
    assert policy.wait_for(_answer(503, **{"Retry-After": earlier}), 0.2) == 0.2
    assert policy.wait_for(_answer(503, **{"Retry-After": "soon"}), 0.2) == 0.2
    assert policy.wait_for(_fsspec_info_failure(_answer(429, **{"Retry-After": "4"})), 0) == 4.0
    assert RetryPolicy(maximum=0).wait_for(_answer(429, **{"Retry-After": "3600"}), 0) == 0
    throttled = ClientError(
        {
            "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
            "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": {"retry-after": "3"}},
        },
        "GetObject",
    )
    assert policy.wait_for(throttled, 0.2) == 3.0
    assert policy.wait_for(None, 0.2) == 0.2


def test_retry_after_values() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds(" 7 ") == 7.0
    assert retry_after_seconds("-1") is None
    assert retry_after_seconds("1.5") is None
    assert retry_after_seconds("\u00b2") is None  # a digit, not ASCII: float() refuses it
    assert retry_after_seconds("9" * 5000) == float("inf")  # then held to retry_max
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
