"""An ``http(s)://`` object behind a hostile or broken server (a server on 127.0.0.1 of this
module): a 429/5xx answer is retried (a ``Retry-After`` honoured up to ``retry_max``, never
longer), a 401/403 a PermissionDenied, at the HEAD of the open (fsspec's ``info`` raises
``FileNotFoundError`` for any failure) as at a ranged GET; only a 404 is "no such object";
a redirect loop or a redirect to ``file://`` a StorageError naming it; a server that names
no size (``Content-Encoding: gzip``, no ``Content-Length``) a StorageError saying why, not
a TypeError; a GET naming another size than the HEAD's a StorageError naming both. No
test waits: ``retry_initial=0``, ``retry_max=0``."""

from __future__ import annotations

import gzip
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from support.faulty_proxy import local_http_server

from ptestore.errors import (
    IntegrityError,
    ObjectNotFound,
    PermissionDenied,
    StorageError,
)
from ptestore.storage.atomic import get_bytes
from ptestore.storage.loaders import open_loader

DATA = bytes(range(256)) * 80  # 20480 bytes
#: No wait between attempts: a Retry-After of an hour is held to retry_max = 0.
INSTANT = {"retry_initial": 0, "retry_max": 0}
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


@dataclass
class Hostile:
    """What the server does; every request is logged as ``(method, path)``."""

    objects: dict[str, bytes] = field(default_factory=dict)
    #: Answers given first, one per request (HEAD or GET): ``(status, headers)``.
    fail: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    #: The HEAD's Content-Length is the object's size plus this.
    head_delta: int = 0
    #: Content-Encoding: gzip on every answer, no Content-Length on a HEAD.
    gzip: bool = False
    #: A HEAD with no Content-Length, a GET's body chunked (no size anywhere).
    chunked: bool = False
    #: Ranged GETs answered with Content-Encoding: gzip (the HEAD identity, sized).
    gzip_get: bool = False
    #: Paths answered 302 to this Location (itself: a loop).
    redirects: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)


def _handler(state: Hostile) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _empty(self, status: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _answer(self, with_body: bool) -> None:
            state.requests.append((self.command, self.path))
            if state.fail:
                self._empty(*state.fail.pop(0))
                return
            if self.path in state.redirects:
                self._empty(302, {"Location": state.redirects[self.path]})
                return
            data = state.objects.get(self.path)
            if data is None:
                self._empty(404, {})
                return
            if state.gzip or (state.gzip_get and with_body):
                body = gzip.compress(data)
                self.send_response(200)
                self.send_header("Content-Encoding", "gzip")
                if with_body:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)
                return
            if state.chunked:
                self.send_response(200)
                if with_body:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if with_body:
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
                return
            m = _RANGE.fullmatch(self.headers.get("Range", ""))
            if not with_body or m is None:
                self.send_response(200)
                size = len(data) + (state.head_delta if not with_body else 0)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if with_body:
                    self.wfile.write(data)
                return
            first, last = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            if first >= len(data):
                self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            self.send_header("Content-Length", str(last + 1 - first))
            self.end_headers()
            self.wfile.write(data[first : last + 1])

        def do_HEAD(self) -> None:
            self._answer(False)

        def do_GET(self) -> None:
            self._answer(True)

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Hostile]]:
    """The server, holding DATA at ``/m.pte``; yields ``(URL of /m.pte, state)``."""
    state = Hostile(objects={"/m.pte": DATA})
    with local_http_server(_handler(state)) as base:
        yield base + "/m.pte", state


def _open(url: str, **options: Any) -> Any:
    return open_loader(url, **{**INSTANT, **options})


def test_throttling_and_server_errors_are_retried_at_the_open_and_the_reads(
    server: tuple[str, Hostile], caplog: pytest.LogCaptureFixture
) -> None:
    """HEAD 503 then GET 429 (fsspec's info tries both) and again: retried, not "no
    such object"; a ranged GET answered 500 then 502: retried. A Retry-After of an hour
    is held to retry_max (here 0): the test does not wait."""
    url, state = server
    state.fail = [(503, {}), (429, {"Retry-After": "3600"}), (502, {}), (504, {})]
    caplog.set_level(logging.WARNING, "ptestore.retry")
    loader = _open(url)
    try:
        assert loader.size() == len(DATA)
        state.fail = [(500, {}), (502, {"Retry-After": "120"})]
        assert bytes(loader.load(100, 50)) == DATA[100:150]
    finally:
        loader.close()
    assert not state.fail
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) == 4
    assert "(HTTP 429: Too Many Requests); retrying in 0.00s" in retries[0]
    assert "(HTTP 502: Bad Gateway); retrying in 0.00s" in retries[3]


def test_a_server_error_that_lasts_is_a_storage_error_not_a_missing_object(
    server: tuple[str, Hostile],
) -> None:
    url, state = server
    state.fail = [(503, {})] * 6
    with pytest.raises(StorageError) as caught:
        _open(url, retry_attempts=3)
    assert not isinstance(caught.value, ObjectNotFound)
    assert str(caught.value) == f"{url}: stat failed: HTTP 503: Service Unavailable"
    assert len(state.requests) == 6  # HEAD and GET, three times
    loader = _open(url, retry_attempts=3)
    state.fail = [(504, {})] * 3
    try:
        with pytest.raises(StorageError) as caught:
            loader.load(0, 10)
    finally:
        loader.close()
    assert str(caught.value) == (
        f"{url}: read of 10 bytes at offset 0 failed: HTTP 504: Gateway Timeout"
    )


