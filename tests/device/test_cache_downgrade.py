"""A cache directory shared with an older ptestore (a downgrade, two versions on one
device): the manifest's ``fingerprint.source`` and ``fingerprint.ptd`` hold exactly the
keys every version wrote before ``ctime_ns`` was taken (an older one compares them, and
the whole fingerprint, as they are: one more key made it remake every entry and its
``cache prune --stale`` remove them all), the ``ctime_ns`` beside them; an entry that
recorded ``ctime_ns`` inside its identity (as ptestore did for a while) is still a hit
while unchanged and stale once its ``ctime`` changed; a same-size rewrite that keeps
``mtime`` is still seen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import copy_pte, get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.device import prune_stale
from ptestore.device.keys import backend_fingerprint, device_fingerprint
from ptestore.device.layout import CacheLayout, read_manifest
from ptestore.device.manifest import as_json

from .test_cache_races import same_size_update

SPEC = "support.counting_backend:Counting=1.0"
FLEET_SPEC = "support.fleet_backend:Scaler=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})
EXT = get_fixture("mlp_xnnpack_ext")

#: What ``fingerprint.source`` (and ``.ptd``) of a local file held before ``ctime_ns``
#: was taken (f994a1c's ``ptestore/device/keys.py`` ``source_identity``), and so what
#: every version compares.
OLD_KEYS = {"path", "dev", "ino", "size", "mtime_ns"}


@pytest.fixture(autouse=True)
def _no_hold(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(tmp_path / "calls.txt"))


def _manifest(cache: Path, key: str) -> dict[str, Any]:
    m = read_manifest(CacheLayout(cache).manifest(key))
    assert m is not None
    return m


def _older_identity(path: Path) -> dict[str, Any]:
    """A local file's identity as an older ptestore takes it (one ``stat``; f994a1c's
    ``ptestore/device/keys.py`` ``source_identity``)."""
    st = os.stat(path)
    return as_json(
        {
            "path": str(path),
            "dev": st.st_dev,
            "ino": st.st_ino,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
        }
    )


def _older_prune_changed(manifest: dict[str, Any]) -> list[str]:
    """The roles an older ``cache prune --stale`` finds changed: f994a1c's
    ``ptestore/device/stale.py`` ``_identity_changed``, ``as_json(now) != recorded``
    (the recorded identity compared whole)."""
    fp = manifest["fingerprint"]
    changed = []
    if _older_identity(Path(manifest["source"])) != fp.get("source"):
        changed.append("source")
    ptd = manifest.get("ptd_source")
    if ptd is not None and _older_identity(Path(ptd)) != fp.get("ptd"):
        changed.append(".ptd")
    return changed


def _older_lookup_hits(manifest: dict[str, Any], backends: list[str], cache: Path) -> bool:
    """Whether an older ``ensure`` finds the entry a hit: f994a1c's
    ``ptestore/device/artifact.py`` ``lookup``, ``manifest.get("fingerprint") !=
    as_json(fingerprint)`` (the whole fingerprint compared)."""
    ptd = manifest.get("ptd_source")
    fingerprint = {
        "source": _older_identity(Path(manifest["source"])),
        "ptd": None if ptd is None else _older_identity(Path(ptd)),
        "backends": backend_fingerprint(backends, CacheLayout(cache)),
        "device": device_fingerprint(DEVICE),
    }
    return bool(manifest.get("fingerprint") == as_json(fingerprint))


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte, ptd = tmp_path / "ext.pte", tmp_path / "ext.ptd"
    shutil.copyfile(EXT.pte_path, pte)
    shutil.copyfile(EXT.ptd_path, ptd)
    return pte, ptd


def _three_entries(tmp_path: Path) -> tuple[Path, Path, Path, Path, Path, Any, Any, Any]:
    """``(cache, src, pte, ptd, own, copy, pair, rewritten)``: a copy's entry, a
    ``.pte``/``.ptd`` pair's and an in-place one's, made now."""
    cache = tmp_path / "cache"
    src = copy_pte(tmp_path / "m.pte")
    copy = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    pte, ptd = _pair(tmp_path)
    pair = ptestore.ensure(pte, cache_dir=cache, backends=[FLEET_SPEC], ptd=ptd, device=DEVICE)
    own = copy_pte(tmp_path / "own.pte")
    rewritten = ptestore.ensure(own, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
    return cache, src, pte, ptd, own, copy, pair, rewritten


def test_the_recorded_identities_hold_the_keys_older_versions_compare(tmp_path: Path) -> None:
    cache, src, pte, ptd, own, copy, pair, rewritten = _three_entries(tmp_path)
    for art, roles in ((copy, {"source": src}), (pair, {"source": pte, "ptd": ptd})):
        m = _manifest(cache, art.key)
        assert set(m["fingerprint"]) == {"source", "ptd", "backends", "device"}
        for role, path in roles.items():
            assert set(m["fingerprint"][role]) == OLD_KEYS
            assert m["fingerprint"][role] == _older_identity(path)
        assert m["ctime_ns"] == {role: os.stat(p).st_ctime_ns for role, p in roles.items()}
    m = _manifest(cache, rewritten.key)
    assert set(m["fingerprint"]["source"]) == OLD_KEYS
    assert m["fingerprint"]["source"] == _older_identity(own)  # the file it rewrote
    assert m["ctime_ns"] == {"source": os.stat(own).st_ctime_ns}


def test_an_older_prune_and_ensure_keep_and_hit_entries_made_now(tmp_path: Path) -> None:
    """What an older ptestore does with this cache, its comparisons emulated (an older
    tree is not run here: CI's clone may have no history to export it from): nothing
    removed by ``cache prune --stale``, every entry a hit of ``ensure``; a source that
    did change is still stale to it."""
    cache, src, _, _, _, copy, pair, rewritten = _three_entries(tmp_path)
    made = [(copy.key, [SPEC]), (pair.key, [FLEET_SPEC])]
    for key, backends in made:
        m = _manifest(cache, key)
        assert _older_prune_changed(m) == []
        assert _older_lookup_hits(m, backends, cache)
    assert _older_prune_changed(_manifest(cache, rewritten.key)) == []
    os.utime(src, ns=(0, 10**9))  # changed: so an older version sees it still
    assert _older_prune_changed(_manifest(cache, copy.key)) == ["source"]


def _ctime_inside(cache: Path, key: str) -> int:
    """Entry ``key``'s manifest made as ptestore wrote it for a while: ``ctime_ns``
    inside ``fingerprint.source``, no ``ctime_ns`` field beside it. Its ctime."""
    path = Path(CacheLayout(cache).manifest(key))
    data = json.loads(path.read_text())
    ns = data.pop("ctime_ns")["source"]
    data["fingerprint"]["source"]["ctime_ns"] = ns
    path.write_text(json.dumps(data))
    return int(ns)


def test_an_entry_recorded_with_ctime_inside_its_identity_is_compared_with_it(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    src = copy_pte(tmp_path / "m.pte")
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert _ctime_inside(cache, a.key) == os.stat(src).st_ctime_ns
    hit = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert not hit.created and hit.pte == a.pte  # unchanged: a hit, not made again
    result = prune_stale(cache, dry_run=True)
    assert (result.current, result.entries) == (1, [])
    before = os.stat(src).st_ctime_ns
    while os.stat(src).st_ctime_ns == before:  # a coarse clock: until ctime moves
        os.chmod(src, 0o600 if os.stat(src).st_mode & 0o044 else 0o644)
    (stale,) = prune_stale(cache, dry_run=True).entries
    assert stale.reason == f"its source {src} changed (ctime_ns)"
    again = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert again.created
    m = _manifest(cache, again.key)  # made again: in today's layout
    assert set(m["fingerprint"]["source"]) == OLD_KEYS
    assert m["ctime_ns"] == {"source": os.stat(src).st_ctime_ns}


def test_an_in_place_entry_recorded_with_ctime_inside_is_still_a_hit(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    own = copy_pte(tmp_path / "own.pte")
    a = ptestore.ensure(own, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
    _ctime_inside(cache, a.key)
    hit = ptestore.ensure(own, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
    assert not hit.created
    assert prune_stale(cache, dry_run=True).current == 1


def test_a_same_size_rewrite_keeping_mtime_is_seen_in_this_layout(tmp_path: Path) -> None:
    src, v2 = same_size_update(tmp_path)
    cache = tmp_path / "cache"
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    m = _manifest(cache, a.key)
    assert "ctime_ns" not in m["fingerprint"]["source"] and "source" in m["ctime_ns"]
    subprocess.run(["cp", "--preserve=timestamps", str(v2), str(src)], check=True)
    st = os.stat(src)
    assert (st.st_mtime_ns, st.st_size, st.st_ino) == (
        v2.stat().st_mtime_ns,
        v2.stat().st_size,
        m["fingerprint"]["source"]["ino"],
    )
    (stale,) = prune_stale(cache, dry_run=True).entries
    assert stale.reason == f"its source {src} changed (ctime_ns)"
    b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert b.created and b.provenance is not None and a.provenance is not None
    assert b.provenance.source.sha256 != a.provenance.source.sha256
