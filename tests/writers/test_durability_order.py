"""Durability checked by order: the system calls of a local publish, recorded.

``os`` functions are wrapped (the writer calls them through the ``os`` module) and every
call is logged with the file it touched. The promise of docs/storage.md is, in this
order: the data written into the staging file, the staging file fsynced, renamed (or
linked) over the destination, the destination's directory fsynced. A writer that skips
either fsync, fsyncs before the last write, or fsyncs the directory before the rename
fails here (issue 12).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from examples.double_first_weight import DoubleFirstWeight
from ptestore.storage.loaders import LocalFileLoader
from ptestore.writers import LocalFileWriter

MLP = get_fixture("mlp_xnnpack")


class Recorder:
    """Logs ``(call, what)`` for the os functions a durable publish relies on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.directory = str(directory)
        self.calls: list[tuple[str, str]] = []
        self.fds: dict[int, str] = {}
        real_open, real_close = os.open, os.close
        real_pwrite, real_fsync = os.pwrite, os.fsync
        real_replace, real_link = os.replace, os.link

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            fd = real_open(path, flags, *args, **kwargs)
            self.fds[fd] = os.path.abspath(os.fspath(path))
            return fd

        def close(fd: int) -> None:
            self.fds.pop(fd, None)
            real_close(fd)

        def pwrite(fd: int, data: Any, offset: int) -> int:
            self.calls.append(("write", self.name(fd)))
            return real_pwrite(fd, data, offset)

        def fsync(fd: int) -> None:
            self.calls.append(("fsync", self.name(fd)))
            real_fsync(fd)

        def replace(src: Any, dst: Any, **kwargs: Any) -> None:
            self.calls.append(("rename", f"{self.short(src)} -> {self.short(dst)}"))
            real_replace(src, dst, **kwargs)

        def link(src: Any, dst: Any, **kwargs: Any) -> None:
            self.calls.append(("link", f"{self.short(src)} -> {self.short(dst)}"))
            real_link(src, dst, **kwargs)

        for name, fn in [
            ("open", open_),
            ("close", close),
            ("pwrite", pwrite),
            ("fsync", fsync),
            ("replace", replace),
            ("link", link),
        ]:
            monkeypatch.setattr(os, name, fn)
        if hasattr(os, "copy_file_range"):
            real_cfr = os.copy_file_range

            def copy_file_range(src: int, dst: int, count: int, *args: Any) -> int:
                self.calls.append(("write", self.name(dst)))
                return real_cfr(src, dst, count, *args)

            monkeypatch.setattr(os, "copy_file_range", copy_file_range)

    def short(self, path: Any) -> str:
        p = os.path.abspath(os.fspath(path))
        if p == self.directory:
            return "<dir>"
        name = os.path.basename(p)
        return "<staging>" if ".ptestore-" in name else name

    def name(self, fd: int) -> str:
        path = self.fds.get(fd)
        if path is None:
            try:
                mode = os.fstat(fd).st_mode
            except OSError:
                return f"<fd {fd}>"
            return "<dir?>" if stat.S_ISDIR(mode) else f"<fd {fd}>"
        return self.short(path)

    def squeezed(self) -> list[tuple[str, str]]:
        """Consecutive identical calls folded into one."""
        out: list[tuple[str, str]] = []
        for c in self.calls:
            if not out or out[-1] != c:
                out.append(c)
        return out


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    return Recorder(monkeypatch, tmp_path)


def expected(commit: str, dest: str) -> list[tuple[str, str]]:
    return [
        ("write", "<staging>"),
        ("fsync", "<staging>"),
        (commit, f"<staging> -> {dest}"),
        ("fsync", "<dir>"),
    ]


@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_local_publish_orders_data_fsync_rename_directory_fsync(
    tmp_path: Path, recorder: Recorder, mode: str
) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(300_000))
    w = LocalFileWriter(tmp_path / "m.pte")
    w.write(b"x" * 1000, 0)
    with LocalFileLoader(src) as loader:
        w.copy_from(loader, 0, 300_000, 1000)
    w.write(b"header", 0)
    w.publish(mode)  # type: ignore[arg-type]
    assert recorder.squeezed() == expected("rename" if mode == "overwrite" else "link", "m.pte")


def test_not_durable_fsyncs_nothing(tmp_path: Path, recorder: Recorder) -> None:
    w = LocalFileWriter(tmp_path / "m.pte", durable=False)
    w.write(b"x", 0)
    w.publish()
    assert recorder.squeezed() == [("write", "<staging>"), ("rename", "<staging> -> m.pte")]


def test_in_place_specialize_orders_data_fsync_rename_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``specialize m.pte m.pte``: the source replaced by the new file, durably (a
    replacement, since a run that changes nothing rewrites nothing in place)."""
    assert MLP.pte_path is not None
    model = tmp_path / "m.pte"
    shutil.copy(MLP.pte_path, model)
    recorder = Recorder(monkeypatch, tmp_path)
    ptestore.specialize(model, model, backends=[DoubleFirstWeight()])
    # Not the reads of the source, nor the replacement spool's writes (an unnamed
    # O_TMPFILE in the destination directory, so it shows as "<dir>").
    calls: list[tuple[str, str]] = []
    for c in recorder.calls:
        if c[1] != "m.pte" and c != ("write", "<dir>") and (not calls or calls[-1] != c):
            calls.append(c)
    assert calls == expected("rename", "m.pte"), recorder.calls
