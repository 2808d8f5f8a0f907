"""The CI guard in tests/conftest.py: with PTESTORE_REQUIRE_INTEROP=1 a skipped interop
test fails the run, and a run that collects no interop test is an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


def run(tmp_path: Path, body: str, require: bool) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    interop: real runtime\n")
    (tmp_path / "test_x.py").write_text("import pytest\n" + body)
    env = dict(os.environ)
    env["PTESTORE_REQUIRE_INTEROP"] = "1" if require else "0"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
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
