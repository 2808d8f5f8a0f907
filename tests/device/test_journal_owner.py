"""Whose journal is applied: a journal another user wrote beside a file (a shared, sticky
directory) is refused, never applied nor removed, however valid its plan (its binding
can be computed by anyone who can read the file); so is one writable by others. A
journal that cannot be removed (another user's directory) is an error saying what became
of the file, and is not applied again once its writes are in the file.

Run as root (as CI does): the other users are forked children that drop to uid 65534
(``nobody``) or 65533 with ``os.setresuid``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.as_user import as_user
from support.fixtures import get_fixture

import ptestore
import ptestore.coordinator.inplace as inplace_module
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import PermissionDenied
from ptestore.journal import journal_path

FX = get_fixture("mlp_xnnpack")
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key
NOBODY, OTHER = 65534, 65533

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


class Attacker(BackendInterface):
    """Replaces the key with bytes of its own choosing (the same size)."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        n = len(bytes(context.get_named_data_map().get_data(KEY)))
        output.write_named_data(KEY, BackendData(b"\xa5" * n))


class _Crash(Exception):
    pass


def _committed_bytes(model: Path, backend: BackendInterface) -> bytes:
    """The journal a run of ``backend`` on ``model`` commits (killed right after its
    commit), removed from beside the model: what anyone who can read the model can
    make for it."""

    def crash(*args: Any, **kwargs: Any) -> None:
        raise _Crash

    with pytest.MonkeyPatch.context() as m:
        m.setattr(inplace_module, "apply_uninterrupted", crash)
        with pytest.raises(_Crash):
            ptestore.specialize(model, model, backends=[backend], in_place=True, provenance=False)
    journal = Path(journal_path(str(model)))
    data = journal.read_bytes()
    journal.unlink()
    return data


def _directory(mode: int) -> Iterator[Path]:
    """A directory of root's with ``mode``, reachable by every user (pytest's own are
    not: 0700), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="ptestore-owner-"))
    os.chmod(d, mode)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory, as /tmp is."""
    yield from _directory(0o1777)


@pytest.fixture
def closed() -> Iterator[Path]:
    """A directory only root may write to."""
    yield from _directory(0o755)


def _plant(path: Path, data: bytes, mode: int = 0o644) -> Callable[[], object]:
    def plant() -> object:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        os.write(fd, data)
        os.close(fd)
        return path.stat().st_uid

    return plant


def test_a_committed_journal_planted_by_another_user_is_never_applied(shared: Path) -> None:
    """The reviewer's repro: root's model in a sticky directory, a valid committed journal
    written beside it by nobody; root's ``ptestore verify`` refuses it (exit 2), naming
    the journal, its owner and mode; the model keeps its bytes, the journal stays."""
    from ptestore.cli import main

    model = shared / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    os.chmod(model, 0o644)
    before = model.read_bytes()
    planted = _committed_bytes(model, Attacker())
    journal = Path(journal_path(str(model)))
    assert as_user(NOBODY, _plant(journal, planted)) == f"ok: {NOBODY}"
    want = (
        f"{journal}: refusing this in-place journal: owned by uid {NOBODY} (mode "
        f"-rw-r--r--), neither this process's user (uid 0) nor {model}'s owner (uid 0); "
        f"it is neither applied nor removed, and {model} is left as it is. Recover it as "
        f"uid {NOBODY} if an in-place run of that user left it; else another user put it "
        "there: remove it"
    )
    for call in (ptestore.verify, ptestore.recover, ptestore.describe):
        with pytest.raises(PermissionDenied) as err:
            call(model)
        assert str(err.value) == want
    assert main(["verify", str(model)]) == 2
    assert model.read_bytes() == before and journal.read_bytes() == planted
    # an in-place run refuses it too, rather than removing it as its own
    with pytest.raises(PermissionDenied, match="refusing this in-place journal"):
        ptestore.specialize(model, model, backends=[Attacker()], in_place=True)
    assert model.read_bytes() == before and journal.read_bytes() == planted


