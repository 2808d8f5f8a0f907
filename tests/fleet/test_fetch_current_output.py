"""``ptestore fetch`` whose files are published or already current but whose output
cannot be written (stdout full or closed): only a file this call published is said to
be. It said "failed after publishing DEST" for a DEST that was already current (left as
it was, nothing published), also with ``--json``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.cli_process import ptestore_process
from support.fleet_backend import specialized_pair

import ptestore


def _fetch(*argv: str, shell: str) -> subprocess.CompletedProcess[str]:
    return ptestore_process("fetch", *argv, shell=shell)


def _shells() -> dict[str, str]:
    shells = {">&-": "stdout is closed"}
    if os.path.exists("/dev/full"):
        shells[">/dev/full"] = "No space left on device"
    return shells


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_what_a_fetch_published_and_only_that_is_said(tmp_path: Path, json_flag: list[str]) -> None:
    pte, _ = specialized_pair(tmp_path, "a", 2.0)
    dest = tmp_path / "dev" / "m.pte"
    ptd_dest = dest.with_suffix(".ptd")
    ptestore.fetch(pte, dest)
    inodes = dest.stat().st_ino, ptd_dest.stat().st_ino
    argv = [str(pte), str(dest), *json_flag]
    for shell, why in _shells().items():
        # both current: nothing published
        done = _fetch(*argv, shell=shell)
        assert (done.returncode, done.stderr) == (
            1,
            f"ptestore fetch: failed, nothing published: cannot write the output on stdout: "
            f"{why}\n",
        ), shell
        assert (dest.stat().st_ino, ptd_dest.stat().st_ino) == inodes
        # the .pte replaced, its .ptd current: the .pte alone was published
        dest.write_bytes(b"not it")
        done = _fetch(*argv, shell=shell)
        assert (done.returncode, done.stderr) == (
            1,
            f"ptestore fetch: failed after publishing {dest}: cannot write the output on "
            f"stdout: {why}\n",
        ), shell
        assert dest.read_bytes() == pte.read_bytes() and ptd_dest.stat().st_ino == inodes[1]
        inodes = dest.stat().st_ino, inodes[1]
