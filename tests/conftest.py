"""Suite-wide configuration.

With ``PTESTORE_REQUIRE_INTEROP=1`` (set by ``scripts/test.sh``, hence by CI) the
real-runtime suite must never pass without running: a skipped or xfailed ``interop``
test is a failure, an interop test marked ``xfail`` is refused at collection, and so is
a selection (``-m``, ``-k``) that deselects interop tests or a run that collects none.

The S3 servers (``s3_server`` over moto and SeaweedFS, ``moto_s3``, ``seaweedfs_s3``),
the ``s3_xfail`` marker and the kits' markers come from ptestore's pytest plugin
(:mod:`ptestore.testing.pytest_plugin`), the one a vendor gets: pytest loads it through
the ``pytest11`` entry point of an installed ptestore, and this file registers it when
the tree under test is not the installed one (``PYTHONPATH``, a fresh clone).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

from ptestore.testing import pytest_plugin
from ptestore.testing.pytest_plugin import S3_SERVERS

__all__ = ["S3_SERVERS"]

REQUIRE_INTEROP = os.environ.get("PTESTORE_REQUIRE_INTEROP", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    # Under the entry point's name (its module's), unless an installed ptestore's entry
    # point or -p already registered it: the same module, whichever tree it comes from.
    manager = config.pluginmanager
    if not manager.is_registered(pytest_plugin):
        manager.register(pytest_plugin, pytest_plugin.__name__)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (
        REQUIRE_INTEROP
        and item.get_closest_marker("interop") is not None
        and (report.skipped or hasattr(report, "wasxfail"))
    ):
        what = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        reason = getattr(report, "wasxfail", "") or (
            report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        )
        if hasattr(report, "wasxfail"):
            del report.wasxfail  # else pytest still counts it as an expected failure
        report.outcome = "failed"
        report.longrepr = f"interop test {what} while PTESTORE_REQUIRE_INTEROP=1: {reason}"
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REQUIRE_INTEROP:
        return
    xfail = [i.nodeid for i in items if i.get_closest_marker("interop") and _xfail(i)]
    if xfail:
        raise pytest.UsageError(
            "PTESTORE_REQUIRE_INTEROP=1 but interop tests are marked xfail (an expected "
            f"failure of the real runtime would pass silently): {', '.join(xfail[:5])}"
        )


def _xfail(item: pytest.Item) -> bool:
    return item.get_closest_marker("xfail") is not None


def pytest_deselected(items: list[pytest.Item]) -> None:
    """A selection (``-m "not interop"``, ``-k``) must not drop the interop suite."""
    if not REQUIRE_INTEROP:
        return
    dropped = [i.nodeid for i in items if i.get_closest_marker("interop")]
    if dropped:
        raise pytest.UsageError(
            f"PTESTORE_REQUIRE_INTEROP=1 but the selection (-m/-k) deselected {len(dropped)} "
            f"interop test(s), e.g. {dropped[0]}; run without the selection or unset "
            "PTESTORE_REQUIRE_INTEROP"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    if REQUIRE_INTEROP and not any(i.get_closest_marker("interop") for i in session.items):
        raise pytest.UsageError("PTESTORE_REQUIRE_INTEROP=1 but no interop test was collected")
