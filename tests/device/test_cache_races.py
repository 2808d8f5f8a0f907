"""The cache against what happens between two of its steps, each reproduced
deterministically by a hook: an entry made or used between prune's or eviction's
judgment and its lock; a model replaced right after its in-place rewrite; a same-size
update that keeps its timestamps; a full disk at the manifest; lock files of keys
without an entry, removed while another process opened one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.doubling_backend import Doubling
from support.fixtures import copy_pte

import ptestore
import ptestore.coordinator.inplace as inplace
import ptestore.storage.atomic as atomic
from ptestore.backends.compat import DeviceProfile
from ptestore.device import cache, clear, evict, list_entries, prune
from ptestore.device.keys import entry_key
from ptestore.device.layout import CacheEntry, CacheLayout
from ptestore.device.lock import KeyLock
from ptestore.device.stale import prune_stale
from ptestore.errors import PreconditionFailed, StorageError
from ptestore.journal import journal_path
from ptestore.provenance.stamp import describe_source
from ptestore.storage.loaders import open_loader

SPEC = "support.counting_backend:Counting=1.0"
SPEC_DOUBLING = "support.doubling_backend:Doubling=mlp_xnnpack"
DEVICE = DeviceProfile("phone", {"scale": 2.0, "soc": "sm8650"})


@pytest.fixture(autouse=True)
def _no_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)


def _ensure(src: Path, cache_dir: Path, **kw: Any) -> ptestore.device.Artifact:
    return ptestore.ensure(src, cache_dir=cache_dir, backends=[SPEC], device=DEVICE, **kw)


def _after_first_judgment(monkeypatch: pytest.MonkeyPatch, key: str, action: Any) -> None:
    """``action()`` runs right after the first ``load_entry`` of ``key`` (the listing's
    judgment), before prune or evict takes the key's lock."""
    orig = cache.load_entry
    done = []

    def judged(layout: CacheLayout, k: str) -> CacheEntry:
        entry = orig(layout, k)
        if k == key and not done:
            done.append(entry.state)
            action()
        return entry

    monkeypatch.setattr(cache, "load_entry", judged)


def test_prune_keeps_an_entry_made_after_it_was_judged_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    layout = CacheLayout(cache_dir)
    layout.create()
    key = entry_key(str(src), None, [SPEC], DEVICE, False, True)
    Path(layout.make_entry_dir(key), ".model.pte.staging").write_bytes(b"left by a killed run")
    made: list[ptestore.device.Artifact] = []
    _after_first_judgment(monkeypatch, key, lambda: made.append(_ensure(src, cache_dir)))
    done = prune(cache_dir)
    assert done.removed == [] and made and made[0].created
    assert Path(made[0].pte).is_file()
    (entry,) = list_entries(cache_dir)
    assert entry.state == "ready"


def test_evict_keeps_an_entry_used_after_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = copy_pte(tmp_path / "one.pte"), copy_pte(tmp_path / "two.pte")
    cache_dir = tmp_path / "cache"
    a, b = _ensure(one, cache_dir), _ensure(two, cache_dir)
    old = 1_000_000_000
    os.utime(Path(a.pte).parent / "manifest.json", (old, old))  # a: least recently used
    _after_first_judgment(monkeypatch, a.key, lambda: _ensure(one, cache_dir))  # a hit
    done = evict(cache_dir, os.path.getsize(a.pte) + 4096)
    assert done.removed == [b.key]  # a was used since: b is now the least recent
    assert Path(a.pte).is_file() and not Path(b.pte).exists()


def test_an_in_place_file_replaced_after_its_rewrite_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    portable = src.read_bytes()
    orig = inplace.specialize_or_adopt  # what ensure(in_place=True) calls

    def then_updated(path: Any, *args: Any, **kw: Any) -> Any:
        report = orig(path, *args, **kw)
        rewritten = os.stat(path).st_ino
        tmp = Path(str(path) + ".download")
        tmp.write_bytes(portable)
        os.replace(tmp, path)  # an app update lands right after the rewrite
        then_updated.inodes = (rewritten, os.stat(path).st_ino)  # type: ignore[attr-defined]
        return report

    monkeypatch.setattr(inplace, "specialize_or_adopt", then_updated)
    with pytest.raises(StorageError) as err:
        _ensure(src, cache_dir, in_place=True)
    rewritten, now = then_updated.inodes  # type: ignore[attr-defined]
    assert str(err.value) == (
        f"{src}: replaced by another file while it was specialized in place (the rewritten "
        f"file is inode {rewritten}, the path now names inode {now}); the new file is not "
        "specialized and nothing was recorded: call ensure again"
    )
    monkeypatch.setattr(inplace, "specialize_or_adopt", orig)
    again = _ensure(src, cache_dir, in_place=True)
    assert again.created and again.specialized and src.read_bytes() != portable


