"""The fast inner loop (``pytest -m "not slow"``) and the per-test ceiling
(docs/testing.md): what ``tests/conftest.py`` marks slow and allows longer exists, the
selection leaves out what it says, and a hang fails with the test's name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

TESTS = Path(conftest.__file__).resolve().parent
ROOT = TESTS.parent


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def test_every_listed_test_and_path_exists() -> None:
    """A renamed test must not drop out of the tables silently (it would then be fast,
    or get the default ceiling)."""
    for test_id in (*conftest.SLOW_TESTS, *conftest.LONG_TESTS):
        path, name = test_id.split("::")
        assert name in _functions(TESTS / path), test_id
    for path in conftest.SLOW_PATHS:
        assert (TESTS / path).exists(), path


def _collect(*args: str) -> str:
    env = {**os.environ, "PTESTORE_REQUIRE_INTEROP": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
        check=False,
    )
    return done.stdout + done.stderr


@pytest.mark.slow  # a child pytest collecting seven files
def test_not_slow_leaves_out_servers_browsers_runtime_and_the_listed() -> None:
    fast = _collect(
        "-m",
        "not slow",
        "tests/writers/test_contract_s3.py",  # pytestmark s3
        "tests/writers/test_cli_gc.py",  # some tests take moto_s3 without a marker
        "tests/viz/test_matrix_page.py",  # SLOW_PATHS
        "tests/interop/test_patch_runtime.py",  # interop
        "tests/backends/test_backend_kit.py",  # the kit's runtime check
        "tests/format/test_fuzz.py",  # SLOW_TESTS
        "tests/writers/test_crash.py",  # @pytest.mark.slow, LONG_TESTS
    )
    ids = [line for line in fast.splitlines() if "::" in line]
    assert ids, fast
    for gone in (
        "test_contract_s3.py",
        "test_matrix_page.py",
        "test_patch_runtime.py",
        "test_loads_in_runtime",
        "test_mutations_raise_only_format_errors",
        "test_specialize_sigint_and_sigkill",
    ):
        assert not [i for i in ids if gone in i], gone
    assert not [i for i in ids if "test_cli_gc.py" in i and "s3" in i.lower()], ids
    # what stays: the gc tests on local files, the kit's other checks, the short fuzz
    assert any("test_cli_gc.py::" in i for i in ids), ids
    assert any("test_backend_kit.py::" in i and "test_runs_or_declines" in i for i in ids)
    assert any("test_fuzz.py::test_short_hostile_files_raise_only_format_errors" in i for i in ids)


@pytest.mark.slow  # a child pytest session
def test_a_hang_fails_with_the_tests_name(tmp_path: Path) -> None:
    """The ceiling is pytest-timeout's: a test that never returns fails, named, and the
    run goes on (here with a 2 s ceiling instead of the suite's 300 s)."""
    (tmp_path / "test_hang.py").write_text(
        "import threading\n\n"
        "def test_waits_forever():\n    threading.Event().wait()\n\n"
        "def test_after_it():\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stdout
    assert "FAILED test_hang.py::test_waits_forever" in done.stdout, done.stdout
    assert "Failed: Timeout (>2.0s) from pytest-timeout." in done.stdout, done.stdout
    assert "1 failed, 1 passed" in done.stdout


def test_the_suites_ceiling_is_300_seconds() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["timeout"] == 300
    assert all(300 < seconds <= 900 for seconds in conftest.LONG_TESTS.values())
