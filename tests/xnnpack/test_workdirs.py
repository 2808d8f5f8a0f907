"""Work directories a killed maker leaves: collected by the next one (no runtime).

``remove_abandoned``: the next ``make_cache`` in a directory removes the
``.xnnpack-<id>.*`` work directories of every identity whose lock is free (the real
make is pinned in ``test_xnnpack_cache.py``). ``held_work_dir``: the fleet's scratch
directories under ``<tmp>/ptestore-xnnpack-<uid>/``, removed when the run ends and, when
a run was killed, by the next one.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support.xnnpack_probe import env

from ptestore.xnnpack.workdirs import held_work_dir, remove_abandoned

A, B, C, OWN = ("xnnpack-" + c * 32 for c in "abcd")


def hold(lock: Path) -> int:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_work_dirs_of_identities_whose_lock_is_free_are_removed(tmp_path: Path) -> None:
    for name in (A, B, C, OWN):
        (tmp_path / f".{name}.k1").mkdir()
        (tmp_path / f".{name}.k1" / "packed.xpwc").write_bytes(b"x" * 100)
    (tmp_path / f"{A}.xpwc.lock").touch()  # a killed maker's: its lock is free
    held = hold(tmp_path / f"{B}.xpwc.lock")  # a live maker's
    # C: no lock file (nothing tells it from a live one); OWN: the caller's own
    (tmp_path / f"{OWN}.xpwc.lock").touch()
    (tmp_path / ".xnnpack-notahash.k1").mkdir()
    try:
        assert remove_abandoned(tmp_path, OWN) == [f".{A}.k1"]
    finally:
        os.close(held)
    kept = {p.name for p in tmp_path.iterdir() if p.is_dir()}
    assert kept == {".xnnpack-notahash.k1", f".{B}.k1", f".{C}.k1", f".{OWN}.k1"}


KILLED = textwrap.dedent(
    """
    import sys, tempfile
    tempfile.tempdir = sys.argv[1]
    from ptestore.xnnpack.workdirs import held_work_dir
    with held_work_dir() as work:
        open(work + "/model.pte", "wb").write(b"x" * 1000)
        print(work, flush=True)
        sys.stdin.read()  # until killed
    """
)


def test_a_killed_runs_scratch_directory_is_collected_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = tmp_path / f"ptestore-xnnpack-{os.geteuid()}"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert child.stdout is not None
    killed = Path(child.stdout.readline().strip())
    assert killed.parent == base and (killed / "model.pte").exists()
    with held_work_dir() as live:  # while the child lives, its directory stays
        assert killed.exists() and Path(live).parent == base
        assert oct(base.stat().st_mode & 0o777) == "0o700"
    child.send_signal(signal.SIGKILL)  # the OOM killer
    child.wait()
    assert not Path(live).exists() and not Path(live + ".lock").exists()
    (base / "orphan").mkdir()  # a directory with no lock file: its run is gone
    with held_work_dir() as work:
        assert sorted(os.listdir(base)) == sorted([Path(work).name, Path(work).name + ".lock"])
    assert os.listdir(base) == []


def test_a_base_that_is_not_this_users_own_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / f"ptestore-xnnpack-{os.geteuid()}").symlink_to(tmp_path / "elsewhere")
    with held_work_dir() as work:
        assert Path(work).parent == tmp_path and Path(work).name.startswith("ptestore-xnnpack-")
    assert not Path(work).exists() and os.listdir(tmp_path / "elsewhere") == []
