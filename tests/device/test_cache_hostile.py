"""What lies in a cache directory that the cache did not put there: a FIFO, a link or a
directory at a manifest, a symbolic link as an entry or a lock file, stray names under
``entries/``, a manifest nested too deeply or with a damaged provenance record, a killed
XNNPACK maker's work directory, a read-only mount. None of them hangs, crashes, deletes
anything outside the cache, or stops ``cache prune``."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from support.blocks import allocated_under
from support.fixtures import copy_pte
from support.smallfs import tmpfs

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import cache, list_entries, prune
from ptestore.device.entryfiles import clean_entry_locked
from ptestore.device.keys import entry_key
from ptestore.device.layout import CacheLayout, read_manifest
from ptestore.errors import FormatError, PermissionDenied, StorageError

SPEC = "support.counting_backend:Counting=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0, "soc": "sm8650"})


@pytest.fixture(autouse=True)
def _no_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)


def _ensure(src: Path, cache_dir: Path, **kw: object) -> ptestore.device.Artifact:
    return ptestore.ensure(src, cache_dir=cache_dir, backends=[SPEC], device=DEVICE, **kw)


def _in_thread(func: object, ceiling: float = 60.0) -> object:
    """``func()`` in a thread; fails (instead of hanging the suite) past a generous
    ceiling: what a blocking open would do."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = func()  # type: ignore[operator]
        except BaseException as exc:  # handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(ceiling)
    assert not t.is_alive(), "blocked (a FIFO opened for reading?)"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value")


def test_a_fifo_at_a_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    src = copy_pte(tmp_path / "m.pte")
    a = _ensure(src, tmp_path / "cache")
    man = tmp_path / "cache" / "entries" / a.key / "manifest.json"
    man.unlink()
    os.mkfifo(man, 0o644)
    with pytest.raises(
        StorageError,
        match=r"manifest.json: the cache entry's manifest is "
        r"not a regular file \(prw-r--r--\)",
    ):
        _in_thread(lambda: read_manifest(str(man)))
    (entry,) = _in_thread(lambda: list_entries(tmp_path / "cache"))
    assert entry.state == "broken"
    again = _in_thread(lambda: _ensure(src, tmp_path / "cache"))
    assert again.created and man.is_file()  # made again, the FIFO replaced


