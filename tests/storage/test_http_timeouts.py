"""How long an ``http(s)://`` read waits for a server that stalls: a session the storage
options name no timeout for gets :data:`ptestore.storage.redirects.DEFAULT_TIMEOUT` (60 s
without a byte; aiohttp alone waited the whole request's 300 s, each of six attempts:
half an hour); one given (``client_kwargs={"timeout": ...}``) is kept. A stall past it
is a timeout, retried, then a ``StorageError`` saying so (it said the wrapper's URL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import aiohttp
import pytest
from support.faulty_proxy import local_http_server

from ptestore.errors import StorageError
from ptestore.storage.loaders import open_loader
from ptestore.storage.redirects import DEFAULT_TIMEOUT, GuardedClient, RedirectGuard


def _session_timeout(**kwargs: object) -> aiohttp.ClientTimeout:
    async def made() -> aiohttp.ClientTimeout:
        guard = RedirectGuard([("http", "h", 80)], [], refuse=False)
        session = await GuardedClient(guard)(**kwargs)
        try:
            timeout: aiohttp.ClientTimeout = session.timeout
            return timeout
        finally:
            await session.close()

    return asyncio.run(made())


def test_a_session_without_a_timeout_gets_the_default_and_a_given_one_is_kept() -> None:
    assert _session_timeout() == aiohttp.ClientTimeout(**DEFAULT_TIMEOUT)
    assert DEFAULT_TIMEOUT["sock_read"] == 60.0
    given = aiohttp.ClientTimeout(total=None, sock_read=5)
    assert _session_timeout(timeout=given) == given


@pytest.fixture
def stalled() -> Iterator[str]:
    """A server that answers nothing until the test ends."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            release.wait(60)

        def do_GET(self) -> None:
            release.wait(60)

    with local_http_server(Handler) as url:
        try:
            yield url
        finally:
            release.set()


def test_a_server_that_stalls_is_a_timeout_retried_then_said(stalled: str) -> None:
    timeout = aiohttp.ClientTimeout(sock_read=0.2)
    with pytest.raises(StorageError) as caught:
        open_loader(
            f"{stalled}/m.pte",
            client_kwargs={"timeout": timeout},
            retry_attempts=2,
            retry_initial=0,
            retry_max=0,
        )
    assert str(caught.value) == (
        f"{stalled}/m.pte: stat failed: SocketTimeoutError: Timeout on reading data from socket"
    )
