"""A small HTTP server on 127.0.0.1 holding objects by path, as a static file server
serves them: ``HEAD`` (``Content-Length``), ``GET`` whole or with one ``Range:
bytes=A-B`` (206 and its ``Content-Range``). For the ``http://`` URLs ptestore reads
through fsspec: an index may name one, and a server (or something between) may answer
with more than was asked for.

``state.ignore_range`` makes every GET answer 200 with the whole object, whatever
range it asked for (a server that does not do ranges). ``state.endless`` makes every
ranged GET answer with the range asked for and then more and more bytes (up to
``ENDLESS`` MiB, without a ``Content-Length``, the connection closed after it);
``state.streamed`` gets the bytes written of each such body once it ends (the client
hung up, or all of it was sent).
"""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from support.faulty_proxy import local_http_server

#: MiB an endless body sends at most (a client that reads them all was not bounded).
ENDLESS = 128

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


@dataclass
class StoreState:
    objects: dict[str, bytes] = field(default_factory=dict)
    #: ``(method, path, Range header or None)`` of every request, in order.
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    endless: bool = False
    ignore_range: bool = False
    streamed: queue.Queue[int] = field(default_factory=queue.Queue)


def _handler(state: StoreState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, with_body: bool) -> None:
            asked = self.headers.get("Range")
            state.requests.append((self.command, self.path, asked))
            data = state.objects.get(self.path)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            m = None if asked is None or state.ignore_range else _RANGE.fullmatch(asked)
            if m is None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if with_body:
                    self.wfile.write(data)
                return
            first, last = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            if not state.endless:
                self.send_header("Content-Length", str(last + 1 - first))
                self.end_headers()
                self.wfile.write(data[first : last + 1])
                return
            self.close_connection = True
            self.send_header("Connection", "close")
            self.end_headers()
            written = 0
            try:
                for piece in [data[first : last + 1]] + [bytes(1 << 20)] * ENDLESS:
                    self.wfile.write(piece)
                    written += len(piece)
            except OSError:  # the client read what it wanted and hung up
                pass
            finally:
                state.streamed.put(written)

        def do_HEAD(self) -> None:
            self._answer(False)

        def do_GET(self) -> None:
            self._answer(True)

    return Handler


@contextmanager
def http_store(objects: dict[str, bytes]) -> Iterator[tuple[str, StoreState]]:
    """Serve ``objects`` (by path: ``"/m.pte"``); yields ``(base URL, state)``."""
    state = StoreState(dict(objects))
    with local_http_server(_handler(state)) as url:
        yield url, state