@pytest.mark.parametrize(("status", "reason"), [(401, "Unauthorized"), (403, "Forbidden")])
def test_a_refusal_is_permission_denied_not_retried(
    server: tuple[str, Hostile], status: int, reason: str
) -> None:
    url, state = server
    state.fail = [(status, {})] * 2
    with pytest.raises(PermissionDenied) as caught:
        _open(url)
    assert str(caught.value) == f"{url}: stat failed: HTTP {status}: {reason}"
    assert len(state.requests) == 2  # fsspec's HEAD and GET, once
    loader = _open(url)
    try:
        state.fail = [(status, {})]
        with pytest.raises(PermissionDenied, match=rf"offset 0 failed: HTTP {status}: {reason}$"):
            loader.load(0, 10)
    finally:
        loader.close()


def test_only_a_404_is_no_such_object(server: tuple[str, Hostile]) -> None:
    url, _ = server
    with pytest.raises(ObjectNotFound, match=r"/missing\.pte: no such object$"):
        _open(url.replace("/m.pte", "/missing.pte"))


def test_a_redirect_loop_is_named(server: tuple[str, Hostile]) -> None:
    url, state = server
    state.redirects["/m.pte"] = "/m.pte"
    with pytest.raises(StorageError) as caught:
        _open(url)
    assert not isinstance(caught.value, ObjectNotFound)
    assert str(caught.value) == (
        f"{url}: redirected 10 times without reaching the object (a redirect loop?)"
    )


def test_a_redirect_to_a_file_url_is_named(server: tuple[str, Hostile]) -> None:
    url, state = server
    state.redirects["/m.pte"] = "file:///etc/passwd"
    with pytest.raises(StorageError) as caught:
        _open(url)
    assert not isinstance(caught.value, ObjectNotFound)
    assert str(caught.value) == (
        f"{url}: redirected to 'file:///etc/passwd', not an http(s) URL: not followed"
    )


@pytest.mark.parametrize(
    ("mode", "why"),
    [("gzip", "no Content-Length; Content-Encoding: gzip"), ("chunked", "no Content-Length")],
)
def test_a_server_that_names_no_size_is_a_storage_error(
    server: tuple[str, Hostile], mode: str, why: str
) -> None:
    """Was a TypeError (``int(None)``): a traceback, exit 1, for fetch, inspect, select
    and verify alike; a small object read whole (get_bytes, an index) too."""
    url, state = server
    setattr(state, mode, True)
    message = (
        f"{url}: the server reports no size ({why}): ranged reads need an "
        "identity-encoded object of known size"
    )
    with pytest.raises(StorageError) as caught:
        _open(url)
    assert str(caught.value) == message
    with pytest.raises(StorageError) as caught:
        get_bytes(url, storage_options=INSTANT)
    assert str(caught.value) == message


def test_a_ranged_get_answered_encoded_is_refused(server: tuple[str, Hostile]) -> None:
    url, state = server
    state.gzip_get = True
    loader = _open(url)
    try:
        with pytest.raises(StorageError) as caught:
            loader.load(10, 20)
    finally:
        loader.close()
    assert str(caught.value) == (
        f"{url}: the server answered a ranged GET with Content-Encoding: gzip: ranged "
        "reads need an identity-encoded object of known size"
    )


@pytest.mark.parametrize(
    ("delta", "back", "answered"),
    [(-1000, 10, "bytes {first}-{last}/{size}"), (1000, 1010, "bytes {first}-{last}/{size}"),
     (1000, 10, "bytes */{size}")],
)  # fmt: skip
def test_a_get_naming_another_size_than_the_head_s_is_named(
    server: tuple[str, Hostile], delta: int, back: int, answered: str
) -> None:
    """HEAD short: the reads were cut to its size (the artifact then blamed for a
    missing trailer); HEAD long: the last range "another range than the one asked for",
    or past the end (416, ``bytes */size``): an HTTP 416 error."""
    url, state = server
    state.head_delta = delta
    loader = _open(url)
    head = len(DATA) + delta
    try:
        assert loader.size() == head
        with pytest.raises(StorageError) as caught:
            loader.load(head - back, back)
    finally:
        loader.close()
    assert not isinstance(caught.value, IntegrityError)
    first, last = head - back, min(head - 1, len(DATA) - 1)
    said = answered.format(first=first, last=last, size=len(DATA))
    assert str(caught.value) == (
        f"{url}: the server's HEAD said {head} bytes, its GET says {len(DATA)} "
        f"(Content-Range: {said}): the object's size is not known, its bytes are refused "
        "(an object replaced meanwhile, or a server or proxy whose HEAD and GET disagree)"
    )


def test_the_cli_says_so_without_a_traceback(
    server: tuple[str, Hostile], capsys: pytest.CaptureFixture[str]
) -> None:
    """``ptestore inspect`` of an object whose server names no size: exit 1 and the
    message (was a TypeError's traceback)."""
    from ptestore.cli import main

    url, state = server
    state.gzip = True
    assert main(["inspect", url]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{url}: the server reports no size (no Content-Length; Content-Encoding: gzip)" in err
