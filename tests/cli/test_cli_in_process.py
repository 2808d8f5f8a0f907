"""``ptestore.cli.main`` called by a process that goes on (an application, a test
harness) leaves its state as it found it: the ``ptestore`` logger's level after ``-v``
(it was reset to NOTSET), and ``sys.path`` (the working directory was put first on it
for good: a later ``import`` found a module of that directory before the standard
library's)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None


def test_the_loggers_level_is_put_back_after_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("ptestore")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        assert main(["inspect", str(MLP.pte_path), "--json", "-v"]) == 0
        assert logger.level == logging.ERROR
        assert main(["inspect", str(MLP.pte_path), "--json", "--debug"]) == 0
        assert logger.level == logging.ERROR
        assert not [h for h in logger.handlers if type(h).__name__ == "Verbose"]
    finally:
        logger.setLevel(before)
    capsys.readouterr()


def test_the_working_directory_is_on_sys_path_for_the_command_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = [p for p in sys.path if p not in ("", str(tmp_path))]
    monkeypatch.setattr(sys, "path", list(path))
    assert main(["inspect", str(MLP.pte_path), "--json"]) == 0
    assert sys.path == path
    capsys.readouterr()


def test_commands_of_two_threads_ending_out_of_order_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads' commands (A started first, ended first): while B runs alone its
    name is the current command, and once both ended none is (the first to start put
    back what it found when it ended: B's end restored A's name for good), with the
    working directory off ``sys.path`` only then (A's end took it from B)."""
    from ptestore import _log
    from ptestore.cli import _path_given_back, _path_taken

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    a = _log.command_started("ensure")
    path_a = _path_taken(str(tmp_path))
    b = _log.command_started("select")
    path_b = _path_taken(str(tmp_path))
    assert _log.COMMAND == "select" and sys.path[0] == str(tmp_path)
    _log.command_ended(a)
    _path_given_back(path_a)
    assert _log.COMMAND == "select" and sys.path[0] == str(tmp_path)  # B still runs
    _log.command_ended(b)
    _path_given_back(path_b)
    assert _log.COMMAND is None and str(tmp_path) not in sys.path


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_child_forked_while_another_thread_starts_a_command_can_run_one() -> None:
    """A process forked while another of its threads held the commands' locks (a command
    starting or ending there: ``_log``'s and the working directory's) runs a command of
    its own: the child's locks are new (they were the parent's, held for ever)."""
    from support.locks import child_forked_under_them_takes

    from ptestore import _log, cli

    assert child_forked_under_them_takes(lambda: [_log._LOCK, cli._PATH_LOCK])
