"""An HTTP reverse proxy in front of moto's S3 server that injects transient faults.

Every client reaches it by URL, so faults reach worker processes (a process pool, Dask
workers) that in-process botocore hooks (tests/writers/s3_faults.py) cannot. Each
request gets a sequence number; request ``n`` fails when ``n % every == 0``, with an
S3 ``503 SlowDown`` or ``500 InternalError`` error (alternately); everything else is
forwarded unchanged. ``enabled`` turns injection on and off; ``every=0`` injects nothing.

It also counts what the store sent back (``sent``: response body bytes per method, the
server's side of "bytes moved") and can change what it forwards: ``tamper(method, path,
headers, body)`` returns the body the client gets (a byte flipped in transit); or
``answer(method, path, request headers, response headers, body)`` returns the response
headers and body it gets (another range than it asked for, its ``Content-Range`` too).
A body ``answer`` gives as an iterable of pieces instead of bytes is streamed, without a
``Content-Length`` unless the headers it returns claim one, the connection closed after
it: piece by piece until the iterable ends or the client hangs up (an endless body);
``streamed`` then gets the bytes the proxy wrote of it (a queue: a test takes each
stream's count once the proxy is done with it, not while it still writes). ``status``
changes the HTTP status of an answer (200 for a ranged GET: a server that ignored the
range).
"""

from __future__ import annotations

import http.client
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te"}


@dataclass
class FaultState:
    every: int
    enabled: bool = True
    #: Only requests of these HTTP methods are counted and failed (None: all).
    methods: frozenset[str] | None = None
    requests: int = 0
    injected: int = 0
    by_method: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The bytes written of each streamed body, once its stream ended.
    streamed: queue.Queue[int] = field(default_factory=queue.Queue)
    #: Response body bytes forwarded to the client, per method.
    sent: dict[str, int] = field(default_factory=dict)
    #: ``(method, path, request headers, body) -> body``: what the client gets.
    tamper: Callable[[str, str, dict[str, str], bytes], bytes] | None = None
    #: ``(method, path, request headers, response headers, body) -> (response headers,
    #: body)``: the response the client gets (the request is signed: not rewritten); a
    #: body given as an iterable of pieces is streamed (see the module docstring).
    answer: (
        Callable[
            [str, str, dict[str, str], dict[str, str], bytes],
            tuple[dict[str, str], bytes | Iterable[bytes]],
        ]
        | None
    ) = None
    #: ``(method, path, request headers) -> status``: the HTTP status the client gets
    #: instead of the store's (None: the store's).
    status: Callable[[str, str, dict[str, str]], int | None] | None = None

    def count(self, method: str, nbytes: int) -> None:
        with self.lock:
            self.sent[method] = self.sent.get(method, 0) + nbytes

    def should_fail(self, method: str) -> int:
        with self.lock:
            if self.methods is not None and method not in self.methods:
                return 0
            self.requests += 1
            if not self.enabled or not self.every or self.requests % self.every:
                return 0
            self.injected += 1
            self.by_method[method] = self.by_method.get(method, 0) + 1
            return 503 if self.injected % 2 else 500


def _handler(target: str, state: FaultState) -> type[BaseHTTPRequestHandler]:
    host = urlsplit(target).netloc

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status = state.should_fail(self.command)
            if status:
                code = "SlowDown" if status == 503 else "InternalError"
                payload = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>injected by the test proxy</Message></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header(
                    "Content-Length", str(0 if self.command == "HEAD" else len(payload))
                )
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(host, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if state.tamper is not None:
                    data = state.tamper(self.command, self.path, dict(self.headers), data)
                out = dict(resp.getheaders())
                code, reason = resp.status, resp.reason
                if state.status is not None:
                    changed = state.status(self.command, self.path, dict(self.headers))
                    if changed is not None:
                        code, reason = changed, http.client.responses.get(changed, "")
                if state.answer is not None:
                    out, answered = state.answer(
                        self.command, self.path, dict(self.headers), out, data
                    )
                    if not isinstance(answered, bytes | bytearray):
                        self._stream(code, reason, out, answered)
                        return
                    data = bytes(answered)
                if self.command != "HEAD":
                    state.count(self.command, len(data))
                self.send_response(code, reason)
                for k, v in out.items():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                if self.command == "HEAD":
                    self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        def _stream(
            self, status: int, reason: str, out: dict[str, str], pieces: Iterable[bytes]
        ) -> None:
            """Send ``pieces`` as they come, until they end or the client hangs up."""
            self.close_connection = True
            self.send_response(status, reason)
            for k, v in out.items():
                if k.lower() not in _HOP:  # a Content-Length the answer claims is sent
                    self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            written = 0
            try:
                for piece in pieces:
                    self.wfile.write(piece)
                    written += len(piece)
            except OSError:  # the client read what it wanted and hung up
                pass
            finally:
                state.count(self.command, written)
                state.streamed.put(written)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


@contextmanager
def faulty_proxy(
    target: str, every: int, methods: frozenset[str] | None = None
) -> Iterator[tuple[str, FaultState]]:
    """Run the proxy on 127.0.0.1 (a free port); yields ``(endpoint_url, state)``.
    ``methods``: fail only requests of these HTTP methods (counted among themselves)."""
    state = FaultState(every, methods=methods)
    with local_http_server(_handler(target, state)) as url:
        yield url, state


@contextmanager
def local_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) from a thread; yields its base URL
    (``http://127.0.0.1:PORT``) and stops the server on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
