"""``storage.regular.open_regular``: the one way ptestore opens a file of its own that
must be a regular file (a journal, a cache manifest, a packed-weight record)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptestore.storage.regular import NotRegular, open_regular


def test_a_regular_file_is_opened_with_its_stat(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd, st = open_regular(path)
    try:
        assert os.read(fd, 10) == b"abc" and st.st_size == 3
    finally:
        os.close(fd)


def test_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(NotRegular) as err:
        open_regular(tmp_path / "link")
    assert (err.value.link, err.value.kind) == (True, "a symbolic link")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotRegular) as err:  # a blocking open would wait for a writer
        open_regular(tmp_path / "fifo")
    assert not err.value.link and err.value.kind.startswith("p")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegular) as err:
        open_regular(tmp_path)
    assert err.value.kind.startswith("d")


def test_nothing_there_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent")


def test_nothing_is_left_open(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(NotRegular):
            open_regular(tmp_path / "fifo")
    assert len(os.listdir("/proc/self/fd")) == before
