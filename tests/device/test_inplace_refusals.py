"""What an in-place run refuses, and what it gives back: a file with several names (hard
links) or one it cannot write, before any backend runs; a FIFO, without blocking; a
file rewritten in place (the same inode) after the run's last check of it, before the
commit or after it; and the space it reserved, given back when it fails before its
commit. A file marked ``PTJ~`` read under a name without a journal says how to
complete it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.as_user import NOBODY, as_user
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate

import ptestore
import ptestore.coordinator.inplace_commit as commit_module
from ptestore.backends import BackendInterface
from ptestore.errors import (
    ConfigurationError,
    FormatError,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
)
from ptestore.journal import CHANGING, journal_path

FX = get_fixture("mlp_xnnpack")
SPEC = "support.doubling_backend:Doubling=mlp_xnnpack"
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key


def _copy(tmp_path: Path, name: str = "model.pte") -> Path:
    dst = tmp_path / name
    shutil.copyfile(FX.pte_path, dst)  # type: ignore[arg-type]
    return dst


def test_a_file_with_two_names_is_refused_before_any_work(tmp_path: Path) -> None:
    a, b = _copy(tmp_path, "a.pte"), tmp_path / "b.pte"
    os.link(a, b)
    before = a.read_bytes()
    message = (
        f"{a}: has 2 hard links; rewriting it in place would change it under every one of "
        "its names, and a run interrupted under this one would leave the others refused "
        "by the runtime with no journal beside them. Make it a file of its own first "
        "(copy it, and rename the copy over it), or specialize it to another file"
    )
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(a, a, backends=[Untouchable()], in_place=True)
    assert str(err.value) == message
    with pytest.raises(ConfigurationError) as err:
        ptestore.ensure(a, cache_dir=tmp_path / "c", backends=[SPEC], in_place=True)
    assert str(err.value) == message
    assert a.read_bytes() == before and b.read_bytes() == before
    assert not Path(journal_path(str(a))).exists()


class Untouchable(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise AssertionError("the backend ran")


def test_a_marked_file_without_its_journal_says_how_to_complete_it(tmp_path: Path) -> None:
    """Another name of a file torn by a run (made a link after the run was killed): no
    journal beside this name, so reading it says where the journal is, not only that
    the identifier is wrong."""
    from ptestore.format.header import CHANGING_IDENTIFIER

    assert CHANGING_IDENTIFIER == CHANGING  # the format floor's copy of the mark
    torn = _copy(tmp_path, "torn.pte")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: killed after the journal's commit
        try:

            def killed(*args: Any) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            import ptestore.coordinator.inplace as inplace

            real = commit_module.apply_journal

            def marked_then_killed(target: str, journal: str, plan: dict[str, Any]) -> None:
                fd = os.open(target, os.O_WRONLY)
                os.pwrite(fd, CHANGING, 4)  # step 1, then the kill
                os.close(fd)
                killed()
                real(target, journal, plan)

            inplace.apply_uninterrupted = marked_then_killed  # type: ignore[assignment]
            ptestore.specialize(torn, torn, backends=[SPEC], in_place=True)
        finally:
            os._exit(99)
    os.waitpid(pid, 0)
    assert torn.read_bytes()[4:8] == CHANGING and Path(journal_path(str(torn))).exists()
    other = tmp_path / "other.pte"
    os.link(torn, other)
    with pytest.raises(FormatError) as err:
        ptestore.describe(other)
    assert str(err.value) == (
        f"{other}: file identifier (bytes 4..8) = b'PTJ~': must be b'ET12' (.pte Program) "
        "or b'FT01' (.ptd FlatTensor) (marked as being changed in place: an in-place run "
        "was interrupted while it rewrote the file. If a journal is beside this name "
        "(.NAME.ptestore-jrnl2, or .NAME.ptestore-journal of an older ptestore), `ptestore "
        "inspect` of this name completes the file from it; if the run used another name of "
        "this file (a hard link), `ptestore inspect` of that name does; if no journal is "
        "beside either name, restore the model from its portable source (a new copy of the "
        "original .pte))"
    )
    ptestore.describe(torn)  # reading the name the run used completes it, as it says
    assert other.read_bytes()[4:8] == FX.pte_path.read_bytes()[4:8]  # type: ignore[union-attr]


def _as_nobody(work: Callable[[], object]) -> str:
    return as_user(NOBODY, work)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_file_its_user_cannot_write_is_refused_before_the_backends_run() -> None:
    """A read-only model (0444) of a user who may write its directory: refused before
    any backend runs ("cannot be written"), not after them as "replaced by another
    file"."""
    d = Path(tempfile.mkdtemp(prefix="ptestore-readonly-"))
    try:
        os.chmod(d, 0o755)
        os.chown(d, 65534, 65534)
        model = _copy(d)
        os.chmod(model, 0o444)
        os.chown(model, 65534, 65534)
        before = model.read_bytes()
        got = _as_nobody(
            lambda: ptestore.specialize(model, model, backends=[Untouchable()], in_place=True)
        )
        assert got == (
            f"{PermissionDenied.__name__}: {model}: cannot be written (Permission denied): "
            "in-place specialization rewrites the file itself; make it writable, or "
            "specialize it to another file"
        )
        assert model.read_bytes() == before and sorted(os.listdir(d)) == ["model.pte"]
    finally:
        shutil.rmtree(d)