def test_two_in_place_ensures_with_other_caches_at_once_the_second_adopts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``ensure(in_place=True)`` of one file with different caches at once: the
    second looked at the file before the first rewrote it, and reaches the file's lock
    once the first is done (a hook runs the first whole when the second asks for the
    lock). It adopts the rewritten file under the lock, as a later call would
    (``created=True``): never AlreadySpecialized, never the backend over its output."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(calls))
    src = copy_pte(tmp_path / "m.pte")
    cache_a, cache_b = tmp_path / "cache-a", tmp_path / "cache-b"
    real = inplace.FileLock
    first: list[Any] = []

    def the_other_call_first(path: str, *args: Any, **kw: Any) -> Any:
        if not first:
            first.append(None)  # the other call's own lock is taken as it is
            first[0] = ptestore.ensure(
                src, cache_dir=cache_a, backends=[SPEC_DOUBLING], in_place=True
            )
        return real(path, *args, **kw)

    monkeypatch.setattr(inplace, "FileLock", the_other_call_first)
    b = ptestore.ensure(src, cache_dir=cache_b, backends=[SPEC_DOUBLING], in_place=True)
    a = first[0]
    assert a.created and a.specialized and a.pte == str(src)
    assert b.created and b.specialized and b.in_place and b.pte == str(src)
    assert b.provenance == a.provenance and calls.read_text().count("\n") == 1
    rewritten = src.read_bytes()
    monkeypatch.setattr(inplace, "FileLock", real)
    for cache_dir in (cache_a, cache_b):
        hit = ptestore.ensure(src, cache_dir=cache_dir, backends=[SPEC_DOUBLING], in_place=True)
        assert not hit.created and hit.provenance == a.provenance
    assert src.read_bytes() == rewritten and calls.read_text().count("\n") == 1


def test_an_in_place_ensure_that_waited_for_another_version_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, the other call with another version of the backend: what it made is
    not this call's, so this one is refused under the lock (AlreadySpecialized), the
    file left as the other call made it."""
    from ptestore.errors import AlreadySpecialized

    src = copy_pte(tmp_path / "m.pte")
    other = Doubling("mlp_xnnpack")
    other.version = "2.0"
    real = inplace.FileLock
    first: list[Any] = []

    def the_other_call_first(path: str, *args: Any, **kw: Any) -> Any:
        if not first:
            first.append(None)
            first[0] = ptestore.ensure(
                src, cache_dir=tmp_path / "cache-a", backends=[other], in_place=True
            )
            first.append(src.read_bytes())
        return real(path, *args, **kw)

    monkeypatch.setattr(inplace, "FileLock", the_other_call_first)
    with pytest.raises(AlreadySpecialized) as err:
        ptestore.ensure(
            src, cache_dir=tmp_path / "cache-b", backends=[SPEC_DOUBLING], in_place=True
        )
    record = first[0].provenance
    assert str(err.value) == (
        f"{src}: already specialized (its provenance trailer records backends "
        f"[{record.requested[0].spec} 2.0] for no device, made from {src} "
        f"({record.source.sha256})); specializing it in place again would apply the "
        "backends to their own output. Give the portable source (the original .pte): "
        "ensure(..., in_place=True, portable=PATH) or `ptestore ensure SRC --in-place "
        "--portable PATH`; or specialize the portable source to this file "
        "(ptestore.specialize(PORTABLE, SRC))"
    )
    assert src.read_bytes() == first[1] and list_entries(tmp_path / "cache-b") == []


def test_an_in_place_file_made_from_the_portable_source_then_replaced_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ensure(in_place=True, portable=)``: the specialized copy renamed over the file,
    then an app update lands there before the entry is recorded: refused (the identity
    recorded is the renamed copy's, fstat of it held open, not whatever the path names
    after the run), nothing recorded; the next call makes the entry."""
    src = copy_pte(tmp_path / "m.pte")
    portable = tmp_path / "portable.pte"
    portable.write_bytes(src.read_bytes())
    cache_dir = tmp_path / "cache"
    orig = atomic.rename
    inodes: list[int] = []

    def then_updated(a: str, b: str, **kw: Any) -> None:
        orig(a, b, **kw)
        if b == str(src) and not inodes:
            inodes.append(os.stat(src).st_ino)
            tmp = tmp_path / "m.pte.download"
            tmp.write_bytes(portable.read_bytes())
            os.replace(tmp, src)  # an app update lands right after the rename
            inodes.append(os.stat(src).st_ino)

    monkeypatch.setattr(atomic, "rename", then_updated)
    with pytest.raises(StorageError) as err:
        _ensure(src, cache_dir, in_place=True, portable=portable)
    assert str(err.value) == (
        f"{src}: replaced by another file while it was specialized in place (the rewritten "
        f"file is inode {inodes[0]}, the path now names inode {inodes[1]}); the new file is "
        "not specialized and nothing was recorded: call ensure again"
    )
    assert [p.name for p in tmp_path.iterdir() if "ptestore" in p.name] == []
    monkeypatch.setattr(atomic, "rename", orig)
    again = _ensure(src, cache_dir, in_place=True, portable=portable)
    assert again.created and again.specialized and src.read_bytes() != portable.read_bytes()
    assert not _ensure(src, cache_dir, in_place=True).created


