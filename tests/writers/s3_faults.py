"""Fault injection for S3 tests through botocore ``before-send`` hooks.

A hook registered on ``before-send.s3.<Operation>`` sees every attempt of that call;
returning a response skips the network, raising a transport error looks like a
dropped connection. The writer's client is s3fs's (aiobotocore), so responses are
``AioAWSResponse`` objects whose body is read asynchronously. moto never produces
SlowDown, 200-with-error or lost responses, so these are how those paths are exercised
against its real server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import urllib3
from aiobotocore.awsrequest import AioAWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

MARKER = 10000

ERRORS: dict[str, tuple[int, str]] = {
    "500": (500, "InternalError"),
    "503": (503, "SlowDown"),
    "403": (403, "AccessDenied"),
    "404-bucket": (404, "NoSuchBucket"),
    "404-upload": (404, "NoSuchUpload"),
    "409": (409, "ConditionalRequestConflict"),
    "412": (412, "PreconditionFailed"),
    "200-error": (200, "InternalError"),
    "501": (501, "NotImplemented"),
}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


def fake_response(url: str, status: int, headers: dict[str, str], body: bytes) -> AioAWSResponse:
    """A response as the server would have sent it (the request never leaves)."""
    return AioAWSResponse(url, status, headers, _Raw(body))


def error_response(url: str, kind: str) -> AioAWSResponse:
    status, code = ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected {kind}</Message>"
        "<RequestId>test</RequestId></Error>"
    ).encode()
    return fake_response(url, status, {"Content-Type": "application/xml"}, body)


class Fault:
    """Fail the first ``times`` attempts of one operation (``times=-1``: always).

    ``kind`` is a key of :data:`ERRORS`, ``"reset"`` (connection closed) or
    ``"lost"`` (the request reaches the server, the response never comes back).
    """

    def __init__(
        self, operation: str, kind: str, times: int = 1, *, marker_too: bool = False
    ) -> None:
        self.marker_too = marker_too
        self.operation = operation
        self.kind = kind
        self.remaining = times
        self.calls = 0
        self.injected = 0
        self._http = urllib3.PoolManager()

    def __call__(self, request: Any, **_kwargs: Any) -> AioAWSResponse | None:
        if f"partNumber={MARKER}" in request.url and not self.marker_too:
            return None  # leave ptestore's gc marker part alone unless asked
        self.calls += 1
        if self.remaining == 0:
            return None
        if self.remaining > 0:
            self.remaining -= 1
        self.injected += 1
        if self.kind == "reset":
            raise ConnectionClosedError(endpoint_url=request.url)
        if self.kind == "lost":
            body = request.body
            if hasattr(body, "read"):
                body = body.read()
            self._http.request(
                request.method, request.url, body=body, headers=dict(request.headers)
            )
            raise ReadTimeoutError(endpoint_url=request.url)
        return error_response(request.url, self.kind)

    def install(self, client: Any) -> Fault:
        client.meta.events.register(f"before-send.s3.{self.operation}", self)
        return self


def sequence(*handlers: Callable[[Any], AioAWSResponse | None]) -> Callable[..., Any]:
    """A hook applying ``handlers`` to successive attempts, then passing through."""
    queue = list(handlers)

    def hook(request: Any, **_kwargs: Any) -> AioAWSResponse | None:
        if not queue:
            return None
        return queue.pop(0)(request)

    return hook
