"""Ctrl-C (or SIGTERM's Terminated) right after a local file is opened, before the
object that owns the descriptor is whole: nothing stays open and nothing stays on disk
(a local writer's flocked staging file was left for gc to skip as live; a loader's
descriptor leaked for the process's life, pinning an evicted cache entry's file)."""

from __future__ import annotations

import fcntl
import gc
import os
from pathlib import Path
from typing import Any

import pytest

from ptestore._signals import Terminated
from ptestore.storage import loaders
from ptestore.storage.loaders import LocalFileLoader
from ptestore.writers import local
from ptestore.writers.local import TEMP_NAME_RE, LocalFileWriter


def _open_fds(under: Path) -> list[str]:
    """The files under ``under`` this process has open (a descriptor another thread of
    the test process opens or closes meanwhile is not this test's: the whole table
    compared failed in a full run)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, too)
        if target.startswith(f"{under}/") or target == str(under):
            out.append(target)
    return sorted(out)


def _leftovers(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if TEMP_NAME_RE.match(n))


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), Terminated(15)])
def test_writer_interrupted_after_locking_its_staging_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: BaseException
) -> None:
    real = fcntl.flock

    def lock_then_interrupt(fd: int, op: int) -> None:
        real(fd, op)
        raise interrupt

    before = _open_fds(tmp_path)
    monkeypatch.setattr(local.fcntl, "flock", lock_then_interrupt)
    with pytest.raises(type(interrupt)):
        LocalFileWriter(tmp_path / "out.pte")
    monkeypatch.undo()
    gc.collect()
    assert _leftovers(tmp_path) == []
    assert os.listdir(tmp_path) == []
    assert _open_fds(tmp_path) == before


def test_writer_interrupted_while_tracking_its_staging_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same one step later, with the directories ``auto_mkdir`` made for it."""

    def interrupt(self: Any, staging: Any) -> None:
        raise KeyboardInterrupt

    before = _open_fds(tmp_path)
    monkeypatch.setattr(LocalFileWriter, "_track_staging", interrupt)
    with pytest.raises(KeyboardInterrupt):
        LocalFileWriter(tmp_path / "a" / "b" / "out.pte", auto_mkdir=True)
    monkeypatch.undo()
    gc.collect()
    assert os.listdir(tmp_path) == []
    assert _open_fds(tmp_path) == before
    with LocalFileWriter(tmp_path / "out.pte") as writer:  # the writer still works
        writer.write(b"x", 0)
        writer.publish()
    assert (tmp_path / "out.pte").read_bytes() == b"x"


@pytest.mark.parametrize("step", ["fstat", "set_blocking"])
def test_loader_interrupted_after_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(b"m" * 64)
    real = getattr(os, step)
    seen: list[int] = []

    def interrupt(fd: int, *args: Any) -> Any:
        seen.append(fd)
        raise KeyboardInterrupt

    before = _open_fds(tmp_path)
    monkeypatch.setattr(loaders.os, step, interrupt)
    with pytest.raises(KeyboardInterrupt):
        LocalFileLoader(model)
    monkeypatch.setattr(loaders.os, step, real)
    monkeypatch.undo()
    gc.collect()
    assert len(seen) == 1
    assert _open_fds(tmp_path) == before
    with LocalFileLoader(model) as loader:  # and the file reads as before
        assert loader.load(0, 4) == b"mmmm"