def same_size_update(tmp_path: Path) -> tuple[Path, Path]:
    """``(model.pte, v2.pte)``: a source and its next version, one byte other, the same
    size, both with the mtime an archive restores (1980-01-01)."""
    src = copy_pte(tmp_path / "model.pte")
    data = bytearray(src.read_bytes())
    data[-1] ^= 1
    v2 = tmp_path / "v2.pte"
    v2.write_bytes(bytes(data))
    t = 315532800 * 10**9
    os.utime(src, ns=(t, t))
    os.utime(v2, ns=(t, t))
    return src, v2


def test_a_same_size_update_keeping_its_timestamps_is_made_again(tmp_path: Path) -> None:
    src, v2 = same_size_update(tmp_path)
    cache_dir = tmp_path / "cache"
    a = _ensure(src, cache_dir)
    subprocess.run(["cp", "--preserve=timestamps", str(v2), str(src)], check=True)
    assert (os.stat(src).st_mtime_ns, os.stat(src).st_size) == (
        v2.stat().st_mtime_ns,
        v2.stat().st_size,
    )
    (stale,) = prune_stale(cache_dir, dry_run=True).entries
    assert stale.reason == f"its source {src} changed (ctime_ns)"
    b = _ensure(src, cache_dir)
    assert b.created and b.provenance.source.sha256 != a.provenance.source.sha256


class _UpdatedDuringTheRun(Doubling):
    """Doubles the fixture's weight, then an update lands on the source under the run:
    ``v2`` (the same size, another byte elsewhere) copied over it, the same inode, and
    its times copied from ``v2`` (the same ``mtime``): ``cp -p``, an archive's fixed
    timestamps."""

    def __init__(self, src: Path, v2: Path) -> None:
        super().__init__("mlp_xnnpack")
        self.src, self.v2 = src, v2

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        super().initialize_backend_data(context, output)
        before = os.stat(self.src)
        shutil.copyfile(self.v2, self.src)
        shutil.copystat(self.v2, self.src)
        after = os.stat(self.src)
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        )
        # A clock without fine-grained change times may give the copy the tick the
        # source was made in (a real update comes long after): touched until it moves.
        while os.stat(self.src).st_ctime_ns == before.st_ctime_ns:
            os.chmod(self.src, after.st_mode)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_same_size_update_keeping_its_mtime_during_the_run_is_refused(
    tmp_path: Path, in_place: bool
) -> None:
    """The update lands while the backend runs: the run is refused (the loader's stamp
    has the change time), never a model mixed of the two versions recorded as the
    entry; the next call makes it from the update."""
    src = copy_pte(tmp_path / "model.pte")
    data = bytearray(src.read_bytes())
    data[5000] ^= 1  # v2: a byte of a weight the backend does not replace
    v2 = tmp_path / "v2.pte"
    v2.write_bytes(bytes(data))
    t = 315532800 * 10**9  # 1980-01-01, as an archive restores it
    os.utime(src, ns=(t, t))
    os.utime(v2, ns=(t, t))
    was = os.stat(src)
    cache_dir = tmp_path / "cache"
    backend = _UpdatedDuringTheRun(src, v2)
    with pytest.raises(PreconditionFailed) as err:
        ptestore.ensure(src, cache_dir=cache_dir, backends=[backend], in_place=in_place)
    now = os.stat(src)
    assert str(err.value) == (
        f"{src}: modified while being read (size {was.st_size} -> {now.st_size}, modified "
        f"{t} -> {t} ns, changed {was.st_ctime_ns} -> {now.st_ctime_ns} ns); its content "
        "may be a mix of two versions"
    )
    assert src.read_bytes() == bytes(data)  # the update as it landed, nothing mixed in
    assert not Path(journal_path(str(src))).exists()
    assert list_entries(cache_dir) == []  # nor the entry directory the run created
    again = ptestore.ensure(src, cache_dir=cache_dir, backends=[SPEC_DOUBLING], in_place=in_place)
    assert again.created and again.specialized
    with open_loader(v2) as loader:
        assert again.provenance.source.sha256 == describe_source(loader).sha256


