"""An update renamed over a model while it is specialized in place (an app's download
landing with ``os.replace``): the run's plan, made from the file it read, is never
written into the new file at that path, whether the rename lands while the backends run
(refused before the commit), after the commit (refused before any byte is applied, the
journal removed) or between ``recover``'s check and its apply (refused there too)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey

import ptestore
from ptestore.errors import StorageError
from ptestore.journal import journal_path

FX = get_fixture("mlp_xnnpack")
UPDATE = get_fixture("mlp_xnnpack_align4096")
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None
assert UPDATE.pte_path is not None
KEY = FX.doubled.key


class RenamedOver(ReplaceKey):
    """Replaces its key (reversed, ``extra`` bytes longer) after an update was renamed
    over ``target``: what a download landing while the backend runs does."""

    def __init__(self, target: Path, update: Path, extra: int = 0) -> None:
        super().__init__("XnnpackBackend", KEY, extra=extra, alignment=64)
        self.target, self.update = target, update

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        os.replace(self.update, self.target)
        super().initialize_backend_data(context, output)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[Path, Path, Path, bytes, bytes]]:
    """The model, a path to the same file through a descriptor held on it
    (``/proc/self/fd/N``: to see what became of it once the path names the update; not a
    hard link, which in place refuses), the update waiting beside it, and both files'
    bytes."""
    assert FX.pte_path is not None and UPDATE.pte_path is not None
    model, update = tmp_path / "model.pte", tmp_path / ".dl"
    shutil.copyfile(FX.pte_path, model)
    fd = os.open(model, os.O_RDONLY)
    try:
        held = Path(f"/proc/self/fd/{fd}")
        shutil.copyfile(UPDATE.pte_path, update)
        yield model, held, update, model.read_bytes(), update.read_bytes()
    finally:
        os.close(fd)


def _message(model: Path, held: Path, journal: str) -> str:
    st = held.stat()
    return (
        f"{model}: replaced by another file while it was specialized in place (the run "
        f"read device {st.st_dev} inode {st.st_ino}; the path now names device "
        f"{model.stat().st_dev} inode {model.stat().st_ino}); the file now at the path is "
        "left as it is, not specialized, and the file the run read was not changed "
        f"({journal}): specialize it again"
    )


@pytest.mark.parametrize("extra", [0, 8192], ids=["same size", "grown (space reserved)"])
def test_an_update_landing_while_the_backends_run_is_left_alone(
    files: tuple[Path, Path, Path, bytes, bytes], extra: int
) -> None:
    model, held, update, original, new = files
    backend = RenamedOver(model, update, extra)
    with pytest.raises(StorageError) as err:
        ptestore.specialize(model, model, backends=[backend], in_place=True)
    assert str(err.value) == _message(model, held, "its journal discarded")
    # the update whole (a grown plan's reserve, or its release, never cut or grew it)
    assert model.read_bytes() == new
    assert held.read_bytes() == original
    assert not Path(journal_path(str(model))).exists()


def test_an_update_landing_after_the_commit_is_left_alone(
    files: tuple[Path, Path, Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptestore.coordinator import journal_writer

    model, held, update, original, new = files
    commit = journal_writer.commit_journal

    def then_renamed(spool: Any, plan: dict[str, Any]) -> None:
        commit(spool, plan)
        os.replace(update, model)  # the journal is durable: the next step is to apply it

    monkeypatch.setattr(journal_writer, "commit_journal", then_renamed)
    backend = ReplaceKey("XnnpackBackend", KEY)
    with pytest.raises(StorageError) as err:
        ptestore.specialize(model, model, backends=[backend], in_place=True)
    assert str(err.value) == _message(model, held, "its journal removed")
    assert model.read_bytes() == new and held.read_bytes() == original
    assert not Path(journal_path(str(model))).exists()
    # the update is a portable model still: it specializes in place as any other
    monkeypatch.undo()
    backend = ReplaceKey("XnnpackBackend", KEY)
    again = ptestore.specialize(model, model, backends=[backend], in_place=True)
    assert again.specialized and not Path(journal_path(str(model))).exists()


def test_recover_never_applies_to_a_file_renamed_over_after_its_check(
    files: tuple[Path, Path, Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply checks the file it opened against the journal's binding itself: a rename
    between recover's checks of the path (the binding, the payload) and its apply is
    refused as well."""
    from ptestore import journal
    from ptestore.coordinator import inplace

    model, held, update, original, new = files

    class Killed(Exception):
        pass

    def killed(target: str, journal_file: str, plan: dict[str, Any]) -> None:
        raise Killed  # the process died right after the commit

    monkeypatch.setattr(inplace, "apply_uninterrupted", killed)
    backend = ReplaceKey("XnnpackBackend", KEY)
    with pytest.raises(Killed):
        ptestore.specialize(model, model, backends=[backend], in_place=True)
    monkeypatch.undo()
    jpath = journal_path(str(model))
    kept = Path(jpath).read_bytes()
    check = journal.journal_check.check_payload

    def checked_then_renamed(target: str, journal_file: str, plan: dict[str, Any]) -> str:
        why = check(target, journal_file, plan)  # the path still names the journal's file
        os.replace(update, model)
        return why

    monkeypatch.setattr(journal.journal_check, "check_payload", checked_then_renamed)
    with pytest.raises(StorageError) as err:
        ptestore.recover(model)
    st = held.stat()
    assert re.fullmatch(
        re.escape(f"{model}: not the file its journal {jpath} was made for (the journal: ")
        + re.escape(f"device {st.st_dev} inode {st.st_ino}; the path now names device ")
        + re.escape(f"{model.stat().st_dev} inode {model.stat().st_ino}: replaced meanwhile)")
        + re.escape(f"; not applied, the file is left as it is. Remove {jpath} if ")
        + re.escape(f"{model} was replaced on purpose"),
        str(err.value),
    )
    assert model.read_bytes() == new and held.read_bytes() == original
    assert Path(jpath).read_bytes() == kept  # recover keeps what it does not apply
