"""gc and an index under its prefix that is not a regular file: a symbolic link to an
index is read through (it governs what it names, as ``select`` reads it), a link to
nothing or a FIFO stops the collection (exit 1, kind ``index``), never a silent skip
that lets a parent index govern and remove live artifacts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .test_gc_orphans import TWO, _gc, _job, _run


def _nested(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    """Job A rooted at ``out/``, job B at ``out/b/``, both run; B's index moved out of
    the prefix and linked back: ``(out, B's job file, B's artifact)``."""
    out = tmp_path / "out"
    _run(_job(tmp_path / "a.toml", str(out), TWO), capsys)
    b = _job(tmp_path / "b.toml", str(out / "b"), TWO)
    _run(b, capsys)
    keep = tmp_path / "keep"
    keep.mkdir()
    index = out / "b" / "ptestore-index.json"
    index.rename(keep / index.name)
    index.symlink_to(keep / index.name)
    artifact = out / "b" / "d0" / "mlp.pte"
    assert artifact.is_file()
    return out, b, artifact


def test_an_index_linked_under_the_prefix_is_read_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, b, artifact = _nested(tmp_path, capsys)
    for argv in (["--job", str(b)], [str(out)]):
        report = _gc([*argv, "--grace", "0s"], capsys)
        assert [e for e in report["entries"] if "mlp.pte" in e["location"]] == []
        assert artifact.is_file()  # B's index names it: kept


def test_an_index_linked_to_nothing_or_a_fifo_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, b, artifact = _nested(tmp_path, capsys)
    index = out / "b" / "ptestore-index.json"
    (tmp_path / "keep" / index.name).unlink()  # the link now names nothing
    report = _gc(["--job", str(b), "--grace", "0s"], capsys, code=1)
    [entry] = report["entries"]
    assert (entry["location"], entry["kind"], entry["action"]) == (
        str(index),
        "index",
        f"failed: {index}: cannot read the index: a symbolic link to nothing",
    )
    assert artifact.is_file()
    index.unlink()
    os.mkfifo(index)
    report = _gc([str(out), "--grace", "0s"], capsys, code=1)
    [entry] = report["entries"]
    assert (entry["kind"], entry["action"]) == (
        "index",
        f"failed: {index}: cannot read the index: {index}: is a FIFO (named pipe), not a "
        "regular file; refusing to read it",
    )
    assert artifact.is_file()


@pytest.mark.parametrize("odd", ["directory", "link to a directory"])
def test_an_index_name_that_is_a_directory_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], odd: str
) -> None:
    out, b, artifact = _nested(tmp_path, capsys)
    index = out / "b" / "ptestore-index.json"
    index.unlink()
    if odd == "directory":
        index.mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        index.symlink_to(tmp_path / "elsewhere")
    for argv in (["--job", str(b)], [str(out)]):
        report = _gc([*argv, "--grace", "0s"], capsys, code=1)
        [entry] = report["entries"]
        assert (entry["kind"], entry["action"]) == (
            "index",
            f"failed: {index}: cannot read the index: {index}: is a directory, not a regular "
            "file; refusing to read it",
        )
    assert artifact.is_file()
