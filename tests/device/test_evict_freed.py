"""What eviction, ``prune`` and ``clear`` report as freed is what the file system got
back (:func:`ptestore.device.entryfiles.freed_since`): they used to report the bytes
they listed, so a file of an entry also hard-linked elsewhere (the user's own link to a
``.pte`` ``ensure`` returned), a file linked twice in an entry, or a file that could not
be removed was counted as freed, and ``remaining`` left out what could not be removed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from support.as_user import NOBODY, as_user, give_tree
from support.blocks import allocated, allocated_under
from support.fixtures import copy_pte

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import evict, list_entries
from ptestore.device.entryfiles import dir_bytes

SPEC = "support.fleet_backend:Scaler=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})


def _two_entries(root: Path) -> tuple[Path, ptestore.device.Artifact, ptestore.device.Artifact]:
    cache = root / "cache"
    a = ptestore.ensure(copy_pte(root / "a.pte"), cache_dir=cache, backends=[SPEC], device=DEVICE)
    b = ptestore.ensure(copy_pte(root / "b.pte"), cache_dir=cache, backends=[SPEC], device=DEVICE)
    return cache, a, b


def _evict_as_nobody(cache: Path) -> dict[str, Any]:
    """``evict(cache, 0)`` run as ``nobody``: its result and the warnings it logged."""

    def work() -> str:
        seen: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record.getMessage())

        logging.getLogger("ptestore.device.cache").addHandler(Keep())
        return json.dumps({"done": evict(cache, 0).to_dict(), "warnings": seen})

    got = as_user(NOBODY, work)
    assert got.startswith("ok: "), got
    out: dict[str, Any] = json.loads(got[len("ok: ") :])
    return out


def test_a_file_linked_elsewhere_or_twice_is_not_freed_twice(tmp_path: Path) -> None:
    """a's .pte also linked outside the cache frees nothing; b's .pte linked twice in
    its entry is freed once. The cache holds nothing afterwards."""
    cache, a, b = _two_entries(tmp_path)
    kept = tmp_path / "kept.pte"
    os.link(a.pte, kept)
    os.link(b.pte, Path(b.pte).parent / "again.pte")
    listed = {e.key: e.bytes for e in list_entries(cache)}
    assert listed[b.key] == dir_bytes(str(Path(b.pte).parent))  # b.pte counted twice
    held = {k: allocated_under(cache / "entries" / k) for k in listed}  # b.pte once
    kept_bytes = kept.read_bytes()
    done = evict(cache, 0)
    assert sorted(done.removed) == sorted([a.key, b.key])
    assert done.freed == held[a.key] - allocated(kept) + held[b.key]
    assert done.remaining == 0 and list_entries(cache) == []
    assert kept.read_bytes() == kept_bytes and kept.stat().st_nlink == 1


def test_cache_prune_reports_what_it_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cache prune --max-bytes 0 --json``: ``freed`` leaves out the .pte the user
    linked elsewhere."""
    cache, a, _ = _two_entries(tmp_path)
    os.link(a.pte, tmp_path / "kept.pte")
    listed = {e.key: e.bytes for e in list_entries(cache)}
    held = sum(allocated_under(cache / "entries" / k) for k in listed)
    argv = ["cache", "prune", "--cache-dir", str(cache), "--max-bytes", "0", "--json"]
    assert main(argv) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["freed"] == held - allocated(tmp_path / "kept.pte")
    assert done["remaining"] == 0 and sorted(done["removed"]) == sorted(listed)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_file_that_cannot_be_removed_is_not_freed_and_still_in_the_cache() -> None:
    """Eviction by ``nobody`` of an entry holding a directory of root's (a file it cannot
    remove): the entry goes (its manifest first), the file's bytes are not freed but
    still in ``remaining``, and a warning names the entry and the bytes left."""
    root = Path(tempfile.mkdtemp(prefix="ptestore-freed-"))
    try:
        os.chmod(root, 0o755)
        cache, a, b = _two_entries(root)
        give_tree(cache, NOBODY)
        stuck = Path(a.pte).parent / "stuck"
        stuck.mkdir(mode=0o755)  # root's: nobody cannot remove what is in it
        (stuck / "x").write_bytes(b"x" * 1000)
        listed = {e.key: e.bytes for e in list_entries(cache)}
        assert listed[a.key] == dir_bytes(str(Path(a.pte).parent))
        held = sum(allocated_under(cache / "entries" / k) for k in listed)

        out = _evict_as_nobody(cache)
        done = out["done"]
        assert sorted(done["removed"]) == sorted([a.key, b.key])
        assert done["freed"] == held - allocated(stuck / "x")  # what the rest held
        assert done["remaining"] == 1000  # counted as cache ls counts: its size
        assert out["warnings"] == [
            f"{Path(a.pte).parent}: removed, but 1000 bytes of its files could not be"
        ]
        assert (stuck / "x").exists() and not Path(a.pte).exists()
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_an_evicted_entry_whose_lock_file_stays_is_still_evicted() -> None:
    """Eviction by the cache's owner whose ``locks/`` it cannot write (mode 0555): each
    entry goes and is counted as removed and freed; its lock file stays, said in a
    warning (it is not "not evicted")."""
    root = Path(tempfile.mkdtemp(prefix="ptestore-freed-"))
    try:
        os.chmod(root, 0o755)
        cache, a, _ = _two_entries(root)
        give_tree(cache, NOBODY)
        os.chmod(cache / "locks", 0o555)
        listed = {e.key: e.bytes for e in list_entries(cache)}
        held = sum(allocated_under(cache / "entries" / k) for k in listed)

        out = _evict_as_nobody(cache)
        done = out["done"]
        assert sorted(done.pop("removed")) == sorted(listed)
        assert done == {"freed": held, "busy": [], "remaining": 0}
        assert sorted(out["warnings"]) == sorted(
            f"{cache}/entries/{k}: evicted, but {cache}/locks/{k}.lock: cannot remove the "
            "cache lock file: Permission denied"
            for k in listed
        )
        assert list_entries(cache) == [] and (cache / "locks" / f"{a.key}.lock").exists()
    finally:
        os.chmod(root / "cache" / "locks", 0o755)
        shutil.rmtree(root)


