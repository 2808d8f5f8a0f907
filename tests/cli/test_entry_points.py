"""Issue 29, item 4: the installed ``ptestore`` console script and ``python -m ptestore``
(not only :func:`ptestore.cli.main`) run every sub-command and exit with its status.

The console script is the one the environment's installer wrote beside the interpreter
(``.venv/bin/ptestore``: ``from ptestore.cli import program``); ``PYTHONPATH`` makes it
import the tree under test. A clean ``gc`` once exited 1 through both (the ``gc``
sub-command module shadowed the standard library's ``gc`` in ``ptestore/cli``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ptestore
from ptestore.cli import COMMANDS
from ptestore.cli.exits import EXIT_OK

#: The console script of the environment running the tests.
SCRIPT = Path(sys.executable).with_name("ptestore")
#: Every command line whose ``--help`` is checked: each sub-command, and the actions of
#: those that have their own.
HELP_COMMANDS = [[name] for name in COMMANDS] + [["fleet", "run"], ["fleet", "plan"]]
ENTRY_POINTS = ("console-script", "python-m")


def _entry(kind: str) -> list[str]:
    if kind == "console-script":
        assert SCRIPT.is_file(), (
            f"no console script at {SCRIPT}: install the package into this environment "
            "(pip install -e .)"
        )
        return [str(SCRIPT)]
    return [sys.executable, "-m", "ptestore"]


def _run(kind: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tree = str(Path(ptestore.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [*_entry(kind), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_the_entry_point_runs_the_tree_under_test(kind: str) -> None:
    done = _run(kind, "--version")
    assert (done.returncode, done.stderr) == (EXIT_OK, ""), done.stderr
    assert done.stdout == f"ptestore {ptestore.__version__}\n"  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ENTRY_POINTS)
@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_every_subcommand_help_exits_0(kind: str, command: list[str]) -> None:
    done = _run(kind, *command, "--help")
    assert (done.returncode, done.stderr) == (EXIT_OK, ""), done.stderr
    assert done.stdout.startswith(f"usage: ptestore {' '.join(command)} "), done.stdout[:200]


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_a_real_gc_run_exits_0(kind: str, tmp_path: Path) -> None:
    """A stale staging file is removed, a fresh one and the model are kept, and the
    program exits 0 (it used to exit 1 after doing the work)."""
    model = tmp_path / "m.pte"
    model.write_bytes(b"model")
    stale = tmp_path / ".m.pte.ptestore-0123456789abcdef.tmp"
    fresh = tmp_path / ".m.pte.ptestore-fedcba9876543210.tmp"
    for leftover in (stale, fresh):
        leftover.write_bytes(b"x" * 10)
    old = stale.stat().st_mtime - 3 * 86400
    os.utime(stale, (old, old))
    done = _run(kind, "gc", str(tmp_path), "--older-than", "1d")
    assert (done.returncode, done.stderr) == (EXIT_OK, ""), done.stderr
    assert done.stdout.endswith("removed 1 of 2 leftover(s) older than 1d; 0 failed\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([model.name, fresh.name])


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_a_failing_command_keeps_its_exit_status(kind: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    done = _run(kind, "gc", str(missing))
    assert done.returncode == 2
    assert done.stderr == f"ptestore gc: error: {missing}: no such file or directory\n"
