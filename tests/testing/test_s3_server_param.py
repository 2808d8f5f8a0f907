"""The ``s3_server`` parametrization and the ``s3_xfail`` marker of ptestore's pytest
plugin (:mod:`ptestore.testing.pytest_plugin`), run in a child pytest as a vendor runs
it: a test file and ``-p`` (what the ``pytest11`` entry point does for an installed
ptestore), no conftest, with stand-in servers (no moto or SeaweedFS needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

HEADER = """
import pytest

class Fake:
    def __init__(self, name):
        self.name = name

@pytest.fixture
def moto_s3():
    return Fake("moto")

@pytest.fixture
def seaweedfs_s3():
    return Fake("seaweedfs")
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    # --strict-markers: the plugin registers s3_xfail (no ini of the project's own)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    (tmp_path / "test_x.py").write_text(HEADER + body)
    env = {**os.environ, "PTESTORE_REQUIRE_INTEROP": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    plugin = ["-p", "ptestore.testing.pytest_plugin", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rxXf", *plugin, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def test_each_server_is_a_parameter(tmp_path: Path) -> None:
    result = run(
        tmp_path, "def test_a(s3_server):\n    assert s3_server.name in ('moto', 'seaweedfs')\n"
    )
    assert result.returncode == 0, result.stdout
    assert "2 passed" in result.stdout


def test_s3_xfail_is_strict_on_that_server_only(tmp_path: Path) -> None:
    body = (
        "@pytest.mark.s3_xfail('moto', reason='moto lacks it')\n"
        "def test_a(s3_server):\n    assert s3_server.name == 'seaweedfs'\n"
        "@pytest.mark.s3_xfail('seaweedfs', reason='it works there')\n"
        "def test_b(s3_server):\n    pass\n"
    )
    result = run(tmp_path, body)
    assert result.returncode == 1, result.stdout
    assert "XFAIL test_x.py::test_a[moto] - moto: moto lacks it" in result.stdout
    assert "[XPASS(strict)] seaweedfs: it works there" in result.stdout
    assert "1 failed, 2 passed, 1 xfailed" in result.stdout


def test_s3_xfail_names_a_known_server(tmp_path: Path) -> None:
    body = "@pytest.mark.s3_xfail('minio', reason='x')\ndef test_a(s3_server):\n    pass\n"
    result = run(tmp_path, body)
    assert result.returncode != 0
    assert (
        "test_x.py::test_a[moto]: s3_xfail names server 'minio', expected one of "
        "['moto', 'seaweedfs']" in result.stdout + result.stderr
    )


def test_s3_xfail_needs_the_s3_server_fixture(tmp_path: Path) -> None:
    body = "@pytest.mark.s3_xfail('moto', reason='x')\ndef test_a():\n    pass\n"
    result = run(tmp_path, body)
    assert result.returncode != 0
    assert "test_x.py::test_a: s3_xfail on a test without s3_server" in (
        result.stdout + result.stderr
    )
