"""Ctrl-C, SIGTERM and SIGHUP around an in-place run's commit: held from just before the
journal's commit to the end of the apply (an interrupt in between used to stop the run
with "nothing was published" and a committed journal that the next read-only command
applied), and, for ``ensure``, until the rewritten file is recorded in the cache
(without a trailer, the manifest is what tells the next call the file is an output
already: it used to specialize it again, a weight doubled twice).

Each run is a forked child that sends itself the signal at a chosen step (no waits)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.journal import journal_path

FX = get_fixture("mlp_xnnpack")
SPEC = "support.doubling_backend:Doubling=mlp_xnnpack"
assert FX.pte_path is not None


def _staged(tmp_path: Path) -> bytes:
    out = tmp_path / "staged.pte"
    ptestore.specialize(FX.pte_path, out, backends=[SPEC], provenance=False)
    return out.read_bytes()


def _in_child(work: Callable[[], int], err: Path) -> int:
    """``work()`` in a forked child whose stderr goes to ``err``; its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)  # flushed below
            code = work()
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            code = 98
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


def _signal_at_commit(signum: int) -> None:
    """In the child: ``signum`` sent right before the commit's directory ``fsync`` (the
    journal's own ``fsync`` done: its commit record is on disk)."""
    from ptestore.coordinator import journal_writer

    real = journal_writer.sync_directory

    def then_signalled(path: Any) -> None:
        os.kill(os.getpid(), signum)
        real(path)

    journal_writer.sync_directory = then_signalled  # type: ignore[assignment]


def _signal_after_commit(signum: int) -> None:
    """In the child: ``signum`` sent between the commit and the apply (when the run
    reports its write)."""
    from ptestore.coordinator import inplace

    real = inplace.apply_uninterrupted

    def signalled_first(*args: Any) -> None:
        os.kill(os.getpid(), signum)
        real(*args)

    inplace.apply_uninterrupted = signalled_first  # type: ignore[assignment]


@pytest.mark.parametrize("when", ["during the commit", "after the commit"])
@pytest.mark.parametrize(
    ("signum", "by"), [(signal.SIGINT, ""), (signal.SIGTERM, " by SIGTERM")], ids=["C", "TERM"]
)
def test_an_interrupt_from_the_commit_on_completes_the_change_and_says_so(
    tmp_path: Path, when: str, signum: int, by: str
) -> None:
    from ptestore.cli import main

    src, err = tmp_path / "model.pte", tmp_path / "stderr"
    shutil.copyfile(FX.pte_path, src)  # type: ignore[arg-type]

    def run() -> int:
        (_signal_at_commit if when == "during the commit" else _signal_after_commit)(signum)
        argv = ["specialize", str(src), str(src), "--backend", SPEC, "--in-place"]
        return main([*argv, "--no-provenance", "--quiet"])

    assert _in_child(run, err) == 130
    assert err.read_text() == (
        f"ptestore specialize: interrupted{by} while {src} was rewritten in place: the "
        "change was completed first (its journal was committed, so it was applied to the "
        "end): the file is the specialized model, loadable\n"
    )
    assert not Path(journal_path(str(src))).exists()
    assert src.read_bytes() == _staged(tmp_path)


def _calls(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_ensure_without_provenance_records_the_file_before_the_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ensure(in_place=True, provenance=False)`` interrupted while it applies: the file
    is completed and its entry recorded before the KeyboardInterrupt, so the next
    ``ensure`` is a hit (the backend does not run over its own output)."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(calls))
    src, cache, err = tmp_path / "model.pte", tmp_path / "cache", tmp_path / "stderr"
    shutil.copyfile(FX.pte_path, src)  # type: ignore[arg-type]
    want = _staged(tmp_path)
    assert _calls(calls) == 1

    def run() -> int:
        import ptestore.coordinator.inplace_commit as commit_module
        from ptestore.journal import apply_journal

        def interrupted(*args: Any) -> None:  # the signal arrives while it applies
            os.kill(os.getpid(), signal.SIGINT)
            apply_journal(*args)

        commit_module.apply_journal = interrupted  # type: ignore[assignment]
        try:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True, provenance=False)
        except KeyboardInterrupt as exc:
            print(f"KeyboardInterrupt: {exc}", file=sys.stderr)
            return 130
        return 0

    assert _in_child(run, err) == 130
    assert err.read_text() == (
        f"KeyboardInterrupt: while {src} was rewritten in place: the change was completed "
        "first (its journal was committed, so it was applied to the end): the file is the "
        "specialized model, loadable\n"
    )
    assert src.read_bytes() == want and _calls(calls) == 2
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True, provenance=False)
    assert not a.created and a.in_place and a.specialized
    assert _calls(calls) == 2 and src.read_bytes() == want  # not doubled again