def _without_blocking(call: Callable[[], object]) -> BaseException:
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)  # a ceiling only a hung open reaches
    assert not thread.is_alive(), "blocked on the FIFO"
    (err,) = outcome
    return err


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.pte"
    os.mkfifo(fifo, 0o644)
    err = _without_blocking(lambda: ptestore.specialize(fifo, fifo, backends=[SPEC], in_place=True))
    assert isinstance(err, ConfigurationError)
    assert str(err) == (
        f"{fifo}: not a regular file (prw-r--r--); in-place specialization works on a "
        "regular file only"
    )
    journal = Path(journal_path(str(fifo)))
    journal.write_bytes(b"\0" * 100)
    os.chmod(journal, 0o600)
    err = _without_blocking(lambda: ptestore.recover(fifo))
    assert isinstance(err, StorageError)
    assert (
        str(err) == f"{fifo}: cannot apply its journal {journal}: not a regular file (prw-r--r--)"
    )
    assert journal.exists()


# ----------------------------------------------- rewritten in place while it is specialized
def _rewrite(model: Path) -> bytes:
    """The model rewritten in place (the same inode and size, one byte of another
    value, a newer modification time): what copying a new version over it does."""
    st = model.stat()
    with open(model, "r+b") as f:
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # within a clock tick
    return model.read_bytes()


def test_a_rewrite_after_the_commit_is_not_mixed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptestore.coordinator import journal_writer

    model = _copy(tmp_path)
    commit = journal_writer.commit_journal
    seen: dict[str, Any] = {}

    def then_rewritten(spool: Any, plan: dict[str, Any]) -> None:
        commit(spool, plan)
        seen.update(plan["file"])
        seen["bytes"] = _rewrite(model)

    monkeypatch.setattr(journal_writer, "commit_journal", then_rewritten)
    with pytest.raises(StorageError) as err:
        ptestore.specialize(model, model, backends=[SPEC], in_place=True, provenance=False)
    st = model.stat()
    assert str(err.value) == (
        f"{model}: modified while being specialized in place (the run bound it as "
        f"{seen['size_before']} bytes, modified {seen['mtime_ns']} ns, changed "
        f"{seen['ctime_ns']} ns; it is now {st.st_size} bytes, modified {st.st_mtime_ns} "
        f"ns, changed {st.st_ctime_ns} ns); not applied: the file is left as it was "
        "rewritten, not specialized (its journal removed): specialize it again"
    )
    assert model.read_bytes() == seen["bytes"]
    assert not Path(journal_path(str(model))).exists()