def test_a_link_or_a_directory_at_a_manifest_is_broken_and_pruned(tmp_path: Path) -> None:
    one, two = copy_pte(tmp_path / "one.pte"), copy_pte(tmp_path / "two.pte")
    a, b = _ensure(one, tmp_path / "cache"), _ensure(two, tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere.json"
    man_a = Path(a.pte).parent / "manifest.json"
    elsewhere.write_bytes(man_a.read_bytes())
    man_a.unlink()
    man_a.symlink_to(elsewhere)
    with pytest.raises(
        StorageError, match="cannot read the cache entry's manifest: it is a symbolic link"
    ):
        read_manifest(str(man_a))
    man_b = Path(b.pte).parent / "manifest.json"
    man_b.unlink()
    man_b.mkdir()
    assert {e.state for e in list_entries(tmp_path / "cache")} == {"broken"}
    done = prune(tmp_path / "cache")
    assert sorted(done.removed) == sorted([a.key, b.key])
    assert elsewhere.is_file()  # the link's target is not the cache's


def test_stray_names_under_entries_are_not_entries(tmp_path: Path) -> None:
    one, two = copy_pte(tmp_path / "one.pte"), copy_pte(tmp_path / "two.pte")
    cache_dir = tmp_path / "cache"
    a = _ensure(one, cache_dir)
    entries = cache_dir / "entries"
    (entries / "notes.txt").write_text("hi")
    (entries / ("f" * 32)).write_text("a file named as a key")
    (entries / "somedir").mkdir()
    assert [e.key for e in list_entries(cache_dir)] == [a.key]
    assert main(["cache", "prune", "--cache-dir", str(cache_dir)]) == 0
    b = _ensure(two, cache_dir, max_bytes=os.path.getsize(a.pte) * 3 // 2)
    assert b.created and not Path(a.pte).exists()  # evicted, the strays left alone
    assert (entries / "notes.txt").read_text() == "hi" and (entries / "somedir").is_dir()
    assert main(["cache", "clear", "--cache-dir", str(cache_dir)]) == 0
    assert sorted(os.listdir(entries)) == sorted(["notes.txt", "f" * 32, "somedir"])


def test_a_symlinked_entry_is_refused_and_nothing_outside_the_cache_goes(
    tmp_path: Path,
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    victim = tmp_path / "my-documents"
    victim.mkdir()
    for name in ("thesis.tex", "manifest.json", "model.pte"):
        (victim / name).write_text("precious")
    CacheLayout(cache_dir).create()
    key = entry_key(str(src), None, [SPEC], DEVICE, False, True)
    link = cache_dir / "entries" / key
    link.symlink_to(victim)
    with pytest.raises(PermissionDenied) as err:
        _ensure(src, cache_dir)
    assert str(err.value) == (
        f"{link}: the cache entry is a symbolic link, not a directory: ensure would read, "
        "clean and remove files through it; ptestore uses only entry directories it made. "
        f"Fix: rm {link} (or use another --cache-dir)"
    )
    assert list_entries(cache_dir) == []
    prune(cache_dir, max_bytes=0)
    ptestore.device.clear(cache_dir)
    assert cache.remove_entry_locked(CacheLayout(cache_dir), key) == 0
    assert clean_entry_locked(CacheLayout(cache_dir).entry_dir(key), None) == 0
    assert sorted(os.listdir(victim)) == ["manifest.json", "model.pte", "thesis.tex"]
    assert link.is_symlink()


def test_a_symlink_at_a_lock_file_is_not_followed(tmp_path: Path) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    CacheLayout(cache_dir).create()
    key = entry_key(str(src), None, [SPEC], DEVICE, False, True)
    target = tmp_path / "created-through-the-link"
    lock = cache_dir / "locks" / f"{key}.lock"
    lock.symlink_to(target)
    with pytest.raises(StorageError) as err:
        _ensure(src, cache_dir)
    assert str(err.value) == f"{lock}: cannot open the cache lock file: it is a symbolic link"
    assert not target.exists()


def test_a_deeply_nested_manifest_is_a_format_error_not_a_crash(tmp_path: Path) -> None:
    one, two = copy_pte(tmp_path / "one.pte"), copy_pte(tmp_path / "two.pte")
    cache_dir = tmp_path / "cache"
    a = _ensure(one, cache_dir)
    man = Path(a.pte).parent / "manifest.json"
    man.write_text("[" * 100000)
    with pytest.raises(FormatError, match=r"JSON \(it is nested too deeply to read\)"):
        read_manifest(str(man))
    assert [e.state for e in list_entries(cache_dir)] == ["broken"]
    for args in (["ls"], ["prune", "--stale"]):
        assert main(["cache", *args, "--cache-dir", str(cache_dir)]) == 0
    b = _ensure(two, cache_dir, max_bytes=0)
    assert b.created and [e.key for e in list_entries(cache_dir)] == [b.key]
    again = _ensure(one, cache_dir)
    assert again.created  # the broken entry was made again


def test_a_manifest_version_true_is_refused(tmp_path: Path) -> None:
    """``True == 1`` in Python: a manifest whose version was ``true`` was read as
    version 1."""
    src = copy_pte(tmp_path / "m.pte")
    a = _ensure(src, tmp_path / "cache")
    man = Path(a.pte).parent / "manifest.json"
    data = json.loads(man.read_text())
    data["version"] = True
    man.write_text(json.dumps(data))
    with pytest.raises(FormatError) as err:
        read_manifest(str(man))
    assert str(err.value) == f"{man}: manifest version = True: must be 1"
    assert [e.state for e in list_entries(tmp_path / "cache")] == ["broken"]


@pytest.mark.parametrize("damage", ["garbage", {}])
def test_a_damaged_provenance_field_is_a_miss_and_broken(tmp_path: Path, damage: object) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    a = _ensure(src, cache_dir)
    man = Path(a.pte).parent / "manifest.json"
    data = json.loads(man.read_text())
    data["provenance"] = damage
    man.write_text(json.dumps(data))
    (entry,) = list_entries(cache_dir)
    assert entry.state == "broken"
    again = _ensure(src, cache_dir)
    assert again.created and again.provenance.source == a.provenance.source
    (entry,) = list_entries(cache_dir)
    assert entry.state == "ready"
    data["provenance"] = damage
    data["fingerprint"] = json.loads(man.read_text())["fingerprint"]
    man.write_text(json.dumps(data))
    assert prune(cache_dir).removed == [a.key]  # prune clears it


def test_a_killed_makers_work_directory_is_removed_and_counted(tmp_path: Path) -> None:
    """What a SIGKILL inside ``make_cache`` leaves (``.xnnpack-<id>.XXXX/`` with a partial
    file): counted in the entry's bytes, removed by the next make and by prune."""
    src = copy_pte(tmp_path / "m.pte")
    cache_dir = tmp_path / "cache"
    a = _ensure(src, cache_dir)
    entry = Path(a.pte).parent
    work = entry / ".xnnpack-0123abcd.k2j3"
    (work / "out").mkdir(parents=True)
    (work / "packed.xpwc").write_bytes(b"\0" * 5000)
    (work / "out" / "o.bin").write_bytes(b"\0" * 1000)
    (entry_bytes,) = [e.bytes for e in list_entries(cache_dir)]
    assert entry_bytes == os.path.getsize(a.pte) + os.path.getsize(entry / "manifest.json") + 6000
    prune(cache_dir)
    assert not work.exists() and Path(a.pte).exists()
    (work / "out").mkdir(parents=True)
    (work / "packed.xpwc").write_bytes(b"\0" * 5000)
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new version
    assert _ensure(src, cache_dir).created
    assert not work.exists()


def test_a_read_only_cache_serves_hits(tmp_path: Path) -> None:
    src = copy_pte(tmp_path / "m.pte")
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        cache_dir = mnt / "cache"
        a = _ensure(src, cache_dir)
        key = a.key
        os.unlink(cache_dir / "locks" / f"{key}.lock")  # none for this key: nothing to hold
        two = copy_pte(tmp_path / "two.pte")
        b = _ensure(two, cache_dir)  # this one keeps its lock file
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        hit_a, hit_b = _ensure(src, cache_dir), _ensure(two, cache_dir)
        assert (hit_a.pte, hit_a.created) == (a.pte, False)
        assert (hit_b.pte, hit_b.created) == (b.pte, False)
        three = copy_pte(tmp_path / "three.pte")
        with pytest.raises(StorageError, match="cannot open the cache lock file: Read-only"):
            _ensure(three, cache_dir)  # a miss needs a writable cache


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_clear_that_cannot_remove_a_lock_file_says_what_it_did() -> None:
    """``clear`` by the cache's owner whose ``locks/`` it cannot write (mode 0555): the
    first entry goes, its lock file cannot: a StorageError naming the lock file, what
    was removed and what is kept (it used to be a bare PermissionError)."""
    import shutil
    import tempfile

    from support.as_user import NOBODY, as_user, give_tree

    from ptestore.device import clear

    root = Path(tempfile.mkdtemp(prefix="ptestore-clear-"))
    try:
        os.chmod(root, 0o755)
        cache_dir = root / "cache"
        a = _ensure(copy_pte(root / "a.pte"), cache_dir)
        b = _ensure(copy_pte(root / "b.pte"), cache_dir)
        give_tree(cache_dir, NOBODY)
        os.chmod(cache_dir / "locks", 0o555)
        first = min(a.key, b.key)
        held = allocated_under(cache_dir / "entries" / first)
        got = as_user(NOBODY, lambda: clear(cache_dir))
        lock = cache_dir / "locks" / f"{first}.lock"
        assert got == (
            f"StorageError: {cache_dir}: cache clear stopped: {lock}: cannot remove the "
            f"cache lock file: Permission denied; it had removed 1 entry ({held} bytes "
            "freed), 1 entry kept"
        )
        assert [e.key for e in list_entries(cache_dir)] == [max(a.key, b.key)]
        assert lock.exists()
    finally:
        os.chmod(root / "cache" / "locks", 0o755)
        shutil.rmtree(root)


def test_list_entries_of_a_file_names_it(tmp_path: Path) -> None:
    """A regular file given as the cache directory (or as its ``entries/``): a
    ConfigurationError naming it, as prune and the CLI refuse it, not NotADirectoryError."""
    from ptestore.errors import ConfigurationError

    f = tmp_path / "notes.txt"
    f.write_text("not a cache")
    with pytest.raises(ConfigurationError) as err:
        list_entries(f)
    assert str(err.value) == (
        f"{f}: not a directory; a cache directory (cache_dir) and its entries/ are directories"
    )
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "entries").write_text("")
    with pytest.raises(ConfigurationError) as err:
        list_entries(cache_dir)
    assert str(err.value) == (
        f"{cache_dir}/entries: not a directory; a cache directory (cache_dir) and its "
        "entries/ are directories"
    )
