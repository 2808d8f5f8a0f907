"""``ptestore ensure`` and ``ptestore cache ls|prune|clear``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.cli_process import ptestore_process
from support.fixtures import get_fixture

from ptestore.cli import main

SPEC = "support.counting_backend:Counting=1.0"


def _src(tmp_path: Path, name: str = "model.pte") -> Path:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    dst = tmp_path / name
    shutil.copyfile(fx.pte_path, dst)
    return dst


def test_ensure_prints_the_path_then_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, cache = _src(tmp_path), tmp_path / "cache"
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", SPEC]
    argv += ["--device", "phone", "--device-option", "scale=2", "--device-option", "soc=x"]
    assert main(argv) == 0
    path = capsys.readouterr().out.strip()
    assert Path(path).is_file() and path.startswith(str(cache / "entries"))
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pte"] == path and out["created"] is False and out["ptd"] is None
    assert out["provenance"]["device"]["name"] == "phone"
    assert out["provenance"]["requested"] == [{"spec": SPEC, "version": "1.0"}]


def test_ensure_with_a_ptd_prints_both_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    cache = tmp_path / "cache"
    argv = ["ensure", str(fx.pte_path), "--ptd", str(fx.ptd_path), "--cache-dir", str(cache)]
    assert main([*argv, "--backend", SPEC]) == 0
    pte, ptd = capsys.readouterr().out.split()
    assert pte.endswith("/model.pte") and ptd.endswith("/model.ptd")
    assert Path(ptd).read_bytes()[4:8] == Path(fx.ptd_path).read_bytes()[4:8]


def test_cache_ls_prune_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    for name in ("a.pte", "b.pte"):
        assert main(["ensure", str(_src(tmp_path, name)), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[-1].startswith("2 entries, ")
    assert all(" ready " in ln for ln in lines[:2])
    assert lines[0].endswith("b.pte") and lines[1].endswith("a.pte")  # most recent first
    assert main(["cache", "ls", "--cache-dir", str(cache), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [Path(e["source"]).name for e in listed["entries"]] == ["b.pte", "a.pte"]
    one = listed["entries"][0]["bytes"]
    assert main(["cache", "prune", "--cache-dir", str(cache), "--max-bytes", str(one)]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entries (")
    assert main(["cache", "clear", "--cache-dir", str(cache), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["removed"] == [listed["entries"][0]["key"]] and done["remaining"] == 0


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["cache", "ls", "--cache-dir", "{tmp}/none"],
            2,
            "ptestore cache: error: {tmp}/none: no such cache directory",
        ),
        (
            ["ensure", "{tmp}/m.pte", "--cache-dir", "{tmp}/c", "--device-option", "a=1"],
            2,
            "ptestore ensure: error: --device-option needs --device NAME",
        ),
        (
            ["ensure", "{tmp}/missing.pte", "--cache-dir", "{tmp}/c"],
            2,
            "ptestore ensure: error: {tmp}/missing.pte: no such file",
        ),
    ],
)
def test_cli_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    _src(tmp_path, "m.pte")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == code
    assert capsys.readouterr().err.splitlines()[0] == message.replace("{tmp}", str(tmp_path))


def test_cache_dir_as_a_file_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cache-dir file:///x`` is the directory ``/x`` (not a path under the current
    directory); a URL of another scheme is no cache directory."""
    src, cache = _src(tmp_path), tmp_path / "cache"
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", SPEC]
    assert main([*argv, "--device", "phone", "--device-option", "scale=2"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "cache")
    assert main(["cache", "ls", "--cache-dir", f"file://{cache}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("1 entries, ") and lines[0].endswith("model.pte")
    assert main(["cache", "ls", "--cache-dir", "memory://cache"]) == 2
    assert capsys.readouterr().err == (
        "ptestore cache: error: memory://cache: no such cache directory\n"
    )


def test_max_bytes_takes_units_and_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    from ptestore.cli.ensure import parse_size

    assert parse_size("4096") == 4096 and parse_size("2G") == 2 << 30
    assert parse_size("512KiB") == 512 << 10
    with pytest.raises(SystemExit) as exc:
        main(["ensure", "m.pte", "--cache-dir", "c", "--max-bytes", "lots"])
    assert exc.value.code == 2
    assert "expected a size in bytes such as 1048576, 512K, 64M or 2G, got 'lots'" in (
        capsys.readouterr().err
    )


def test_ensure_no_provenance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, cache = _src(tmp_path), tmp_path / "cache"
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", SPEC, "--json"]
    assert main(argv) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["provenance"]["requested"] == [{"spec": SPEC, "version": "1.0"}]
    assert main([*argv, "--no-provenance"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["provenance"] is None and bare["created"] is True and bare["key"] != made["key"]
    assert Path(bare["pte"]).read_bytes().count(b"PTSTPROV") == 0
    assert Path(made["pte"]).read_bytes().count(b"PTSTPROV") == 1


def _cache_cli(cache: Path, *argv: str, shell: str = "", stdout: Any = subprocess.PIPE) -> Any:
    """``ptestore cache ARGV --cache-dir CACHE`` in a fresh process, stdout redirected by
    ``sh`` (``shell``: ``>/dev/full``, ``>&-``) or given."""
    return ptestore_process("cache", *argv, "--cache-dir", str(cache), shell=shell, stdout=stdout)


@pytest.mark.parametrize(
    "argv",
    [["ls"], ["ls", "--json"], ["prune"], ["prune", "--stale"], ["prune", "--stale", "--json"],
     ["prune", "--stale", "--dry-run"], ["clear", "--json"]],
)  # fmt: skip
def test_cache_output_to_a_full_closed_or_gone_stdout(tmp_path: Path, argv: list[str]) -> None:
    """Through cli/output.py as every command (was print/json.dump: a traceback)."""
    cache = tmp_path / "cache"
    assert main(["ensure", str(_src(tmp_path)), "--cache-dir", str(cache)]) == 0
    if os.path.exists("/dev/full"):
        done = _cache_cli(cache, *argv, shell=">/dev/full")
        assert (done.returncode, done.stderr) == (
            1,
            "ptestore cache: error: cannot write the output on stdout: No space left on device\n",
        )
    done = _cache_cli(cache, *argv, shell=">&-")
    assert (done.returncode, done.stderr) == (
        1,
        "ptestore cache: error: cannot write the output on stdout: stdout is closed\n",
    )
    read, write = os.pipe()
    os.close(read)  # the reader gone: the command's own status, nothing said
    try:
        done = _cache_cli(cache, *argv, stdout=write)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
