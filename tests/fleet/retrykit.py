"""What the tests of the fleet's one retry layer share (gc, a run's re-use check, the
index's listings and removals, the preflight's marker): the fast policy, a session
whose clients fail chosen requests, a dead endpoint and the policy's retry records."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["FAST", "dead_endpoint", "faulty_session", "retried"]

#: The policy the tests configure: three attempts, no backoff (no wall-clock waits).
FAST = {"retry_attempts": 3, "retry_initial": 0.0, "retry_max": 0.0}


def faulty_session(operation: str, fault: Callable[..., Any], only: Callable[[str], bool]) -> Any:
    """An aiobotocore session whose clients apply ``fault`` (a ``before-send`` hook,
    :class:`writers.s3_faults.Fault`) to the ``operation`` requests whose URL ``only``
    accepts; passed as the ``session`` storage option, every client made from the
    options has the hook."""
    import aiobotocore.session

    def hook(request: Any, **kwargs: Any) -> Any:
        return fault(request, **kwargs) if only(request.url) else None

    session = aiobotocore.session.AioSession()
    session.register(f"before-send.s3.{operation}", hook)
    return session


def dead_endpoint() -> str:
    """An endpoint URL on a port nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def retried(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    """The policy's retry records of ``what`` (``"<url>: <request>"``)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ptestore.retry" and r.getMessage().startswith(f"{what}: attempt ")
    ]
