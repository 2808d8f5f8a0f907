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

import gc
import os
import signal
from collections.abc import Generator
from typing import Any

import pytest

from ptestore.testing import pytest_plugin
from ptestore.testing.pytest_plugin import S3_SERVERS

__all__ = ["S3_SERVERS"]

REQUIRE_INTEROP = os.environ.get("PTESTORE_REQUIRE_INTEROP", "") not in ("", "0")

# A child forked by a test (the crash tests' stepper, the in-place kill points, the
# unprivileged helper) inherits this process's garbage, S3 filesystems of earlier tests
# among it. Their finalizers wait on fsspec's event-loop thread, which a forked child does
# not have: each collection in the child stalled about 5 s (the crash matrices took 80 s
# instead of 4). What the parent left is not the child's to collect.
os.register_at_fork(after_in_child=gc.freeze)

# Started in the background by a shell without job control (``nohup bash .ci/run &``, a
# CI agent), this process may have SIGINT ignored. An ignored signal stays ignored across
# exec, and Python does not turn an ignored SIGINT into KeyboardInterrupt: every test that
# presses Ctrl-C on a child (the fleet, in place, the crash matrices) then saw a child that
# never noticed (8 failures in such a run). A handler of our own is reset to the default
# in every child at exec, so the children get Ctrl-C as on a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


#: Fixtures that start a real S3 server (moto, SeaweedFS): a test taking one is slow.
S3_FIXTURES = frozenset({"s3_server", "moto_s3", "seaweedfs_s3"})
#: Test files and directories that are slow as a whole, and why (relative to tests/).
SLOW_PATHS = {
    "viz/": "headless Chromium, a browser per test",
    "ci/test_ci_guard.py": "a child pytest session per test",
    "testing/test_pytest_plugin.py": "a child pytest session per test (a vendor's project)",
}
#: Single tests that are slow, and why (``path::name`` relative to tests/; a file that
#: imports pytest marks its own slow tests with ``@pytest.mark.slow`` instead).
SLOW_TESTS = {
    "format/test_fuzz.py::test_mutations_raise_only_format_errors": "10,000 mutated files",
    "fleet/test_shared_ptd.py::test_local_job_stores_the_ptd_once_and_fetch_follows_it": (
        "runs the fetched pair in the real runtime (imports torch and ExecuTorch)"
    ),
}
#: Tests of the kits that load the real ExecuTorch runtime without the interop marker.
SLOW_KIT_TESTS = frozenset({"test_loads_in_runtime"})


#: Tests allowed more than the per-test ceiling (``timeout = 300`` in pyproject.toml,
#: pytest-timeout: a hang fails with the test's name): seconds, for the few that take
#: 20-85 s on a busy 2-core machine (load 3-11) and scale with its load (docs/testing.md).
LONG_TESTS = {
    "fleet/test_fleet_s3.py::test_fleet_with_faults_reruns_and_changes": 900,
    "writers/test_termination_signals.py::test_specialize_on_s3_leaves_no_upload": 900,
    "writers/test_crash.py::test_specialize_sigint_and_sigkill_locally": 900,
    "writers/test_crash.py::test_specialize_sigint_and_sigkill_on_s3": 900,
    "fleet/test_fleet_dask.py::test_dask_cluster_matches_the_pool_even_when_a_worker_dies": 900,
    "interop/test_fixtures_sanity.py::test_runner_attributes_a_crash_to_its_job": 900,
    "interop/test_device_runtime.py::test_ensured_and_in_place_artifacts_in_the_runtime": 900,
}


def _test_id(item: pytest.Item) -> str:
    """``path::name`` of ``item``, the path relative to tests/, without parameters."""
    here = os.path.relpath(str(item.path), os.path.dirname(os.path.abspath(__file__)))
    return f"{here.replace(os.sep, '/')}::{getattr(item, 'originalname', item.name)}"


def _is_slow(item: pytest.Item, slow_paths: tuple[str, ...]) -> bool:
    """Slow without a marker of its own: a real S3 server (the ``s3`` marker or one of
    :data:`S3_FIXTURES`), the real runtime (``interop``, the kit's runtime check: each
    first use imports torch and ExecuTorch), a path of :data:`SLOW_PATHS` or a test of
    :data:`SLOW_TESTS`."""
    name = getattr(item, "originalname", item.name)
    return (
        _test_id(item) in SLOW_TESTS
        or item.get_closest_marker("s3") is not None
        or item.get_closest_marker("interop") is not None
        or name in SLOW_KIT_TESTS
        or bool(S3_FIXTURES & set(getattr(item, "fixturenames", ())))
        or str(item.path).startswith(slow_paths)
    )


def _mark_slow(items: list[pytest.Item]) -> None:
    """``slow`` on every test :func:`_is_slow` finds; the others that are slow (crash
    matrices, fuzzing, large files) carry ``@pytest.mark.slow`` themselves."""
    root = os.path.dirname(os.path.abspath(__file__))
    slow_paths = tuple(os.path.join(root, *p.split("/")) for p in SLOW_PATHS)
    for item in items:
        if item.get_closest_marker("slow") is None and _is_slow(item, slow_paths):
            item.add_marker(pytest.mark.slow)
        ceiling = LONG_TESTS.get(_test_id(item))
        if ceiling is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ceiling))
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_slow(items)
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


@pytest.fixture
def src(tmp_path: Any) -> Any:
    """A copy of the real ``mlp_xnnpack`` program (tests/fixtures) that a test may change,
    as ``tmp_path / "model.pte"``; a module's own ``src`` fixture overrides it."""
    from support.fixtures import get_fixture

    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    p = tmp_path / "model.pte"
    p.write_bytes(fx.pte_path.read_bytes())
    return p
