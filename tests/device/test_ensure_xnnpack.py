"""``ensure(..., xnnpack_cache=True)`` with the real runtime (executorch 1.4.1): the
packed-weight file made beside the entry, found on a hit, rebuilt when corrupt, counted
and listed with the entry, and loaded by a fresh process bit-identically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.xnnpack_probe import REPO, env, flip, fresh_load

from ptestore.device import cache, ensure, list_entries
from ptestore.device.cache import remove_entry_locked
from ptestore.device.layout import CacheLayout
from ptestore.device.packed import with_packed_weights
from ptestore.errors import ConfigurationError, StorageError
from ptestore.testing.runtime import runtime_unavailable

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

FIXTURES = REPO / "tests" / "fixtures"
MLP = FIXTURES / "mlp_xnnpack.pte"
PY = sys.executable
FLAGS = ["--xnnpack-cache", "--json"]


def test_made_once_found_on_a_hit_rebuilt_when_corrupt_and_loaded(tmp_path: Path) -> None:
    from ptestore.xnnpack import verify_cache

    cache_dir = tmp_path / "cache"
    first = ensure(MLP, cache_dir=cache_dir, xnnpack_cache=True)
    assert first.created and first.xnnpack_cache is not None and first.xnnpack_refused is None
    packed = Path(first.xnnpack_cache)
    assert packed.parent == Path(first.pte).parent  # beside the entry
    # the entry's digests are in the file's record too: an app's quick check before its
    # load (load(pte, cache=path, full=False), no digest given) hashes nothing
    import ptestore.xnnpack.digests as digests_module

    def no_hashing(path: object) -> str:
        raise AssertionError(f"{path} hashed again")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(digests_module, "file_sha256", no_hashing)
        assert verify_cache(packed, pte=first.pte, full=False).path == packed
    made = verify_cache(packed, pte=first.pte)
    assert made.entries == 2
    assert first.to_dict()["xnnpack_cache"] == str(packed)
    record_mtime = Path(str(packed) + ".json").stat().st_mtime_ns

    again = ensure(MLP, cache_dir=cache_dir, xnnpack_cache=True)
    assert not again.created and again.xnnpack_cache == str(packed)
    assert Path(str(packed) + ".json").stat().st_mtime_ns == record_mtime  # not made again
    assert ensure(MLP, cache_dir=cache_dir).xnnpack_cache is None  # not asked for: not given

    # listed with the entry, counted in its bytes, kept by prune
    (entry,) = list_entries(cache_dir)
    assert entry.xnnpack_cache == str(packed) and entry.to_dict()["xnnpack_cache"] == str(packed)
    assert entry.bytes >= packed.stat().st_size + Path(first.pte).stat().st_size
    cache.prune(cache_dir)
    assert packed.is_file() and list_entries(cache_dir)[0].xnnpack_cache == str(packed)

    flip(packed)
    rebuilt = ensure(MLP, cache_dir=cache_dir, xnnpack_cache=True)
    assert not rebuilt.created and rebuilt.xnnpack_cache == str(packed)
    assert verify_cache(packed, pte=first.pte).sha256 == made.sha256  # the same bytes again
    assert Path(str(packed) + ".json").stat().st_mtime_ns != record_mtime  # made again

    result, stderr = fresh_load(first.pte, packed)
    assert result["same_bytes"] and result["loads_with_options"] == 1
    assert "Loaded packed weight cache: /proc/self/fd/" in stderr  # the inode load() checked
    assert "(2 entries)" in stderr

    # the CLI prints the same path in --json, and cache ls shows it
    cli = subprocess.run(
        [PY, "-m", "ptestore", "ensure", str(MLP), "--cache-dir", str(cache_dir), *FLAGS],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(cli.stdout)["xnnpack_cache"] == str(packed)
    ls = subprocess.run(
        [PY, "-m", "ptestore", "cache", "ls", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert ls.returncode == 0, ls.stderr[-2000:]
    assert f" + {packed.name}" in ls.stdout


def test_a_refused_file_still_serves_the_artifact(tmp_path: Path) -> None:
    pte = FIXTURES / "mlp_portable.pte"
    got = ensure(pte, cache_dir=tmp_path, xnnpack_cache=True)
    reason = "it has no XNNPACK delegate with named weights (nothing to pack)"
    assert got.xnnpack_cache is None and got.xnnpack_refused == reason
    assert Path(got.pte).is_file()
    assert got.to_dict()["xnnpack_cache"] is None
    assert got.to_dict()["xnnpack_refused"] == reason
    again = ensure(pte, cache_dir=tmp_path, xnnpack_cache=True)  # remembered, not rerun
    assert again.xnnpack_refused == f"{reason} (refused before)"


def test_wrong_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        ensure(MLP, cache_dir=tmp_path, xnnpack_cache="yes")  # type: ignore[arg-type]
    assert str(err.value) == "xnnpack_cache must be True or False, got 'yes'"
    src = tmp_path / "model.pte"
    src.write_bytes(MLP.read_bytes())
    with pytest.raises(ConfigurationError) as err:
        ensure(src, cache_dir=tmp_path / "c", in_place=True, xnnpack_cache=True)
    assert str(err.value) == (
        f"{src}: xnnpack_cache=True applies to a copy in the cache, not to in_place=True "
        "(CLI: --xnnpack-cache without --in-place)"
    )


def test_the_packed_file_counts_in_max_bytes(tmp_path: Path) -> None:
    other = ensure(FIXTURES / "mlp_portable.pte", cache_dir=tmp_path)
    plain = ensure(MLP, cache_dir=tmp_path)
    sizes = {e.key: e.bytes for e in list_entries(tmp_path)}
    fits = sizes[other.key] + sizes[plain.key]  # both fit before the packed file is made
    got = ensure(MLP, cache_dir=tmp_path, xnnpack_cache=True, max_bytes=fits)
    assert got.key == plain.key and got.xnnpack_cache is not None
    (left,) = list_entries(tmp_path)  # the least recently used entry went
    assert left.key == plain.key and left.xnnpack_cache == got.xnnpack_cache
    assert left.bytes >= sizes[plain.key] + Path(got.xnnpack_cache).stat().st_size


def test_an_entry_removed_before_the_file_is_made_is_not_brought_back(tmp_path: Path) -> None:
    got = ensure(MLP, cache_dir=tmp_path)
    layout = CacheLayout(tmp_path)
    with layout.lock(got.key):
        remove_entry_locked(layout, got.key)  # as an eviction by another process does
    with pytest.raises(StorageError) as err:
        with_packed_weights(layout, got)
    assert str(err.value) == (
        f"{layout.entry_dir(got.key)}: the entry was removed (evicted or pruned) before "
        "its XNNPACK packed-weight file was made; call ensure again"
    )
    assert not os.path.exists(layout.entry_dir(got.key))


def test_an_entry_whose_model_went_is_refused_not_hashed(tmp_path: Path) -> None:
    got = ensure(MLP, cache_dir=tmp_path)
    os.unlink(got.pte)  # the manifest stays: ensure would see a broken entry next time
    with pytest.raises(StorageError) as err:
        with_packed_weights(CacheLayout(tmp_path), got)
    assert str(err.value) == f"{got.pte}: missing from its entry; call ensure again"


def test_an_earlier_artifacts_file_is_removed_under_its_own_lock(tmp_path: Path) -> None:
    """An app's check may be remembering digests in the record of an earlier artifact's
    file (under that file's lock) while ensure removes it: ensure waits for the lock,
    so the app never writes a removed record back (an orphan record without its file)."""
    import fcntl
    import threading

    from support.locks import blocked_on, wait_until

    first = ensure(MLP, cache_dir=tmp_path, xnnpack_cache=True)
    entry = Path(first.pte).parent
    old = entry / "xnnpack-0123456789abcdef.xpwc"  # an earlier artifact's, kept as a base
    old.write_bytes(b"packed")
    record = Path(f"{old}.json")
    record.write_text("{}")
    lock = Path(f"{old}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as remember_quietly holds it
    errors: list[BaseException] = []

    def hit() -> None:
        try:
            with_packed_weights(CacheLayout(tmp_path), first)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=hit, daemon=True)
    try:
        thread.start()
        wait_until(lambda: blocked_on(lock), "ensure to wait for the old file's lock")
        assert record.exists() and old.exists()  # nothing removed under the holder
    finally:
        os.close(fd)
    thread.join()
    assert not errors
    assert not record.exists() and not old.exists() and not lock.exists()
    assert Path(str(first.xnnpack_cache)).exists()  # this artifact's file stays


def test_a_digest_memo_for_a_removed_record_leaves_nothing_behind(tmp_path: Path) -> None:
    from ptestore.xnnpack.digests import remember_quietly

    record = tmp_path / "xnnpack-0123456789abcdef.xpwc.json"
    learned = {"/m.pte": {"sha256": "0" * 64, "stamp": [1, 2, 3, 4, 5], "ends": "0" * 64}}
    original = os.path.exists

    def removed_meanwhile(path: object) -> bool:  # the record read, then removed by ensure
        if str(path) == str(record):
            return False
        return original(path)  # type: ignore[arg-type]

    record.write_text(json.dumps({"format": "ptestore-xnnpack-cache/1"}))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Path, "exists", lambda self: removed_meanwhile(self))
        remember_quietly(record, learned)
    assert json.loads(record.read_text()) == {"format": "ptestore-xnnpack-cache/1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [record.name]  # no lock left


def test_a_file_another_process_made_meanwhile_is_reported_found(tmp_path: Path) -> None:
    """Two ``ensure --xnnpack-cache`` at once: both look under the entry's shared lock and
    find none; one makes the file, the other waits for the exclusive lock, and its
    make_cache finds that file (made=False). It said ``xnnpack_from="made"``. The state
    it finds is set up here directly: the file made in the entry by another caller, and
    not yet looked up through the entry's digests."""
    from ptestore.xnnpack import make_cache

    cache_dir = tmp_path / "cache"
    plain = ensure(MLP, cache_dir=cache_dir)  # the entry, no packed-weight file yet
    other = make_cache(plain.pte, directory=Path(plain.pte).parent)  # the other caller's
    assert other.made
    second = ensure(MLP, cache_dir=cache_dir, xnnpack_cache=True)
    assert second.xnnpack_cache == str(other.path)
    assert second.xnnpack_from == "found"
