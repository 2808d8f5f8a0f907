"""``ptestore ensure`` whose hit succeeds but whose output cannot be written (stdout
full or closed): a hit publishes nothing, and the error line says so. It said "failed
after publishing PATH" (the entry's path, there since an earlier call) as for an entry
this call made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.cli_process import ptestore_process
from support.fixtures import get_fixture

from ptestore.cli import main

MLP = get_fixture("mlp_xnnpack")


def _ensure(*argv: str, shell: str) -> subprocess.CompletedProcess[str]:
    return ptestore_process("ensure", *argv, shell=shell)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_hit_to_a_full_or_closed_stdout_says_nothing_was_published(
    tmp_path: Path, json_flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert MLP.pte_path is not None
    cache = tmp_path / "cache"
    argv = [str(MLP.pte_path), "--cache-dir", str(cache), "--backend", "passthrough"]
    assert main(["ensure", *argv]) == 0  # the entry made
    (pte,) = cache.glob("entries/*/model.pte")
    assert capsys.readouterr().out == f"{pte}\n"
    made = pte.stat()
    shells = {">&-": "stdout is closed"}
    if os.path.exists("/dev/full"):
        shells[">/dev/full"] = "No space left on device"
    for shell, why in shells.items():
        done = _ensure(*argv, *json_flag, shell=shell)
        assert (done.returncode, done.stderr) == (
            1,
            f"ptestore ensure: failed, nothing published: cannot write the output on stdout: "
            f"{why}\n",
        ), shell
    assert pte.stat().st_ino == made.st_ino  # the entry as it was: a hit
