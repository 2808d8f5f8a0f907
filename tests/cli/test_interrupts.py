"""Ctrl-C and errors around publishing, through ``specialize`` and the CLI (issue 13,
item 4): once a publish may have taken effect, the message never says that nothing was
published."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.cli import main
from ptestore.errors import PartialPublish
from ptestore.writers import DataWriter

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")


def interrupt_before_commit_of(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    """KeyboardInterrupt at the commit point of the writer whose URL ends in ``suffix``."""
    real = DataWriter._commit_point

    def commit_point(self: DataWriter) -> None:
        if self.url.endswith(suffix):
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(DataWriter, "_commit_point", commit_point)


def test_interrupt_of_the_pte_publish_after_the_ptd_is_a_partial_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    out_pte, out_ptd = tmp_path / "out.pte", tmp_path / "out.ptd"
    interrupt_before_commit_of(monkeypatch, ".pte")
    with pytest.raises(PartialPublish) as info:
        ptestore.specialize(
            EXT.pte_path, out_pte, ptd=(EXT.ptd_path, out_ptd), backends=["passthrough"]
        )
    assert str(info.value).startswith(f"{out_ptd} was published, but publishing {out_pte} failed: ")
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert out_ptd.exists() and not out_pte.exists()


def test_cli_interrupt_before_any_commit_says_nothing_was_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MLP.pte_path is not None
    out = tmp_path / "out.pte"
    interrupt_before_commit_of(monkeypatch, ".pte")
    assert main(["specialize", str(MLP.pte_path), str(out), "--backend", "passthrough"]) == 130
    assert (
        capsys.readouterr().err.strip() == "ptestore specialize: interrupted; nothing was published"
    )
    assert not out.exists()


def test_cli_interrupt_after_the_pipeline_published_names_what_was_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in the coordinator's clean-up after the publish."""
    from ptestore.coordinator import pipeline

    assert MLP.pte_path is not None
    out = tmp_path / "out.pte"

    def close(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.Spool, "close", close)
    assert main(["specialize", str(MLP.pte_path), str(out), "--backend", "passthrough"]) == 130
    assert (
        capsys.readouterr().err.strip()
        == f"ptestore specialize: interrupted after {out} was published"
    )
    assert out.exists()


def test_cli_interrupt_while_printing_the_report_names_what_was_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore.cli import specialize as cli_specialize

    assert EXT.pte_path is not None and EXT.ptd_path is not None
    out_pte, out_ptd = tmp_path / "out.pte", tmp_path / "out.ptd"

    def summary(report: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_specialize, "format_summary", summary)
    argv = ["specialize", str(EXT.pte_path), str(out_pte), "--backend", "passthrough"]
    argv += ["--ptd", str(EXT.ptd_path), str(out_ptd)]
    assert main(argv) == 130
    assert capsys.readouterr().err.strip() == (
        f"ptestore specialize: interrupted after {out_ptd} and {out_pte} was published"
    )


def test_cli_reports_an_uncertain_publish_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MLP.pte_path is not None
    out = tmp_path / "out.pte"
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["specialize", str(MLP.pte_path), str(out), "--backend", "passthrough"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "ptestore specialize: publish uncertain (it may or may not have taken effect): "
        f"{out}: published, but fsync of directory "
    )
    assert "nothing published" not in err
    assert out.exists()


def test_cli_json_error_of_an_interrupt_says_what_stderr_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json``'s error ``message`` is the line stderr shows, without the command's
    name (it was the exception's type alone: "KeyboardInterrupt", "Terminated")."""
    import json

    from ptestore.coordinator import pipeline

    assert MLP.pte_path is not None
    out = tmp_path / "out.pte"

    def close(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.Spool, "close", close)
    argv = ["specialize", str(MLP.pte_path), str(out), "--backend", "passthrough", "--json"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    err = json.loads(captured.out)["error"]
    assert err["message"] == f"interrupted after {out} was published"
    assert captured.err.strip() == f"ptestore specialize: {err['message']}"
