"""In-place specialization: the journal, its order of durable steps, SIGKILL at sampled
phases of applying it, ``recover``, and a small ext4 image with less free space than
the model (a staged run fails cleanly, an in-place one succeeds)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate

import ptestore
from ptestore.backends import BackendData, BackendInterface, DeviceProfile
from ptestore.errors import ConfigurationError, StorageError
from ptestore.journal import CHANGING, COMMIT, COMMIT_RECORD, journal_path, read_plan
from ptestore.provenance import check_bytes, read_trailer
from ptestore.storage.loaders import open_loader

FX = get_fixture("mlp_xnnpack")
SPEC = "support.doubling_backend:Doubling=mlp_xnnpack"
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key


def copy(tmp_path: Path, name: str = "model.pte") -> Path:
    assert FX.pte_path is not None
    dst = tmp_path / name
    shutil.copyfile(FX.pte_path, dst)
    return dst


def staged(tmp_path: Path, backends: list[Any], src: Path | None = None) -> bytes:
    """What a staged specialization of the same source gives (the reference)."""
    out = tmp_path / "staged.pte"
    ptestore.specialize(src or FX.pte_path, out, backends=backends, provenance=False)
    return out.read_bytes()


def test_same_size_replacement_in_place_equals_the_staged_output(tmp_path: Path) -> None:
    src = copy(tmp_path)
    ino = src.stat().st_ino
    report = ptestore.specialize(src, src, backends=[SPEC], in_place=True, provenance=False)
    (f,) = report.files
    assert (f.segments_replaced, f.segments_moved, f.bytes_replaced) == (1, 0, 2048)
    assert src.read_bytes() == staged(tmp_path, [SPEC])
    assert src.stat().st_ino == ino  # the same file, rewritten
    assert not Path(journal_path(str(src))).exists()


def test_a_grown_replacement_goes_at_the_end_and_its_old_range_is_released(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.pte"
    inflate(FX.pte_path, big, 1 << 20)  # two 1 MiB keys
    reference = tmp_path / "ref.pte"
    shutil.copyfile(big, reference)
    grow = ReplaceKey("XnnpackBackend", KEY, extra=8192, alignment=64)
    report = ptestore.specialize(big, big, backends=[grow], in_place=True, provenance=False)
    (f,) = report.files
    assert f.segments_moved == 1 and f.size_after > f.size_before
    info = ptestore.describe(big)
    seg = next(s for s in info["segments"] if s["size"] == (1 << 20) + 8192)
    old = next(s for s in ptestore.describe(reference)["segments"] if s["index"] == seg["index"])
    assert seg["absolute_offset"] >= f.size_before - 64  # after the last old segment
    # The old range is a hole now (ext4 punches whole 4 KiB blocks).
    fd = os.open(big, os.O_RDONLY)
    try:
        start = -(-old["absolute_offset"] // 4096) * 4096
        assert os.lseek(fd, start, os.SEEK_HOLE) == start
    finally:
        os.close(fd)
    data = big.read_bytes()
    got = data[seg["absolute_offset"] : seg["absolute_offset"] + seg["size"]]
    assert got == grow.replacement
    ptestore.verify(big)  # a well-formed container


@pytest.mark.parametrize("how", ["same size", "grown"])
def test_an_in_place_artifact_is_bound_to_its_bytes(tmp_path: Path, how: str) -> None:
    """The record names the bytes the journal leaves (metadata, kept segments, zeros
    where a grown segment's old range was released, the new data): verify reads them
    back as intact, and a flipped byte anywhere is caught."""
    from ptestore.verification import verify

    if how == "same size":
        src, backends = copy(tmp_path), [SPEC]
        staged_bytes = staged(tmp_path, backends)
    else:
        src = tmp_path / "big.pte"
        inflate(FX.pte_path, src, 1 << 20)
        backends = [ReplaceKey("XnnpackBackend", KEY, extra=8192, alignment=64)]
    ptestore.specialize(src, src, backends=backends, in_place=True, provenance=True)
    report = verify(src)
    assert (report.status, report.exit_code) == ("intact", 0), report.message()
    data = src.read_bytes()
    if how == "same size":  # the same bytes as a staged run, trailer and all but names
        content = ptestore.describe(src)["provenance"]["content"]["size"]
        assert data[:content] == staged_bytes[:content]
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x01
    src.write_bytes(bytes(flipped))
    assert verify(src).status == "invalid"


def test_an_in_place_pass_through_with_provenance_changes_nothing(tmp_path: Path) -> None:
    src = copy(tmp_path)
    before = src.read_bytes()
    report = ptestore.specialize(src, src, backends=["passthrough"], in_place=True, provenance=True)
    assert report.files[0].status == "unchanged"
    assert src.read_bytes() == before


def test_specialize_in_place_refuses_nothing_specialized_by_default(tmp_path: Path) -> None:
    from ptestore.device import specialize_in_place
    from ptestore.errors import NothingSpecialized

    src = copy(tmp_path)
    before = src.read_bytes()
    with pytest.raises(NothingSpecialized):
        specialize_in_place(src, backends=[Quiet()])
    assert src.read_bytes() == before


class Quiet(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dst": "other.pte"}, "in_place=True rewrites the source itself: the destination"),
        ({"ptd": ("a.ptd", "b.ptd")}, "in_place=True rewrites a .pte alone"),
        ({"mode": "create"}, "in_place=True replaces the file: mode must be 'overwrite'"),
        ({"src": "s3://b/m.pte"}, "s3://b/m.pte: in-place specialization works on local files"),
        ({"dst_storage_options": {"anon": True}}, "in_place=True takes no storage options"),
    ],
)
def test_in_place_refusals(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    src = copy(tmp_path)
    before = src.read_bytes()
    args: dict[str, Any] = {"src": str(src), "dst": str(src), **kwargs}
    if "dst" in kwargs:
        args["dst"] = str(tmp_path / kwargs["dst"])
    if kwargs.get("src"):
        args["dst"] = kwargs["src"]
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        ptestore.specialize(
            args.pop("src"), args.pop("dst"), backends=[SPEC], in_place=True, **args
        )
    assert src.read_bytes() == before


class Boom(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = bytes(context.get_named_data_map().get_data(KEY))
        output.write_named_data(KEY, BackendData(value))  # spooled into the journal
        raise RuntimeError("the device ran out of patience")


def test_a_failing_backend_leaves_the_file_and_no_journal(tmp_path: Path) -> None:
    src = copy(tmp_path)
    before = src.read_bytes()
    with pytest.raises(ptestore.BackendError, match="initialize_backend_data failed: "):
        ptestore.specialize(src, src, backends=[Boom()], in_place=True)
    assert src.read_bytes() == before and not Path(journal_path(str(src))).exists()


# --------------------------------------------------------------- order of durable steps
class Recorder:
    """Logs ``(call, file)`` for the os calls the journal relies on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, names: dict[str, str]) -> None:
        self.calls: list[tuple[str, str]] = []
        self.names = names
        for call in ("pwrite", "fsync", "ftruncate", "copy_file_range"):
            real = getattr(os, call)

            def wrapped(fd: int, *args: Any, _real: Any = real, _call: str = call) -> Any:
                # copy_file_range(src, dst, ...): the file it writes is the second
                self.calls.append((_call, self.name(args[0] if _call == "copy_file_range" else fd)))
                return _real(fd, *args)

            monkeypatch.setattr(os, call, wrapped)
        real_unlink = os.unlink

        def unlink(path: Any, *args: Any, **kw: Any) -> None:
            self.calls.append(("unlink", self.names.get(os.path.abspath(path), "other")))
            real_unlink(path, *args, **kw)

        monkeypatch.setattr(os, "unlink", unlink)

    def name(self, fd: int) -> str:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "other"
        if os.path.isdir(path):
            return "dir"
        return self.names.get(path, "other")

    def squeezed(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for c in self.calls:
            if c[1] == "other":
                continue
            if not out or out[-1] != c:
                out.append(c)
        return out


@pytest.mark.parametrize("how", ["same size", "grown"])
def test_durable_order_journal_then_marked_then_data_then_identifier_then_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    src = copy(tmp_path)
    if how == "grown":  # the segment moves to the end: the metadata changes
        backend: Any = ReplaceKey("XnnpackBackend", KEY, extra=8192, alignment=64)
    else:  # the same offsets and sizes: the metadata stays as it is, not rewritten
        backend = SPEC
    reference = staged(tmp_path, [backend], src) if how == "same size" else None
    names = {str(src): "file", journal_path(str(src)): "journal"}
    rec = Recorder(monkeypatch, names)
    ptestore.specialize(src, src, backends=[backend], in_place=True, provenance=False)
    monkeypatch.undo()
    calls = rec.squeezed()
    # What is durable at each point: the journal (checksummed by its commit record) and
    # its directory entry before the file is touched; the changed identifier before any
    # data; all data before the identifier comes back; the identifier before the
    # journal goes.
    metadata = [("pwrite", "file")] if how == "grown" else []
    assert calls == [
        ("pwrite", "journal"),  # replacement (spooled), metadata if changed, plan, commit
        ("fsync", "journal"),
        ("fsync", "dir"),
        ("pwrite", "file"),  # identifier -> CHANGING
        ("fsync", "file"),
        *metadata,  # the new metadata (with CHANGING in place of the identifier)
        ("copy_file_range", "file"),  # the replacement, from the journal in the kernel
        ("ftruncate", "file"),
        ("fsync", "file"),
        ("pwrite", "file"),  # the identifier back
        ("fsync", "file"),
        ("unlink", "journal"),
        ("fsync", "dir"),
    ]
    if reference is not None:
        assert src.read_bytes() == reference
    else:  # at the end instead of compacted as a staged output is: a well-formed file
        ptestore.verify(src)
        assert src.stat().st_size > FX.pte_path.stat().st_size  # type: ignore[union-attr]


# ------------------------------------------------------------------- SIGKILL at phases
#: The calls that change the model file, counted by :func:`_kill_at` (``fallocate``:
#: the journal's reserve and punch, through ctypes).
CALLS = ("pwrite", "fsync", "ftruncate", "copy_file_range", "fallocate")


def _kill_at(
    src: Path,
    nth: int,
    calls: tuple[str, ...] = CALLS,
    backends: list[Any] | None = None,
) -> int:
    """Run the in-place specialization in a forked child that SIGKILLs itself right
    before its ``nth`` call (0-based) touching the model file (counting ``calls``);
    returns how many such calls it made (all of them when it was not killed)."""
    names = _calls_killed_at(src, nth, calls, backends)
    return -1 if names is None else len(names)


def _calls_killed_at(
    src: Path,
    nth: int,
    calls: tuple[str, ...] = CALLS,
    backends: list[Any] | None = None,
    ensure_cache: Path | None = None,
    provenance: bool = False,
) -> list[str] | None:
    """The calls touching the model file, in order (None: killed before the ``nth``).
    ``ensure_cache``: the child runs ``ensure(src, cache_dir=..., in_place=True)`` (with
    provenance) instead of ``specialize(src, src, in_place=True, provenance=False)``;
    ``nth=-1`` then kills it right before it publishes the entry's manifest."""
    import ptestore.journal as journal_module

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        seen: list[str] = []
        target = str(src)

        def wrap(real: Any, call: str) -> Any:
            def wrapped(fd: int, *args: Any) -> Any:
                written = args[0] if call == "copy_file_range" else fd
                try:
                    path = os.readlink(f"/proc/self/fd/{written}")
                except OSError:
                    path = ""
                if path == target:
                    if len(seen) == nth:
                        os.kill(os.getpid(), signal.SIGKILL)
                    seen.append(call)
                return real(fd, *args)

            return wrapped

        for call in calls:
            if call == "fallocate":
                journal_module._fallocate = wrap(journal_module._fallocate, call)
            else:
                setattr(os, call, wrap(getattr(os, call), call))
        try:
            if ensure_cache is None:
                ptestore.specialize(
                    src, src, backends=backends or [SPEC], in_place=True, provenance=provenance
                )
            else:
                if nth == -1:
                    from ptestore.device.manifest import Manifest

                    def killed(*args: Any) -> None:
                        os.kill(os.getpid(), signal.SIGKILL)

                    Manifest.publish = killed  # type: ignore[method-assign]
                ptestore.ensure(
                    src, cache_dir=ensure_cache, backends=backends or [SPEC], in_place=True
                )
            os.write(w, ",".join(seen).encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.close(r)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return None
    return out.decode().split(",") if out else []


def kill_states(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``(phase, file as the kill left it)`` for sampled phases of applying, each also
    recovered (``<phase>/recovered``)."""
    probe = copy(tmp_path, "probe.pte")
    total = _kill_at(probe, 10**9)  # not killed: how many calls touch the file
    assert total >= 6, total  # mark, fsync, >= 1 data write, ftruncate, fsync, ident, fsync
    for nth, phase in [
        (0, "before marking"),
        (1, "marked, not synced"),
        (2, "first data write"),
        (total - 3, "data written, not synced"),
        (total - 2, "before the identifier is restored"),
        (total - 1, "identifier restored, not synced"),
    ]:
        src = copy(tmp_path, f"k{nth}.pte")
        assert _kill_at(src, nth) == -1, phase
        assert Path(journal_path(str(src))).exists(), phase  # committed, so kept
        yield phase, src


def test_sigkill_at_sampled_phases_leaves_old_new_or_refused_and_recover_completes(
    tmp_path: Path,
) -> None:
    assert FX.pte_path is not None
    old, new = FX.pte_path.read_bytes(), staged(tmp_path, [SPEC])
    for phase, src in kill_states(tmp_path):
        data = src.read_bytes()
        # The old file, the complete new one, or one marked as changing: never a mix
        # with the real identifier.
        assert data in (old, new) or data[4:8] == CHANGING, phase
        assert ptestore.recover(src) == "rolled forward", phase
        assert src.read_bytes() == new, phase
        assert ptestore.recover(src) is None
    # A kill while the journal is written (before its commit record): discarded.
    src = copy(tmp_path, "early.pte")
    j = journal_path(str(src))
    Path(j).write_bytes(b"\0" * 100)  # what a run killed mid-journal leaves
    assert ptestore.recover(src) == "discarded" and src.read_bytes() == old


def test_a_kill_while_applying_leaves_a_record_whose_chunks_are_the_bytes(
    tmp_path: Path,
) -> None:
    """In place with provenance on a file whose own trailer names its chunk digests (the
    new record's are derived from them, only the changed chunks hashed): killed at every
    sampled phase of applying, then recovered, the file is the completed run's content
    (or, killed before the journal's commit, the file as it was) and its record's chunk
    digests and root are those of its bytes."""
    known = tmp_path / "known.pte"
    assert FX.pte_path is not None
    ptestore.specialize(FX.pte_path, known, allow_unchanged=True)  # a trailer with chunks
    probe = tmp_path / "probe.pte"
    shutil.copyfile(known, probe)
    steps = _calls_killed_at(probe, 10**9, provenance=True)
    assert steps is not None and len(steps) >= 6, steps
    with open_loader(probe) as loader:
        trailer = read_trailer(loader)
        assert trailer is not None and check_bytes(loader).chunks >= 1
    done = probe.read_bytes()[: trailer.content_size]
    outcomes: set[str | None] = set()
    for nth in sorted({0, 1, 2, len(steps) // 2, len(steps) - 2, len(steps) - 1}):
        src = tmp_path / f"k{nth}.pte"
        shutil.copyfile(known, src)
        assert _calls_killed_at(src, nth, provenance=True) is None, nth
        outcome = ptestore.recover(src)  # None: no journal was left
        with open_loader(src) as loader:
            assert check_bytes(loader).chunks >= 1, (nth, outcome)
        if outcome == "rolled forward":
            assert src.read_bytes()[: trailer.content_size] == done, nth
        else:  # killed before the journal's commit: the file as it was
            assert outcome in (None, "discarded") and src.read_bytes() == known.read_bytes()
        assert ptestore.verify(src).status == "intact", nth
        outcomes.add(outcome)
    assert "rolled forward" in outcomes, outcomes


def test_every_entry_point_rolls_a_committed_journal_forward(tmp_path: Path) -> None:
    new = staged(tmp_path, [SPEC])
    probe = copy(tmp_path, "probe.pte")
    total = _kill_at(probe, 10**9)
    for i, use in enumerate(
        [
            lambda p: ptestore.describe(p),
            lambda p: ptestore.verify(p),
            lambda p: ptestore.specialize(
                p, tmp_path / "out.pte", backends=["passthrough"], provenance=False
            ),
            lambda p: ptestore.ensure(p, cache_dir=tmp_path / "c", backends=["passthrough"]),
        ]
    ):
        src = copy(tmp_path, f"e{i}.pte")
        assert _kill_at(src, total // 2) == -1
        use(src)
        assert not Path(journal_path(str(src))).exists() and src.read_bytes() == new, i


# ------------------------------------------------------------ small ext4, little space
@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB ext4 image (about 6 MiB free) mounted on a loop device, unmounted
    afterwards."""
    img, mnt = tmp_path / "small.ext4", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(8 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_on_a_small_ext4_staged_fails_cleanly_and_in_place_succeeds(
    tmp_path: Path, small_ext4: Path
) -> None:
    big = tmp_path / "big.pte"
    inflate(FX.pte_path, big, 1 << 20)  # 4 MiB: 4 keys of 1 MiB
    swap = ReplaceKey("XnnpackBackend", KEY)  # same size: the bytes reversed
    want = staged(tmp_path, [swap], src=big)
    src = small_ext4 / "model.pte"
    shutil.copyfile(big, src)
    free = os.statvfs(small_ext4).f_bavail * os.statvfs(small_ext4).f_frsize
    assert free < src.stat().st_size, (free, src.stat().st_size)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    with pytest.raises(StorageError, match="No space left on device"):
        ptestore.specialize(src, src, backends=[swap], provenance=False)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    assert sorted(os.listdir(small_ext4)) == ["lost+found", "model.pte"]
    report = ptestore.specialize(src, src, backends=[swap], in_place=True, provenance=False)
    assert report.files[0].bytes_replaced == 1 << 20
    assert src.read_bytes() == want
    assert sorted(os.listdir(small_ext4)) == ["lost+found", "model.pte"]


def test_on_a_small_ext4_a_growth_that_does_not_fit_fails_before_the_file_changes(
    tmp_path: Path, small_ext4: Path
) -> None:
    big, src = tmp_path / "big.pte", small_ext4 / "model.pte"
    inflate(FX.pte_path, big, 1 << 20)
    shutil.copyfile(big, src)
    before = src.read_bytes()
    free = os.statvfs(small_ext4).f_bfree
    # The journal (1.3 MiB) fits; the journal and the growth of the file do not.
    grow = ReplaceKey("XnnpackBackend", KEY, extra=300 << 10)
    with pytest.raises(StorageError) as err:
        ptestore.specialize(src, src, backends=[grow], in_place=True)
    msg = str(err.value)
    assert msg.startswith(f"{src}: ") and "; the file is unchanged" in msg
    assert "No space left on device" in msg
    assert src.read_bytes() == before
    assert sorted(os.listdir(small_ext4)) == ["lost+found", "model.pte"]
    assert os.statvfs(small_ext4).f_bfree >= free - 1  # nothing left allocated


def test_ensure_in_place_rewrites_once_then_hits(tmp_path: Path) -> None:
    src, cache = copy(tmp_path), tmp_path / "cache"
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert a.created and a.in_place and a.pte == str(src) and a.ptd is None
    st = src.stat()
    b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert not b.created and b.provenance == a.provenance
    assert src.stat().st_mtime_ns == st.st_mtime_ns  # not rewritten again
    new_source = tmp_path / "update.pte"
    shutil.copyfile(FX.pte_path, new_source)
    os.replace(new_source, src)  # the app downloaded a new model
    c = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert c.created and c.key == a.key and c.provenance.created >= a.provenance.created
    want = staged(tmp_path, [SPEC])
    assert src.read_bytes()[: len(want)] == want  # then the provenance trailer
    assert [e.key for e in ptestore.device.list_entries(cache)] == [a.key]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ptd": "model.ptd"}, "ensure(in_place=True) rewrites a .pte alone; a .pte/.ptd pair"),
        ({"source": "s3://b/m.pte"}, "s3://b/m.pte: in-place specialization works on local"),
    ],
)
def test_ensure_in_place_refusals(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    src = copy(tmp_path)
    before = src.read_bytes()
    source = kwargs.pop("source", src)
    if "ptd" in kwargs:
        kwargs["ptd"] = tmp_path / kwargs["ptd"]
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        ptestore.ensure(source, cache_dir=tmp_path / "c", backends=[SPEC], in_place=True, **kwargs)
    assert src.read_bytes() == before


# ------------------------------------------- a journal is bound to its file (issue 29)
def _torn(tmp_path: Path, name: str) -> Path:
    """A copy killed in the middle of applying its journal: marked, journal committed."""
    probe = copy(tmp_path, f"probe-{name}")
    total = _kill_at(probe, 10**9)
    src = copy(tmp_path, name)
    assert _kill_at(src, total // 2) == -1
    assert src.read_bytes()[4:8] == CHANGING and Path(journal_path(str(src))).exists()
    return src


def _killed_before_marking(tmp_path: Path, name: str) -> Path:
    """A copy whose run was killed after the commit, before the file was touched."""
    src = copy(tmp_path, name)
    assert _kill_at(src, 0) == -1
    assert src.read_bytes() == FX.pte_path.read_bytes()  # type: ignore[union-attr]
    return src


@pytest.mark.parametrize("how", ["replaced (a new inode)", "rewritten (the same inode)"])
def test_a_journal_is_not_applied_to_another_file_with_its_name(tmp_path: Path, how: str) -> None:
    """A file replaced after its run was killed (a re-download, another model) does not
    get the old journal's bytes: recover refuses, naming the journal and both files."""
    src = _killed_before_marking(tmp_path, "model.pte")
    other = tmp_path / "other.pte"
    inflate(FX.pte_path, other, 4096)  # another model, another size
    if how.startswith("replaced"):
        os.replace(other, src)
    else:
        with open(src, "r+b") as f:  # same inode, other bytes
            f.truncate(0)
            f.write(other.read_bytes())
    before = src.read_bytes()
    journal = journal_path(str(src))
    with pytest.raises(StorageError) as err:
        ptestore.recover(src)
    msg = str(err.value)
    assert msg.startswith(f"{src}: not the file its journal {journal} was made for")
    assert re.search(r"the journal: device \d+ inode \d+, \d+ bytes, sha256 [0-9a-f]{64}", msg)
    assert f"the file now: device {src.stat().st_dev} inode {src.stat().st_ino}, " in msg
    assert f"{len(before)} bytes" in msg and f"Remove {journal} if {src}" in msg
    assert src.read_bytes() == before and Path(journal).exists()
    # ensure refuses too (it recovers first), rather than specializing over it
    with pytest.raises(StorageError, match="not the file its journal"):
        ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[SPEC], in_place=True)
    assert src.read_bytes() == before


def test_a_journal_whose_file_is_gone_is_an_error_naming_both(tmp_path: Path) -> None:
    """The file was removed after its run committed the journal, or cannot be opened to
    apply it: recover says so, naming the file and the journal; the journal is kept."""
    from ptestore.errors import ObjectNotFound

    src = _killed_before_marking(tmp_path, "gone.pte")
    journal = Path(journal_path(str(src)))
    kept = journal.read_bytes()
    src.unlink()
    with pytest.raises(ObjectNotFound) as gone:
        ptestore.recover(src)
    assert str(gone.value) == (
        f"{src}: no such file, but its in-place journal {journal} is there: the file was "
        "removed after a run was interrupted; remove the journal if the file is gone for good"
    )
    assert journal.read_bytes() == kept and not src.exists()
    # There, but not a file that opens for writing (a directory in its place).
    src.mkdir()
    os.chmod(src, 0o755)
    with pytest.raises(StorageError) as err:
        ptestore.recover(src)
    assert str(err.value) == (
        f"{src}: cannot apply its journal {journal}: not a regular file (drwxr-xr-x)"
    )
    assert journal.read_bytes() == kept and src.is_dir()


def test_a_journal_is_applied_to_its_own_file_at_every_state(tmp_path: Path) -> None:
    """Not started, torn, and applied but not yet removed: all the file it was made
    for (the binding does not refuse a legitimate recovery)."""
    new = staged(tmp_path, [SPEC])
    for src in (_killed_before_marking(tmp_path, "a.pte"), _torn(tmp_path, "b.pte")):
        assert ptestore.recover(src) == "rolled forward" and src.read_bytes() == new
    src = _torn(tmp_path, "c.pte")
    journal = Path(journal_path(str(src)))
    kept = journal.read_bytes()
    assert ptestore.recover(src) == "rolled forward"
    journal.write_bytes(kept)  # as if killed between step 4 and the journal's removal
    assert ptestore.recover(src) == "rolled forward" and src.read_bytes() == new


def test_an_applied_journal_that_kept_the_metadata_is_its_file_s_with_a_trailer(
    tmp_path: Path,
) -> None:
    """The same offsets and sizes: the plan has no write at offset 0 (the metadata is
    kept) and the trailer makes the file longer. Killed between its identifier coming
    back and the journal's removal, the file is recognised by its kept first bytes and
    its new size: rolled forward again, not refused as another file."""
    probe = copy(tmp_path, "probe.pte")
    calls = _calls_killed_at(probe, 10**9, provenance=True)
    assert calls is not None
    src = copy(tmp_path, "m.pte")
    assert _calls_killed_at(src, len(calls) // 2, provenance=True) is None  # torn
    journal = Path(journal_path(str(src)))
    plan = read_plan(str(journal))
    assert plan is not None and not any(dst == 0 for dst, _, _ in plan["writes"])
    kept = journal.read_bytes()
    assert ptestore.recover(src) == "rolled forward"
    new = src.read_bytes()
    assert len(new) > FX.pte_path.stat().st_size  # type: ignore[union-attr]
    assert new[: plan["file"]["head_size"]] == probe.read_bytes()[: plan["file"]["head_size"]]
    journal.write_bytes(kept)  # as if killed between step 4 and the journal's removal
    assert ptestore.recover(src) == "rolled forward" and src.read_bytes() == new


def _flip_payload_byte(journal: Path, at: int = 10) -> None:
    data = bytearray(journal.read_bytes())
    data[at] ^= 0x40  # in the payload: the spooled replacement (by default)
    journal.write_bytes(bytes(data))


def _as_older_ptestore(journal: Path) -> Path:
    """The journal as an older ptestore committed it: the SHA-256 of all before
    its commit record (the plan's ``check`` is then ignored), under the older name
    ``.NAME.ptestore-journal``; returns that path."""
    body = journal.read_bytes()[: -COMMIT_RECORD.size]
    older = journal.with_name(journal.name.replace(".ptestore-jrnl2", ".ptestore-journal"))
    assert older != journal
    older.write_bytes(body + COMMIT_RECORD.pack(COMMIT, hashlib.sha256(body).digest()))
    older.chmod(0o600)
    journal.unlink()
    return older


def assert_corrupt_journal_refused(tmp_path: Path, old: bool = False) -> None:
    src = _torn(tmp_path, "flipped.pte")
    journal = Path(journal_path(str(src)))
    if old:
        journal = _as_older_ptestore(journal)
    _flip_payload_byte(journal)
    before = src.read_bytes()
    with pytest.raises(StorageError) as err:
        ptestore.recover(src)
    msg = str(err.value)
    assert msg.startswith(f"{src}: damaged: the file is marked as being changed in place (PTJ~")
    if old:
        assert f"its journal {journal} is invalid (the SHA-256 of its first " in msg
        assert "does not match its commit record)" in msg
    else:
        assert re.search(
            rf"its journal {re.escape(str(journal))} is invalid \(chunk 0 of what it leaves "
            r"in the file \(bytes 0\.\.\d+\) has SHA-256 [0-9a-f]{64}, its plan says "
            r"[0-9a-f]{64}\)",
            msg,
        ), msg
    assert "Restore the model from its portable source" in msg
    assert src.read_bytes() == before and journal.exists()  # kept: nothing guessed


def test_a_committed_journal_with_one_payload_byte_flipped_is_refused(tmp_path: Path) -> None:
    assert_corrupt_journal_refused(tmp_path)


def test_a_journal_of_an_older_ptestore_is_checked_by_its_commit_record(
    tmp_path: Path,
) -> None:
    """Journals of an older ptestore (the SHA-256 of everything before the commit
    record) are still applied, and a flipped payload byte is refused by that digest."""
    (tmp_path / "a").mkdir()
    assert_corrupt_journal_refused(tmp_path / "a", old=True)
    new = staged(tmp_path, [SPEC])
    src = _torn(tmp_path, "old.pte")
    older = _as_older_ptestore(Path(journal_path(str(src))))
    assert ptestore.recover(src) == "rolled forward" and src.read_bytes() == new
    assert not older.exists()


def test_the_payload_check_is_what_refuses_a_flipped_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted bug: a recover that skips the payload check rolls the corrupt bytes
    forward, and the test above fails."""
    import ptestore.journal_check as check_module

    monkeypatch.setattr(check_module, "check_payload", lambda target, journal, plan: "")
    (tmp_path / "planted").mkdir()
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):  # rolled forward
        assert_corrupt_journal_refused(tmp_path / "planted")
    src = tmp_path / "planted" / "flipped.pte"
    assert src.read_bytes()[4:8] == FX.pte_path.read_bytes()[4:8]  # type: ignore[union-attr]
    assert src.read_bytes() != staged(tmp_path, [SPEC])  # loadable, with corrupt bytes


def test_a_journal_whose_payload_did_not_reach_the_disk_is_discarded(tmp_path: Path) -> None:
    """One ``fsync`` makes the journal durable, so a power loss before it returned may
    keep the commit record and lose payload blocks (read back as zeros): the payload
    check finds the chunk that differs, and the file, not yet touched, keeps its
    bytes (the journal is discarded, as one without a commit record)."""
    src = _killed_before_marking(tmp_path, "lost.pte")
    journal = Path(journal_path(str(src)))
    plan = read_plan(str(journal))
    assert plan is not None
    data = bytearray(journal.read_bytes())
    _, jofs, n = next(w for w in plan["writes"] if w[0] > 0)  # the replacement
    data[jofs : jofs + min(n, 4096)] = bytes(min(n, 4096))  # a block lost
    journal.write_bytes(bytes(data))
    before = src.read_bytes()
    assert ptestore.recover(src) == "discarded"
    assert src.read_bytes() == before and not journal.exists()


def test_a_payload_that_cannot_be_checked_is_an_error_naming_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torn file cut short by someone else (its own bytes around the writes are
    missing), or a read that fails: a StorageError naming the file and the journal,
    not a verdict on the journal; both are left as they are."""
    import ptestore.journal_check as check_module

    src = _torn(tmp_path, "short.pte")
    journal = Path(journal_path(str(src)))
    kept = journal.read_bytes()
    with open(src, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(StorageError) as err:
        ptestore.recover(src)
    assert re.fullmatch(
        rf"{re.escape(str(src))}: \d+ bytes at offset \d+ where checking its in-place journal "
        r"needs \d+ \(the file is shorter than its plan says\); not applied",
        str(err.value),
    ), str(err.value)
    assert src.stat().st_size == 1000 and journal.read_bytes() == kept

    src = _torn(tmp_path, "eio.pte")
    journal = Path(journal_path(str(src)))
    before = src.read_bytes()

    def failing(*args: object) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(check_module, "_sha256", failing)
    with pytest.raises(StorageError) as err:
        ptestore.recover(src)
    assert str(err.value) == (
        f"{src}: cannot check its in-place journal {journal}: Input/output error; not "
        "applied, both left as they are"
    )
    assert src.read_bytes() == before and journal.exists()


def test_a_flipped_byte_of_the_plan_or_the_trailer_is_refused(tmp_path: Path) -> None:
    """The commit record covers the plan; the plan covers the trailer written past the
    content (an in-place run with provenance): a byte flipped in either is refused."""
    probe = copy(tmp_path, "probe.pte")
    calls = _calls_killed_at(probe, 10**9, provenance=True)
    assert calls is not None
    for what in ("plan", "trailer"):
        src = copy(tmp_path, f"{what}.pte")
        assert _calls_killed_at(src, len(calls) // 2, provenance=True) is None  # torn
        journal = Path(journal_path(str(src)))
        plan = read_plan(str(journal))
        assert plan is not None
        data = journal.read_bytes()
        plan_at = data.rindex(b'{"check"')
        content = plan["check"]["length"]
        trailer_at = next(jofs for dst, jofs, _ in plan["writes"] if dst >= content)
        _flip_payload_byte(journal, plan_at + 20 if what == "plan" else trailer_at + 20)
        with pytest.raises(StorageError) as err:
            ptestore.recover(src)
        if what == "plan":
            assert "(the SHA-256 of its plan and footer (bytes " in str(err.value)
            assert ") does not match its commit record)" in str(err.value)
        else:
            assert re.search(
                rf"\(its write of \d+ bytes at {content} has SHA-256 [0-9a-f]{{64}}, its plan "
                r"says [0-9a-f]{64}\)",
                str(err.value),
            ), str(err.value)
        assert journal.exists() and src.read_bytes()[4:8] == CHANGING


def test_a_torn_file_whose_journal_is_damaged_is_reported_damaged_not_untouched(
    tmp_path: Path,
) -> None:
    src = _torn(tmp_path, "t.pte")
    journal = Path(journal_path(str(src)))
    journal.write_bytes(journal.read_bytes()[:-40])  # the commit record gone
    for call in (
        lambda: ptestore.recover(src),
        lambda: ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[SPEC], in_place=True),
        lambda: ptestore.describe(src),
    ):
        with pytest.raises(
            StorageError,
            match=re.escape(
                f"{src}: damaged: the file is marked as being changed in place (PTJ~ in place "
                f"of its identifier; the ExecuTorch runtime refuses it) and its journal "
                f"{journal} is invalid (no commit record at its end), so it cannot be completed"
            ),
        ):
            call()
    assert src.read_bytes()[4:8] == CHANGING and journal.exists()


# ------------------------------------------- SIGKILL at every step, same size and grown
@pytest.mark.parametrize("how", ["same size", "grown"])
def test_sigkill_at_every_step_of_applying_then_recover(tmp_path: Path, how: str) -> None:
    """Every call that touches the file, for a same-size replacement and for a grown
    one (reserve the growth, mark, punch the old range, metadata, the moved segment at
    the end, size, identifier): killed right before it, the file is the old one, the
    new one or marked as changing; ``recover`` rolls a committed journal forward to what
    an uninterrupted run gives (for a same-size one, the staged output), and discards
    an uncommitted one with the file as it was."""
    from ptestore.journal import read_plan

    if how == "same size":
        source, backends = FX.pte_path, [SPEC]
    else:
        source = tmp_path / "big-source.pte"
        inflate(FX.pte_path, source, 1 << 20)
        backends = [ReplaceKey("XnnpackBackend", KEY, extra=8192, alignment=64)]
    assert source is not None
    old = Path(source).read_bytes()
    probe = tmp_path / "probe.pte"
    shutil.copyfile(source, probe)
    steps = _calls_killed_at(probe, 10**9, backends=backends)
    assert steps is not None
    new = probe.read_bytes()  # a grown segment moves to the end: not the staged layout
    if how == "same size":
        assert new == staged(tmp_path, backends)
    if how == "grown":  # reserve (before the commit), mark, punch, the moved segment
        assert steps[:3] == ["fallocate", "pwrite", "fsync"], steps
        assert "fallocate" in steps[3:] and "copy_file_range" in steps, steps
    else:
        assert "fallocate" not in steps, steps
    outcomes = set()
    for nth, step in enumerate(steps):
        phase = f"{how}: killed before call {nth} ({step}) of {steps}"
        src = tmp_path / f"k{nth}.pte"
        shutil.copyfile(source, src)
        assert _kill_at(src, nth, backends=backends) == -1, phase
        data = src.read_bytes()
        assert data in (old, new) or data[4:8] == CHANGING, phase
        journal = journal_path(str(src))
        committed = read_plan(journal) is not None
        result = ptestore.recover(src)
        assert result == ("rolled forward" if committed else "discarded"), phase
        assert src.read_bytes() == (new if committed else old), phase
        assert not Path(journal).exists(), phase
        outcomes.add((data[4:8] == CHANGING, committed))
    assert (True, True) in outcomes  # torn files were tried


# ------------------------- in place never specializes its own output again (issue 29 1, C)
def _calls(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def _content(path: Path) -> bytes:
    """The bytes before the provenance trailer (what the record's digest names)."""
    size = ptestore.describe(path)["provenance"]["content"]["size"]
    return path.read_bytes()[:size]


def _specialized_once(tmp_path: Path) -> bytes:
    """What one uninterrupted ``ensure(in_place=True)`` leaves before its trailer."""
    ref = copy(tmp_path, "reference.pte")
    ptestore.ensure(ref, cache_dir=tmp_path / "ref-cache", backends=[SPEC], in_place=True)
    return _content(ref)


@pytest.mark.parametrize(
    "route",
    [
        "killed while applying, recovered",
        "killed while applying, not recovered",
        "killed before the manifest",
        "cache cleared",
    ],
)
def test_in_place_ensure_never_specializes_its_output_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """The file is the output already (its trailer records these backends and versions
    for this device, and its content is intact): the next ``ensure(in_place=True)``
    adopts it as the entry, without running the backend again (a doubled weight stays
    doubled, not x4)."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(calls))
    once = _specialized_once(tmp_path)
    assert _calls(calls) == 1
    src, cache = copy(tmp_path), tmp_path / "cache"
    if route == "cache cleared":
        ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
        ptestore.device.clear(cache)
    elif route == "killed before the manifest":
        assert _calls_killed_at(src, -1, ensure_cache=cache) is None
        assert not Path(journal_path(str(src))).exists()  # applied, journal removed
    else:
        probe = copy(tmp_path, "probe.pte")
        steps = _calls_killed_at(probe, 10**9, ensure_cache=tmp_path / "probe-cache")
        assert steps is not None
        assert _calls_killed_at(src, len(steps) // 2, ensure_cache=cache) is None
        assert src.read_bytes()[4:8] == CHANGING
        if "not recovered" not in route:
            assert ptestore.recover(src) == "rolled forward"
    ran = _calls(calls)
    assert _content(src) == once or "not recovered" in route
    if "not recovered" not in route:  # the record's chunk digests are the bytes', every one
        with open_loader(src) as loader:
            assert check_bytes(loader).chunks >= 1, route
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert _calls(calls) == ran  # the backend did not run again
    assert a.created and a.in_place and a.specialized and a.pte == str(src)
    assert _content(src) == once
    b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert not b.created and _calls(calls) == ran and _content(src) == once
    with open_loader(src) as loader:
        assert check_bytes(loader).chunks >= 1
    assert ptestore.verify(src).status == "intact"


def _upgraded(version: str) -> Any:
    from support.doubling_backend import Doubling

    d = Doubling("mlp_xnnpack")
    d.version = version
    return d


@pytest.mark.parametrize("provenance", [True, False], ids=["its trailer", "the cache's record"])
def test_an_upgrade_in_place_needs_the_portable_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provenance: bool
) -> None:
    """A backend upgraded after an in-place run: the file is the old version's output
    (its trailer says so; without a trailer, the entry's manifest recorded this very
    file as rewritten), so it is refused, unchanged, with what to do; given the
    portable source, the new version specializes that, once."""
    from ptestore.errors import AlreadySpecialized

    want = staged(tmp_path, [SPEC])  # the portable source doubled once
    calls = tmp_path / "calls"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(calls))
    src, cache = copy(tmp_path), tmp_path / "cache"
    kw: dict[str, Any] = {"cache_dir": cache, "in_place": True, "provenance": provenance}
    ptestore.ensure(src, backends=[_upgraded("1.0")], **kw)
    before = src.read_bytes()
    with pytest.raises(AlreadySpecialized) as err:
        ptestore.ensure(src, backends=[_upgraded("2.0")], **kw)
    msg = str(err.value)
    assert msg.startswith(f"{src}: already specialized")
    if provenance:
        assert (
            "(its provenance trailer records backends [support.doubling_backend:Doubling "
            f"1.0] for no device, made from {src} (sha256-tree:" in msg
        )
    else:
        assert (
            "the cache's entry" in msg
            and "backends were [['support.doubling_backend:"
            "Doubling', '1.0']], now [['support.doubling_backend:Doubling', '2.0']]"
            in msg
        )
    assert "specializing it again would apply the backends to their own output" in msg or (
        "specializing it in place again would apply the backends to their own output" in msg
    )
    assert "portable=PATH" in msg and "--portable PATH" in msg
    assert isinstance(err.value, ConfigurationError) and err.value.path == str(src)
    assert src.read_bytes() == before and _calls(calls) == 1
    portable = tmp_path / "portable.pte"
    shutil.copyfile(FX.pte_path, portable)  # type: ignore[arg-type]
    a = ptestore.ensure(src, backends=[_upgraded("2.0")], portable=portable, **kw)
    assert a.created and a.pte == str(src) and _calls(calls) == 2
    assert src.read_bytes()[: len(want)] == want
    if provenance:
        assert a.provenance is not None and a.provenance.requested[0].version == "2.0"
    b = ptestore.ensure(src, backends=[_upgraded("2.0")], **kw)  # a hit, no portable needed
    assert not b.created and _calls(calls) == 2


def test_specialize_in_place_refuses_an_already_specialized_file(tmp_path: Path) -> None:
    from ptestore.errors import AlreadySpecialized

    src = copy(tmp_path)
    ptestore.specialize(src, src, backends=[SPEC], in_place=True)
    before = src.read_bytes()
    with pytest.raises(
        AlreadySpecialized,
        match=re.escape(
            f"{src}: already specialized (its provenance trailer records backends "
            f"[{SPEC} 1.0] for no device, made from {src} (sha256-tree:"
        ),
    ):
        ptestore.specialize(src, src, backends=[SPEC], in_place=True)
    assert src.read_bytes() == before and not Path(journal_path(str(src))).exists()
    # a staged copy that nothing changed is still the portable model: accepted
    copied = tmp_path / "copied.pte"
    ptestore.specialize(FX.pte_path, copied, backends=["passthrough"])
    ptestore.specialize(copied, copied, backends=[SPEC], in_place=True)
    assert _content(copied) == staged(tmp_path, [SPEC])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"in_place": False},
            "portable= is the source an in-place entry is made from; it "
            "applies with in_place=True only (CLI: --in-place --portable PATH), or with an "
            "index (model=): a local copy of the model's portable source to fetch from",
        ),
        (
            {"in_place": True, "same": True},
            "portable= names the file rewritten in place "
            "itself; it must be the original (portable) .pte",
        ),
    ],
)
def test_portable_refusals(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    src = copy(tmp_path)
    portable = src if kwargs.pop("same", False) else copy(tmp_path, "portable.pte")
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[SPEC], portable=portable, **kwargs)
    assert src.read_bytes() == FX.pte_path.read_bytes()  # type: ignore[union-attr]


def test_cli_ensure_in_place_portable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ptestore ensure SRC --in-place`` refuses an output that is not current (made for
    no device, asked for one; exit 2, the message says what to pass), and
    ``--portable PTE`` makes it from the original."""
    from ptestore.cli import main

    src, cache = copy(tmp_path), tmp_path / "cache"
    portable = copy(tmp_path, "portable.pte")
    ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    ptestore.device.clear(cache)
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", SPEC, "--in-place"]
    argv += ["--device", "phone"]
    before = src.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore ensure: error: {src}: already specialized (its "), err
    assert "--portable PATH" in err and src.read_bytes() == before
    assert main([*argv, "--portable", str(portable), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pte"] == str(src) and out["created"] and out["in_place"]
    assert out["provenance"]["device"]["name"] == "phone"
    assert out["provenance"]["source"]["url"] == str(portable)
    want = staged(tmp_path, [SPEC])
    assert src.read_bytes()[: len(want)] == want
    assert main(argv) == 0  # a hit now, without --portable
    assert capsys.readouterr().out.strip() == str(src)


def test_a_staged_portable_copy_a_crash_leaves_is_collected_by_gc(tmp_path: Path) -> None:
    """Killed between the coordinator's publish of the staged copy and its rename over
    the model: the copy left beside the model is named as a writer's staging file, so
    ``ptestore gc`` collects it; the model is unchanged. While an ensure holds it, gc
    leaves it alone (it is locked as a writer's is)."""
    from ptestore.gc import collect_local
    from ptestore.writers.local import TEMP_NAME_RE

    src, cache = copy(tmp_path), tmp_path / "cache"
    portable = copy(tmp_path, "portable.pte")
    ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    ptestore.device.clear(cache)
    before = src.read_bytes()
    seen: list[list[str]] = []

    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        import ptestore.storage.atomic as atomic

        def killed(a: str, b: str) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        atomic.rename = killed  # type: ignore[assignment]
        try:
            ptestore.ensure(
                src,
                cache_dir=cache,
                backends=[SPEC],
                in_place=True,
                portable=portable,
                device=DeviceProfile("phone"),
            )
        finally:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert src.read_bytes() == before
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pte.")]
    assert len(left) == 1 and TEMP_NAME_RE.match(left[0]), left
    held = os.open(tmp_path / left[0], os.O_RDONLY)  # as a live ensure holds it
    try:
        import fcntl

        fcntl.flock(held, fcntl.LOCK_EX)
        found = collect_local(tmp_path, older_than=0)
        seen.append([e.action for e in found if e.location.endswith(left[0])])
    finally:
        os.close(held)
    assert seen == [["skipped: in use by a live writer"]]
    found = collect_local(src, older_than=0)  # gc given the model's own path
    assert [(Path(e.location).name, e.action) for e in found] == [(left[0], "removed")]
    assert src.read_bytes() == before and not (tmp_path / left[0]).exists()


# ------------------------------------------ Ctrl-C while applying (issue 29 item 2)
def _cli_signalled_at(src: Path, cache: Path, nth: int, signum: int, err: Path) -> int:
    """``ptestore ensure SRC --in-place`` (the CLI's ``main``) in a forked child that
    sends itself ``signum`` right before its ``nth`` call touching the model file;
    its stderr goes to ``err``; returns its exit status."""
    from ptestore.cli import main

    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)  # flushed below
            seen = [0]
            target = str(src)
            for call in ("pwrite", "fsync", "ftruncate", "copy_file_range"):
                real = getattr(os, call)

                def wrapped(fd: int, *args: Any, _real: Any = real, _call: str = call) -> Any:
                    written = args[0] if _call == "copy_file_range" else fd
                    try:
                        path = os.readlink(f"/proc/self/fd/{written}")
                    except OSError:
                        path = ""
                    if path == target:
                        if seen[0] == nth:
                            os.kill(os.getpid(), signum)
                        seen[0] += 1
                    return _real(fd, *args)

                setattr(os, call, wrapped)
            argv = ["ensure", target, "--cache-dir", str(cache), "--backend", SPEC]
            code = main([*argv, "--in-place"])
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


@pytest.mark.parametrize(
    ("signum", "by"), [(signal.SIGINT, ""), (signal.SIGTERM, " by SIGTERM")], ids=["C", "TERM"]
)
def test_ctrl_c_while_applying_completes_the_file_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, by: str
) -> None:
    """Interrupted between the file's mark and its identifier: the journal is committed,
    so the change is completed, and recorded in the cache, before the CLI exits 130,
    saying so (not "nothing was published" with a torn file and a journal beside it);
    the next ensure is a hit."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(calls))
    once = _specialized_once(tmp_path)
    src, cache, err = copy(tmp_path), tmp_path / "cache", tmp_path / "stderr"
    assert _cli_signalled_at(src, cache, 2, signum, err) == 130
    assert err.read_text() == (
        f"ptestore ensure: interrupted{by} while {src} was rewritten in place: the change "
        "was completed first (its journal was committed, so it was applied to the end): "
        "the file is the specialized model, loadable\n"
    )
    assert not Path(journal_path(str(src))).exists()
    assert src.read_bytes()[4:8] == FX.pte_path.read_bytes()[4:8]  # type: ignore[union-attr]
    assert _content(src) == once and _calls(calls) == 2
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert not a.created and _calls(calls) == 2 and _content(src) == once


class GrownDoubling(BackendInterface):
    """Doubles the fixture's weight and pads it with 4 KiB of zeros: a grown segment
    (moved to the end, its old range punched) that the runtime still runs, with the
    doubled outputs."""

    name = "XnnpackBackend"
    version = "1.0"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        assert FX.doubled is not None
        value = bytes(context.get_named_data_map().get_data(KEY))
        data = FX.doubled.doubled_value(value) + bytes(4096)
        output.write_named_data(KEY, BackendData(data, alignment=64, allow_size_change=True))


def grown_kill_states(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``(phase, file as the kill left it)`` before every call of a grown in-place run."""
    probe = copy(tmp_path, "grown-probe.pte")
    steps = _calls_killed_at(probe, 10**9, backends=[GrownDoubling()])
    assert steps is not None and "fallocate" in steps and "copy_file_range" in steps, steps
    for nth, step in enumerate(steps):
        src = copy(tmp_path, f"grown-k{nth}.pte")
        assert _calls_killed_at(src, nth, backends=[GrownDoubling()]) is None
        yield f"grown, killed before call {nth} ({step})", src