def test_a_sparse_leftover_frees_what_it_held_and_counts_its_size(tmp_path: Path) -> None:
    """A sparse leftover in an entry (a run's staging file or a download's ``.part``:
    25 MiB long, 1 MiB of it written): ``cache ls`` counts its size (what ``max_bytes``
    budgets), ``prune`` reports as freed what it held on the file system
    (``st_blocks * 512``), not its size (it used to say 25 MiB)."""
    from ptestore.device import prune

    cache, a, _ = _two_entries(tmp_path)
    part = Path(a.pte).parent / ".model.pte.ptestore-0123456789abcdef.tmp"
    with open(part, "wb") as f:
        f.write(b"\1" * (1 << 20))
        f.truncate(25 << 20)
    held = allocated(part)
    assert (1 << 20) <= held < (2 << 20)  # sparse
    (entry,) = [e for e in list_entries(cache) if e.key == a.key]
    assert entry.bytes == dir_bytes(str(Path(a.pte).parent)) > 25 << 20
    done = prune(cache)
    assert done.removed == [] and done.freed == held and not part.exists()
    assert done.remaining == sum(e.bytes for e in list_entries(cache))


def test_a_hit_under_a_clock_set_back_never_moves_its_entry_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last use of an entry is never set back: a hit while the clock reads 1970 (a
    device before its time was set) leaves the model in use where its last use put it
    (its time as it was: test_touch_clock), and eviction removes the entry used before
    it (was: stamped 1970, the model in use first in line, evicted). Under a clock that
    is right the hit is now, as before."""
    import time
    import types

    from ptestore.device import layout

    cache, a, b = _two_entries(tmp_path)
    now = time.time_ns()
    hour = 3600 * 10**9
    stamps = {a.key: now - hour, b.key: now - 2 * hour}  # a used after b
    for key, stamp in stamps.items():
        os.utime(cache / "entries" / key / "manifest.json", ns=(stamp, stamp))
    monkeypatch.setattr(layout, "time", types.SimpleNamespace(time_ns=lambda: 5 * 10**9))
    again = ptestore.ensure(tmp_path / "a.pte", cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert (again.key, again.created) == (a.key, False)  # a hit, touched under 1970
    manifest = cache / "entries" / a.key / "manifest.json"
    assert manifest.stat().st_mtime_ns == now - hour  # left as it was: 1970 is implausible
    assert [e.key for e in list_entries(cache)] == [a.key, b.key]
    ready = {e.key: e.bytes for e in list_entries(cache)}
    done = evict(cache, ready[a.key])
    assert done.removed == [b.key]
    assert [e.key for e in list_entries(cache)] == [a.key]
    monkeypatch.setattr(layout, "time", types.SimpleNamespace(time_ns=lambda: now + hour))
    ptestore.ensure(tmp_path / "a.pte", cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert manifest.stat().st_mtime_ns == now + hour  # a right clock: now
