"""Inputs that are not regular files are refused up front, by name and kind (issue 13,
item 8): FIFOs (which must never block), sockets, directories, symlink loops and
devices. From the CLI that is exit status 2, with nothing published."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.errors import ConfigurationError
from ptestore.storage.loaders import LocalFileLoader, open_loader

MLP = get_fixture("mlp_xnnpack")


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[dict[str, tuple[Path, str]]]:
    fifo = tmp_path / "fifo.pte"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.pte"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    loop = tmp_path / "loop.pte"
    os.symlink(loop, loop)
    directory = tmp_path / "dir.pte"
    directory.mkdir()
    try:
        yield {
            "fifo": (fifo, "a FIFO (named pipe)"),
            "socket": (sock_path, "a socket"),
            "loop": (loop, "a symbolic link loop"),
            "directory": (directory, "a directory"),
            "device": (Path("/dev/null"), "a character device"),
        }
    finally:
        sock.close()


KINDS = ["fifo", "socket", "loop", "directory", "device"]


def message(path: Path, what: str) -> str:
    return f"{path}: is {what}, not a regular file; refusing to read it"


@pytest.mark.parametrize("kind", KINDS)
def test_loader_refuses_what_is_not_a_regular_file(
    specials: dict[str, tuple[Path, str]], kind: str
) -> None:
    path, what = specials[kind]
    for opener in (LocalFileLoader, open_loader, lambda p: open_loader(f"file://{p}")):
        with pytest.raises(ConfigurationError) as info:
            opener(path)
        assert str(info.value) == message(path, what)


def test_specialize_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    """In a child with a deadline: the old loader blocked forever in open()."""
    fifo = tmp_path / "in.pte"
    os.mkfifo(fifo)
    code = (
        "import sys, ptestore\n"
        "from ptestore.errors import ConfigurationError\n"
        "try:\n"
        f"    ptestore.specialize({str(fifo)!r}, {str(tmp_path / 'out.pte')!r}, "
        "backends=['passthrough'])\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout.strip() == message(fifo, "a FIFO (named pipe)")
    assert not (tmp_path / "out.pte").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_cli_exits_2_for_inputs_that_are_not_regular_files(
    specials: dict[str, tuple[Path, str]],
    kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ptestore.cli import main

    path, what = specials[kind]
    out = tmp_path / "out.pte"
    assert main(["specialize", str(path), str(out), "--backend", "passthrough"]) == 2
    assert message(path, what) in capsys.readouterr().err
    assert not out.exists()


def test_a_ptd_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None
    fifo = tmp_path / "w.ptd"
    os.mkfifo(fifo)
    with pytest.raises(ConfigurationError, match=r"w.ptd: is a FIFO \(named pipe\), not a"):
        ptestore.specialize(
            fx.pte_path,
            tmp_path / "out.pte",
            ptd=(fifo, tmp_path / "out.ptd"),
            backends=["passthrough"],
        )
    assert not (tmp_path / "out.pte").exists()


def test_a_regular_file_through_a_symlink_is_fine(tmp_path: Path) -> None:
    assert MLP.pte_path is not None
    link = tmp_path / "link.pte"
    link.symlink_to(MLP.pte_path)
    with LocalFileLoader(link) as loader:
        assert loader.size() == MLP.pte_path.stat().st_size
        assert loader.load(0, 8) == MLP.pte_path.read_bytes()[:8]