def test_an_uncommitted_journal_planted_by_another_user_is_named_not_removed(
    shared: Path,
) -> None:
    model = shared / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    journal = Path(journal_path(str(model)))
    assert as_user(NOBODY, _plant(journal, b"\0" * 100, 0o600)) == f"ok: {NOBODY}"
    with pytest.raises(PermissionDenied) as err:
        ptestore.verify(model)
    assert str(err.value).startswith(
        f"{journal}: refusing this in-place journal: owned by uid {NOBODY} (mode -rw-------)"
    )
    assert journal.exists()


def test_a_journal_writable_by_others_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    before = model.read_bytes()
    journal = Path(journal_path(str(model)))
    journal.write_bytes(_committed_bytes(model, Attacker()))
    os.chmod(journal, 0o666)
    with pytest.raises(PermissionDenied) as err:
        ptestore.recover(model)
    assert str(err.value) == (
        f"{journal}: refusing this in-place journal: writable by others than its owner "
        f"(uid 0, mode -rw-rw-rw-); it is neither applied nor removed, and {model} is left "
        "as it is. If an in-place run left it, make it writable by its owner only (chmod "
        "go-w) and recover again; else remove it"
    )
    assert model.read_bytes() == before and journal.exists()
    os.chmod(journal, 0o600)  # root's own, as a run writes it: applied
    assert ptestore.recover(model) == "rolled forward" and model.read_bytes() != before


def test_the_file_owner_s_uncommitted_journal_another_user_cannot_remove(
    shared: Path,
) -> None:
    """An uncommitted journal of the file's owner, in a sticky directory: a reader (another
    user) cannot remove it; the error says the file was not changed and what to do,
    instead of a bare PermissionError."""
    model = shared / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    os.chmod(model, 0o644)
    os.chown(model, NOBODY, NOBODY)
    journal = Path(journal_path(str(model)))
    assert as_user(NOBODY, _plant(journal, b"\0" * 100)) == f"ok: {NOBODY}"
    got = as_user(OTHER, lambda: ptestore.verify(model).status)
    assert got == (
        f"PermissionDenied: {model}: not changed (its in-place journal was never "
        f"committed), but the journal {journal} cannot be removed: Operation not "
        "permitted; remove it by hand (as its owner, or the directory's)"
    )
    assert journal.exists()
    assert as_user(NOBODY, lambda: ptestore.recover(model)) == "ok: discarded"


def test_a_journal_that_cannot_be_removed_is_applied_once(closed: Path) -> None:
    """The file's owner may write it but not its directory: the journal is applied, its
    removal refused with what became of the file; the next call finds every write in
    the file and does not apply it again."""
    model = closed / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    os.chown(model, NOBODY, NOBODY)  # before the run: its times are in the binding
    journal = Path(journal_path(str(model)))
    journal.write_bytes(_committed_bytes(model, Attacker()))
    os.chmod(journal, 0o600)
    os.chown(journal, NOBODY, NOBODY)

    def twice() -> object:
        import ptestore.journal as journal_module

        applied: list[str] = []
        real = journal_module.apply_journal

        def counted(*args: Any) -> None:
            applied.append("apply")
            real(*args)

        journal_module.apply_journal = counted  # type: ignore[assignment]
        outcomes = []
        for _ in range(2):
            try:
                ptestore.verify(model)
                outcomes.append("verified")
            except PermissionDenied as exc:
                outcomes.append(str(exc))
        return [*applied, *outcomes]

    got = as_user(NOBODY, twice)
    message = (
        f"{model}: the change is complete (its in-place journal was applied), but the "
        f"journal {journal} cannot be removed: Permission denied; remove it by hand (as "
        "its owner, or the directory's)"
    )
    assert got == f"ok: {['apply', message, message]}"
    assert bytes(model.read_bytes()[4:8]) == FX.pte_path.read_bytes()[4:8]  # type: ignore[union-attr]
    assert ptestore.recover(model) == "rolled forward" and not journal.exists()  # as root
