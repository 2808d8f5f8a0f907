"""A small HTTP server on 127.0.0.1 that serves objects by path (``HEAD``, ``GET`` whole
or with one ``Range: bytes=A-B``) and answers some paths with a redirect, logging the
headers of every request: what a server that redirects a device elsewhere (an API to a
presigned object-store URL, an index's server to a host it does not own) sees."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from support.faulty_proxy import local_http_server

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


@dataclass
class Seen:
    """One request: its method, path and headers (names in lower case)."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class ServerState:
    objects: dict[str, bytes] = field(default_factory=dict)
    #: Paths answered ``302 Found`` with ``Location:`` this URL.
    redirects: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def header_values(self, name: str) -> set[str | None]:
        """The values of header ``name`` in every request seen (None: not sent)."""
        return {s.headers.get(name.lower()) for s in self.seen}


def _handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, with_body: bool) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            state.seen.append(Seen(self.command, self.path, headers))
            target = state.redirects.get(self.path)
            if target is not None:
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = state.objects.get(self.path)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            m = _RANGE.fullmatch(headers.get("range", ""))
            if m is None:
                part = data
                self.send_response(200)
            else:
                first, last = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
                part = data[first : last + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if with_body:
                self.wfile.write(part)

        def do_HEAD(self) -> None:
            self._answer(False)

        def do_GET(self) -> None:
            self._answer(True)

    return Handler


@contextmanager
def redirect_server() -> Iterator[tuple[str, ServerState]]:
    """A server with no objects yet; yields ``(base URL, state)`` (fill ``objects`` and
    ``redirects`` by path: ``"/m.pte"``)."""
    state = ServerState()
    with local_http_server(_handler(state)) as url:
        yield url, state
