"""Suite-wide configuration.

With ``PTESTORE_REQUIRE_INTEROP=1`` (set by ``scripts/test.sh``, hence by CI) a skipped
``interop`` test is a failure: the real-runtime suite must never pass by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from ptestore.testing.moto import MotoS3, moto_s3_server

REQUIRE_INTEROP = os.environ.get("PTESTORE_REQUIRE_INTEROP", "") not in ("", "0")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if REQUIRE_INTEROP and report.skipped and item.get_closest_marker("interop") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"interop test skipped while PTESTORE_REQUIRE_INTEROP=1: {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """A module of the interop suite skipped at import time is a failure too."""
    report = yield
    if REQUIRE_INTEROP and report.skipped and _is_interop_path(str(collector.path)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"interop module skipped while PTESTORE_REQUIRE_INTEROP=1: {reason}"
    return report


def _is_interop_path(path: str) -> bool:
    return f"{os.sep}interop{os.sep}" in path or os.path.basename(path).startswith("test_interop")


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One real moto S3 server (HTTP on 127.0.0.1, a free port) for the whole run.

    moto is part of the [test] extra: if it is missing this errors, never skips.
    """
    with moto_s3_server(min_part_size=1) as server:
        yield server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REQUIRE_INTEROP and not any(i.get_closest_marker("interop") for i in items):
        if config.getoption("-k") or config.getoption("-m"):
            return
        raise pytest.UsageError("PTESTORE_REQUIRE_INTEROP=1 but no interop test was collected")
