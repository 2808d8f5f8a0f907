"""The in-place journal's name: a journal ending in ``COMMIT_V2`` is written as
``.NAME.ptestore-jrnl2``, a name a ptestore older than that record never looks at (it
took the record for no commit and deleted the journal of a torn file: the model lost).
Today's recover finds both names; both there, neither is applied nor removed; a torn
file with no journal at all is said to be lost, not sent to ``recover``; a model name
of 239 bytes still has its journal (the older name allowed 237)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
import ptestore.coordinator.inplace_commit as commit_module
from ptestore.errors import FormatError, StorageError
from ptestore.journal import CHANGING, COMMIT_RECORD, COMMIT_V2, journal_path

FX = get_fixture("mlp_xnnpack")
SPEC = "support.doubling_backend:Doubling=mlp_xnnpack"


def journal_paths(path: Path) -> tuple[str, str]:
    """Today's name of the journal of ``path``, and the name the versions before used."""
    return (
        str(path.with_name(f".{path.name}.ptestore-jrnl2")),
        str(path.with_name(f".{path.name}.ptestore-journal")),
    )


def _copy(tmp_path: Path, name: str) -> Path:
    assert FX.pte_path is not None
    dst = tmp_path / name
    shutil.copyfile(FX.pte_path, dst)
    return dst


def _staged(tmp_path: Path) -> bytes:
    out = tmp_path / "staged" / "out.pte"
    out.parent.mkdir()
    ptestore.specialize(FX.pte_path, out, backends=[SPEC], provenance=False)
    return out.read_bytes()


def _torn(tmp_path: Path, name: str = "torn.pte") -> Path:
    """A copy whose in-place run was killed right after it marked the file (step 1 of
    the apply): ``PTJ~`` in place of its identifier, its journal committed."""
    torn = _copy(tmp_path, name)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: killed after the journal's commit
        try:
            import ptestore.coordinator.inplace as inplace

            def marked_then_killed(target: str, journal: str, plan: dict[str, Any]) -> None:
                fd = os.open(target, os.O_WRONLY)
                os.pwrite(fd, CHANGING, 4)
                os.fsync(fd)
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
                commit_module.apply_journal(target, journal, plan)

            inplace.apply_uninterrupted = marked_then_killed  # type: ignore[assignment]
            ptestore.specialize(torn, torn, backends=[SPEC], in_place=True, provenance=False)
        finally:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert torn.read_bytes()[4:8] == CHANGING
    return torn


def test_a_run_writes_its_journal_under_the_new_name(tmp_path: Path) -> None:
    torn = _torn(tmp_path)
    new, old = (Path(p) for p in journal_paths(torn))
    assert new.name == ".torn.pte.ptestore-jrnl2" and str(new) == journal_path(str(torn))
    assert old.name == ".torn.pte.ptestore-journal"
    # What an older ptestore looks for is not there: it cannot take the new commit
    # record for none and delete the journal; it refuses the marked file instead.
    assert not old.exists()
    assert new.read_bytes()[-COMMIT_RECORD.size :][:16] == COMMIT_V2
    assert ptestore.recover(torn) == "rolled forward"
    assert torn.read_bytes() == _staged(tmp_path) and not new.exists()


@pytest.mark.parametrize("how", ["recover", "verify", "describe"])
def test_a_journal_under_the_older_name_is_still_recovered(tmp_path: Path, how: str) -> None:
    """Versions before wrote ``COMMIT_V2`` journals under the older name: applied."""
    torn = _torn(tmp_path)
    new, old = journal_paths(torn)
    os.rename(new, old)
    if how == "recover":
        assert ptestore.recover(torn) == "rolled forward"
    elif how == "verify":
        ptestore.verify(torn)
    else:
        ptestore.describe(torn)
    assert torn.read_bytes() == _staged(tmp_path)
    assert not os.path.lexists(old) and not os.path.lexists(new)


def test_both_names_there_are_refused_untouched(tmp_path: Path) -> None:
    torn = _torn(tmp_path)
    new, old = journal_paths(torn)
    shutil.copyfile(new, old)
    before = torn.read_bytes()
    expected = (
        f"{torn}: two in-place journals are beside it, {new} and {old} (the latter of an "
        "older ptestore); neither is applied nor removed, and the file is left as it is. "
        "Keep the one of the run that was interrupted last, remove the other, and recover "
        "again; if the file's identifier is PTJ~ and neither completes it, restore the "
        "model from its portable source"
    )
    for call in (ptestore.recover, ptestore.verify, ptestore.describe):
        with pytest.raises(StorageError) as err:
            call(torn)
        assert str(err.value) == expected
    with pytest.raises(StorageError) as err:
        ptestore.specialize(torn, torn, backends=[SPEC], in_place=True, provenance=False)
    assert str(err.value) == expected
    assert torn.read_bytes() == before
    assert os.path.exists(new) and os.path.exists(old)
    os.unlink(old)  # the user keeps one: recovered
    assert ptestore.recover(torn) == "rolled forward"
    assert torn.read_bytes() == _staged(tmp_path)


GONE = (
    "(marked as being changed in place: an in-place run was interrupted while it rewrote "
    "the file. If a journal is beside this name (.NAME.ptestore-jrnl2, or "
    ".NAME.ptestore-journal of an older ptestore), `ptestore inspect` of this name "
    "completes the file from it; if the run used another name of this file (a hard "
    "link), `ptestore inspect` of that name does; if no journal is beside either name, "
    "restore the model from its portable source (a new copy of the original .pte))"
)


def test_a_marked_file_without_any_journal_is_said_to_be_lost(tmp_path: Path) -> None:
    torn = _torn(tmp_path)
    os.unlink(journal_paths(torn)[0])
    assert ptestore.recover(torn) is None  # nothing to complete it with
    expected = (
        f"{torn}: file identifier (bytes 4..8) = b'PTJ~': must be b'ET12' (.pte "
        f"Program) or b'FT01' (.ptd FlatTensor) {GONE}"
    )
    assert "recover" not in expected
    report = ptestore.verify(torn)
    assert (report.status, report.error) == ("invalid", expected)
    with pytest.raises(FormatError) as err:
        ptestore.describe(torn)
    assert str(err.value) == expected


@pytest.mark.parametrize("size", [237, 239])
def test_a_long_model_name_has_its_journal(tmp_path: Path, size: int) -> None:
    """NAME_MAX is 255 bytes: ``.NAME.ptestore-jrnl2`` fits a 239-byte name (the
    older ``.NAME.ptestore-journal`` fitted 237), and its torn file is recovered."""
    name = "m" * (size - 4) + ".pte"
    torn = _torn(tmp_path, name)
    assert len(os.path.basename(journal_path(str(torn))).encode()) <= 255
    assert ptestore.recover(torn) == "rolled forward"
    assert torn.read_bytes() == _staged(tmp_path)
