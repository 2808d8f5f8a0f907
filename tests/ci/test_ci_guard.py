"""The CI guards: tests/conftest.py (with PTESTORE_REQUIRE_INTEROP=1 a skipped or
xfailed interop test fails the run, and so does a selection that deselects interop tests
or a run that collects none) and scripts/check_cpu_only.py (scripts/test.sh fails on a
CUDA torch or GPU packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


def run(tmp_path: Path, body: str, require: bool, *args: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    interop: real runtime\n")
    (tmp_path / "test_x.py").write_text("import pytest\n" + body)
    env = dict(os.environ)
    env["PTESTORE_REQUIRE_INTEROP"] = "1" if require else "0"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )


SKIPPING = """
@pytest.mark.interop
def test_runtime():
    pytest.importorskip("no_such_runtime_module")

def test_plain():
    pass
"""


def test_skipped_interop_fails_when_required(tmp_path: Path) -> None:
    result = run(tmp_path, SKIPPING, require=True)
    assert result.returncode == 1, result.stdout
    assert "interop test skipped while PTESTORE_REQUIRE_INTEROP=1" in result.stdout


def test_skipped_interop_is_a_skip_otherwise(tmp_path: Path) -> None:
    result = run(tmp_path, SKIPPING, require=False)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout


def test_module_level_skip_of_interop_fails_when_required(tmp_path: Path) -> None:
    interop = tmp_path / "interop"
    interop.mkdir()
    (interop / "test_y.py").write_text(
        "import pytest\n"
        "pytest.importorskip('no_such_runtime_module')\n"
        "@pytest.mark.interop\n"
        "def test_runtime():\n    pass\n"
    )
    result = run(tmp_path, "@pytest.mark.interop\ndef test_other():\n    pass\n", require=True)
    assert result.returncode != 0, result.stdout
    assert "interop module skipped while PTESTORE_REQUIRE_INTEROP=1" in result.stdout


def test_no_interop_collected_is_an_error(tmp_path: Path) -> None:
    result = run(tmp_path, "def test_plain():\n    pass\n", require=True)
    assert result.returncode != 0
    assert "no interop test was collected" in result.stdout + result.stderr


XFAIL_MARKED = """
@pytest.mark.interop
@pytest.mark.xfail(reason="runtime crashes on this model")
def test_runtime():
    assert False

def test_plain():
    pass
"""

XFAIL_CALLED = """
@pytest.mark.interop
def test_runtime():
    pytest.xfail("runtime crashes on this model")

def test_plain():
    pass
"""


def test_xfail_marked_interop_fails_when_required(tmp_path: Path) -> None:
    result = run(tmp_path, XFAIL_MARKED, require=True)
    assert result.returncode != 0, result.stdout
    assert (
        "PTESTORE_REQUIRE_INTEROP=1 but interop tests are marked xfail (an expected failure "
        "of the real runtime would pass silently): test_x.py::test_runtime"
    ) in result.stdout + result.stderr


def test_xfail_called_in_interop_fails_when_required(tmp_path: Path) -> None:
    result = run(tmp_path, XFAIL_CALLED, require=True)
    assert result.returncode == 1, result.stdout
    assert (
        "interop test xfailed while PTESTORE_REQUIRE_INTEROP=1: runtime crashes on this model"
    ) in result.stdout
    assert "1 failed, 1 passed" in result.stdout


def test_xfail_is_an_xfail_otherwise(tmp_path: Path) -> None:
    for body in (XFAIL_MARKED, XFAIL_CALLED):
        result = run(tmp_path, body, require=False)
        assert result.returncode == 0, result.stdout
        assert "1 passed, 1 xfailed" in result.stdout


PLAIN_AND_INTEROP = """
@pytest.mark.interop
def test_runtime():
    pass

def test_plain():
    pass
"""


def test_selection_deselecting_interop_fails_when_required(tmp_path: Path) -> None:
    for selection in (["-m", "not interop"], ["-k", "not runtime"]):
        result = run(tmp_path, PLAIN_AND_INTEROP, True, *selection)
        assert result.returncode != 0, (selection, result.stdout)
        assert (
            "PTESTORE_REQUIRE_INTEROP=1 but the selection (-m/-k) deselected 1 interop "
            "test(s), e.g. test_x.py::test_runtime"
        ) in result.stdout + result.stderr, selection


def test_selection_keeping_interop_passes_when_required(tmp_path: Path) -> None:
    result = run(tmp_path, PLAIN_AND_INTEROP, True, "-k", "runtime or plain")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_selection_is_free_otherwise(tmp_path: Path) -> None:
    result = run(tmp_path, PLAIN_AND_INTEROP, False, "-m", "not interop")
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 deselected" in result.stdout


# ------------------------------------------------------------------ scripts/check_cpu_only.py
CHECK_CPU_ONLY = CONFTEST.parent.parent / "scripts" / "check_cpu_only.py"


def run_cpu_check(
    tmp_path: Path, torch_version: str, cuda: str | None, dists: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the check with a stand-in ``torch`` module and fake installed distributions
    first on ``sys.path``."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(
        "import types\n"
        f"__version__ = {torch_version!r}\n"
        f"version = types.SimpleNamespace(cuda={cuda!r})\n"
    )
    for name in dists:
        info = site / f"{name.replace('-', '_')}-12.4.5.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 12.4.5\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, str(CHECK_CPU_ONLY)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_cpu_only_environment_passes(tmp_path: Path) -> None:
    result = run_cpu_check(tmp_path, "2.13.0+cpu", None)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "torch 2.13.0+cpu, CPU only, no nvidia-*/triton packages\n"


def test_cuda_torch_fails(tmp_path: Path) -> None:
    result = run_cpu_check(tmp_path, "2.13.0", "12.8")
    assert result.returncode == 1
    assert "torch 2.13.0 is a CUDA build (CUDA 12.8)" in result.stderr
    assert "Remove .venv and rerun scripts/test.sh" in result.stderr


def test_cu_local_version_fails_even_without_cuda_runtime(tmp_path: Path) -> None:
    result = run_cpu_check(tmp_path, "2.13.0+cu128", None)
    assert result.returncode == 1
    assert "torch 2.13.0+cu128 is a CUDA build (CUDA None)" in result.stderr


def test_nvidia_and_triton_packages_fail(tmp_path: Path) -> None:
    result = run_cpu_check(tmp_path, "2.13.0+cpu", None, ("nvidia-cublas-cu12", "triton"))
    assert result.returncode == 1
    assert "GPU packages installed: nvidia-cublas-cu12, triton" in result.stderr