def test_a_manifest_recorded_without_ctime_is_compared_as_before(tmp_path: Path) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    a = _ensure(src, cache_dir)
    man = Path(a.pte).parent / "manifest.json"
    data = json.loads(man.read_text())
    del data["ctime_ns"]  # as an older ptestore wrote it: no ctime_ns recorded
    assert "ctime_ns" not in data["fingerprint"]["source"]
    man.write_text(json.dumps(data))
    os.chmod(src, 0o600)  # changes ctime only
    hit = _ensure(src, cache_dir)
    assert not hit.created and hit.pte == a.pte
    assert prune_stale(cache_dir, dry_run=True).current == 1


@pytest.mark.parametrize("earlier", [False, True])
def test_a_full_disk_at_the_manifest_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, earlier: bool
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    if earlier:
        _ensure(src, cache_dir)
        st = os.stat(src)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new version
    orig = atomic.put_bytes

    def full(path: Any, *args: Any, **kw: Any) -> Any:
        if str(path).endswith("manifest.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return orig(path, *args, **kw)

    monkeypatch.setattr(atomic, "put_bytes", full)
    with pytest.raises(StorageError) as err:
        _ensure(src, cache_dir)
    said = (
        "the source is unchanged; the entry's earlier version (stale: never served again) "
        "was removed before it was made again, its room freed (the next call makes it)."
        if earlier
        else "the cache and the source are unchanged."
    )
    assert said in str(err.value)
    assert str(err.value).startswith(f"{cache_dir}: no space left on the file system")
    # The run's files went, and the entry directory: the one the run created, and the
    # earlier entry's it emptied (it stayed, an empty "incomplete" entry until prune)
    assert os.listdir(cache_dir / "entries") == []


def _orphan(cache_dir: Path, src: Path) -> Path:
    """A lock file with no entry, as an ensure that failed before its entry leaves."""
    key = entry_key(str(src), None, [SPEC], DEVICE, True, True)
    lock = CacheLayout(cache_dir).lock(key)
    with lock:
        pass
    return Path(lock.path)


def test_prune_and_clear_remove_lock_files_without_an_entry(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    a = _ensure(copy_pte(tmp_path / "kept.pte"), cache_dir)
    CacheLayout(cache_dir).create()
    orphans = [_orphan(cache_dir, copy_pte(tmp_path / f"m{i}.pte")) for i in range(3)]
    held = KeyLock(str(orphans[0]), blocking=False)
    assert held.acquire()  # an ensure of that key running now
    (cache_dir / "locks" / "not-a-key.lock").write_text("")
    prune(cache_dir)
    left = sorted(os.listdir(cache_dir / "locks"))
    assert left == sorted([f"{a.key}.lock", orphans[0].name, "not-a-key.lock"])
    held.release()
    clear(cache_dir)
    assert sorted(os.listdir(cache_dir / "locks")) == ["not-a-key.lock"]


def test_a_waiter_on_a_removed_orphan_lock_locks_the_file_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ensure opened the lock file; prune removes it before the ensure's ``flock``:
    the ensure then finds the path gone and locks a new file there, so it never holds
    a lock file no one else can find."""
    cache_dir = tmp_path / "cache"
    CacheLayout(cache_dir).create()
    path = _orphan(cache_dir, copy_pte(tmp_path / "m.pte"))
    import ptestore.device.lock as lockmod
    from ptestore.device.orphans import remove_orphan_locks

    real = lockmod.fcntl
    removed: list[list[str]] = []

    class Hooked:
        LOCK_SH, LOCK_EX, LOCK_NB = real.LOCK_SH, real.LOCK_EX, real.LOCK_NB

        @staticmethod
        def flock(fd: int, op: int) -> None:
            if not removed:  # the waiter's first flock: its file opened, not yet locked
                removed.append([])  # (prune's own flock below is not hooked)
                removed[0] += remove_orphan_locks(
                    str(cache_dir / "entries"), str(cache_dir / "locks")
                )
            real.flock(fd, op)

    monkeypatch.setattr(lockmod, "fcntl", Hooked)
    waiter = KeyLock(str(path))
    assert waiter.acquire()
    try:
        assert removed == [[path.name[: -len(".lock")]]]
        assert path.is_file()  # locked anew at the path:
        assert not KeyLock(str(path), blocking=False).acquire()  # others see it held
    finally:
        waiter.release()