@pytest.mark.parametrize("how", ["same size", "grown (space allocated)"])
def test_a_rewrite_while_the_run_reserves_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Rewritten right after the run's last check, before its space is reserved and its
    binding stamped: refused before the commit, not recorded as the file bound."""
    model = _copy(tmp_path)
    extra = 8192 if how.startswith("grown") else 0
    backend = ReplaceKey("XnnpackBackend", KEY, extra=extra, alignment=64)
    reserve = commit_module.Reservation.reserve
    seen: list[bytes] = []

    def rewritten_first(self: Any, *args: Any) -> bool:
        seen.append(_rewrite(model))
        return reserve(self, *args)

    monkeypatch.setattr(commit_module.Reservation, "reserve", rewritten_first)
    with pytest.raises(PreconditionFailed) as err:
        ptestore.specialize(model, model, backends=[backend], in_place=True, provenance=False)
    assert re.fullmatch(
        re.escape(f"{model}: modified while being read (size ")
        + r"\d+ -> \d+, modified \d+ -> \d+ ns, changed \d+ -> \d+ ns\); its content "
        r"may be a mix of two versions",
        str(err.value),
    ), str(err.value)
    assert model.read_bytes() == seen[0] and model.stat().st_size == len(seen[0])
    assert not Path(journal_path(str(model))).exists()


# ------------------------------------------------ the space reserved, given back on failure
class _Failed(Exception):
    pass


@pytest.mark.parametrize("how", ["grown", "sparse"])
def test_the_space_reserved_is_given_back_when_the_commit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A run that fails between its reservation and its commit: the growth allocated
    past the end, or the holes filled, are released (the file's blocks as before)."""
    from ptestore._libc import fallocate
    from ptestore.coordinator import journal_writer

    model = tmp_path / "big.pte"
    inflate(FX.pte_path, model, 1 << 20)
    if how == "grown":
        backend: Any = ReplaceKey("XnnpackBackend", KEY, extra=300 << 10, alignment=64)
    else:  # the replaced segment a hole, as in a sparse copy
        seg = next(d for d in ptestore.describe(model)["named_data"] if d["key"] == KEY)
        at = next(
            s["absolute_offset"]
            for s in ptestore.describe(model)["segments"]
            if s["index"] == seg["segment_index"]
        )
        start, end = -(-at // 4096) * 4096, (at + seg["size"]) // 4096 * 4096
        fd = os.open(model, os.O_RDWR)
        try:
            assert fallocate(fd, 0x03, start, end - start)  # PUNCH_HOLE | KEEP_SIZE
        finally:
            os.close(fd)
        backend = ReplaceKey("XnnpackBackend", KEY)
    os.sync()
    before, blocks = model.read_bytes(), model.stat().st_blocks
    reserved: list[int] = []

    def failing(spool: Any, plan: dict[str, Any]) -> None:
        reserved.append(os.stat(model).st_blocks)
        raise _Failed

    monkeypatch.setattr(journal_writer, "commit_journal", failing)
    with pytest.raises(_Failed):
        ptestore.specialize(model, model, backends=[backend], in_place=True, provenance=False)
    assert reserved[0] >= blocks + (256 if how == "sparse" else 500)  # 512-byte blocks
    assert model.read_bytes() == before and model.stat().st_blocks == blocks
    assert not Path(journal_path(str(model))).exists()


def test_a_socket_is_refused_without_blocking(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "model.pte"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        err = _without_blocking(
            lambda: ptestore.specialize(path, path, backends=[SPEC], in_place=True)
        )
    assert isinstance(err, ConfigurationError)
    assert str(err) == (
        f"{path}: not a regular file; in-place specialization works on a regular file only"
    )


class ChmodFirst(ReplaceKey):
    """Makes the file read-only while it runs (as another program might), then replaces
    its key."""

    def __init__(self, target: Path) -> None:
        super().__init__("XnnpackBackend", KEY)
        self.target = target

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        os.chmod(self.target, 0o444)
        super().initialize_backend_data(context, output)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_file_made_read_only_while_it_runs_is_not_called_replaced() -> None:
    d = Path(tempfile.mkdtemp(prefix="ptestore-readonly-"))
    try:
        os.chmod(d, 0o755)
        os.chown(d, 65534, 65534)
        model = _copy(d)
        os.chown(model, 65534, 65534)
        before = model.read_bytes()
        got = _as_nobody(
            lambda: ptestore.specialize(model, model, backends=[ChmodFirst(model)], in_place=True)
        )
        assert got == (
            f"{PermissionDenied.__name__}: {model}: cannot be written (Permission denied); "
            "the file is unchanged"
        )
        assert model.read_bytes() == before and sorted(os.listdir(d)) == ["model.pte"]
    finally:
        shutil.rmtree(d)


def test_a_size_change_while_the_space_is_allocated_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _copy(tmp_path)
    real = commit_module.reserve_tail
    grown: list[os.stat_result] = []

    def appended_meanwhile(fd: int, offset: int, size: int) -> bool:
        if not grown:
            grown.append(os.stat(model))
            with open(model, "ab") as f:
                f.write(b"\0")
        return real(fd, offset, size)

    monkeypatch.setattr(commit_module, "reserve_tail", appended_meanwhile)
    backend = ReplaceKey("XnnpackBackend", KEY, extra=8192, alignment=64)
    with pytest.raises(StorageError) as err:
        ptestore.specialize(model, model, backends=[backend], in_place=True, provenance=False)
    was, st = grown[0], model.stat()
    assert str(err.value) == (
        f"{model}: modified while being specialized in place (the run bound it as "
        f"{was.st_size} bytes, modified {was.st_mtime_ns} ns, changed {was.st_ctime_ns} ns; "
        f"it is now {st.st_size} bytes, modified {st.st_mtime_ns} ns, changed "
        f"{st.st_ctime_ns} ns); not applied: the file is left as it was rewritten, not "
        "specialized (its journal discarded): specialize it again"
    )
    assert st.st_size == was.st_size + 1 and not Path(journal_path(str(model))).exists()


def test_an_apply_that_fails_before_marking_says_the_journal_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write of the apply fails (an I/O error): the file is not changed, the
    journal is committed and kept, and ``recover`` applies it."""
    import errno

    model = _copy(tmp_path)
    before = model.read_bytes()
    real = os.pwrite

    def failing(fd: int, data: Any, offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(model):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", failing)
    journal = journal_path(str(model))
    with pytest.raises(StorageError) as err:
        ptestore.specialize(model, model, backends=[SPEC], in_place=True, provenance=False)
    monkeypatch.undo()
    assert str(err.value) == (
        f"{model}: applying its committed in-place journal {journal} failed: Input/output "
        "error; the file is not changed yet, but the journal is committed and kept: run "
        "ptestore.recover() on it (or `ptestore inspect` it, or the next ensure) to "
        "complete the change"
    )
    assert model.read_bytes() == before and Path(journal).exists()
    assert ptestore.recover(model) == "rolled forward" and model.read_bytes() != before


# ------------------------------------------- a rerun of what the file already records
def _killed_after_the_commit(model: Path, device: list[str]) -> None:
    """``ptestore specialize MODEL MODEL --in-place`` killed (SIGKILL) right after its
    journal's commit, before the file was changed: what a crash there leaves."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            import ptestore.coordinator.inplace as inplace
            from ptestore.cli import main

            def killed(*args: Any) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            inplace.apply_uninterrupted = killed  # type: ignore[assignment]
            main(["specialize", str(model), str(model), "--in-place", "--backend", SPEC, *device])
        finally:
            os._exit(99)
    os.waitpid(pid, 0)
    assert Path(journal_path(str(model))).exists()


@pytest.mark.parametrize("json_out", [False, True])
def test_a_rerun_after_a_crash_rolled_forward_has_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    """The rerun of ``ptestore specialize M M --in-place`` after a crash: its recovery
    rolls the journal forward, and the file's own record is exactly this request (the
    same backends and versions, no device, made in place from M), its content intact:
    exit 0, nothing to do (it used to exit 2, AlreadySpecialized)."""
    from ptestore.cli import main
    from ptestore.provenance import read_provenance
    from ptestore.storage.loaders import open_loader

    model = _copy(tmp_path)
    once = _copy(tmp_path, "once.pte")
    assert main(["specialize", str(once), str(once), "--in-place", "--backend", SPEC]) == 0
    _killed_after_the_commit(model, [])
    capsys.readouterr()
    argv = ["specialize", str(model), str(model), "--in-place", "--backend", SPEC]
    assert main(argv + (["--json"] if json_out else [])) == 0
    out, err = capsys.readouterr()
    with open_loader(model) as loader:
        record = read_provenance(loader)
    assert record is not None and err == ""
    if json_out:
        assert json.loads(out) == {
            "nothing_to_do": True,
            "path": str(model),
            "provenance": record.to_dict(),
        }
    else:
        assert out == (
            f"{model}: already specialized by backends [{SPEC} 1.0] for no device, made from "
            f"{model} ({record.source.sha256}): nothing to do\n"
        )
    assert not Path(journal_path(str(model))).exists()
    size = record.content.size  # type: ignore[union-attr]
    assert model.read_bytes()[:size] == once.read_bytes()[:size]  # doubled once
    assert ptestore.verify(model).status == "intact"


def test_a_rerun_of_another_request_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the file records is not this request: another device, or made from another
    source (``specialize(PORTABLE, M)``): AlreadySpecialized, exit 2, the file unchanged."""
    from ptestore.cli import main

    model = _copy(tmp_path)
    _killed_after_the_commit(model, [])
    assert ptestore.recover(model) == "rolled forward"
    before = model.read_bytes()
    capsys.readouterr()
    argv = ["specialize", str(model), str(model), "--in-place", "--backend", SPEC]
    assert main([*argv, "--device", "phone"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore specialize: error: {model}: already specialized (its ")
    assert model.read_bytes() == before
    made = _copy(tmp_path, "made.pte")
    ptestore.specialize(FX.pte_path, made, backends=[SPEC])  # made from the portable source
    assert main(["specialize", str(made), str(made), "--in-place", "--backend", SPEC]) == 2
    assert f"made from {FX.pte_path}" in capsys.readouterr().err
