"""Bytes and calls through S3 clients, counted with botocore event hooks.

:class:`Traffic` registers two handlers on a botocore event emitter (one client's
``client.meta.events``, or a session whose clients all inherit them):

- ``before-send.s3`` sees every HTTP request as it leaves: the request body's length is
  counted as *sent* (``Content-Length``, else the body's own length);
- ``after-call.s3`` sees every answer: its ``Content-Length`` is counted as *received*
  (a ranged GET's body, an XML answer; a HEAD has no body).

Bodies are counted, not HTTP headers: each request and answer adds a few hundred bytes
of headers (see ``calls``). *Data* is the object bytes themselves (``UploadPart`` and
``PutObject`` bodies sent, ``GetObject`` bodies received); the rest is XML (requests such
as ``CompleteMultipartUpload``, answers such as ``CopyPartResult``).

Used by the server-side copy tests and ``benchmarks/bench_s3_copy.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["DATA_RECEIVED", "DATA_SENT", "Traffic"]

#: Operations whose request bodies are object bytes.
DATA_SENT = ("UploadPart", "PutObject")
#: Operations whose answer bodies are object bytes.
DATA_RECEIVED = ("GetObject",)


def _length(headers: Any, body: object) -> int:
    value = headers.get("Content-Length") if headers is not None else None
    if value is not None:
        return int(value)
    if isinstance(body, bytes | bytearray | memoryview):
        return memoryview(body).nbytes
    return 0


class Traffic:
    """Counts per S3 operation: calls, body bytes sent and received, request params."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        #: The parameters of each call, per operation (``params[op]`` in call order).
        self.params: dict[str, list[dict[str, Any]]] = {}

    def attach(self, events: Any) -> Traffic:
        """Register on a botocore event emitter (``client.meta.events`` or a session)."""
        events.register("before-send.s3", self._on_send)
        events.register("after-call.s3", self._on_answer)
        events.register("provide-client-params.s3", self._on_params)
        return self

    def _on_send(self, request: Any, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.calls[op] += 1
            self.sent[op] += _length(getattr(request, "headers", None), request.body)

    def _on_answer(self, http_response: Any = None, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        headers = getattr(http_response, "headers", None)
        # A HEAD answer's Content-Length is the object's size, not a body.
        size = _length(headers, b"") if headers is not None and op != "HeadObject" else 0
        with self._lock:
            self.received[op] += size

    def _on_params(self, params: dict[str, Any], event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.params.setdefault(op, []).append({k: v for k, v in params.items() if k != "Body"})

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.sent.clear()
            self.received.clear()
            self.params.clear()

    def summary(self) -> dict[str, Any]:
        """Totals and per-operation figures, JSON-ready."""
        with self._lock:
            ops = sorted(self.calls)
            return {
                "bytes_sent": sum(self.sent.values()),
                "bytes_received": sum(self.received.values()),
                "data_sent": sum(self.sent[op] for op in DATA_SENT),
                "data_received": sum(self.received[op] for op in DATA_RECEIVED),
                "calls": {op: self.calls[op] for op in ops},
                "sent": {op: self.sent[op] for op in ops},
                "received": {op: self.received[op] for op in ops},
            }
