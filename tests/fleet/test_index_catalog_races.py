"""Catalog writes racing at a model's first publish and rebuilds racing each other,
made deterministic by hooks on the real code path (local files). Found by the soak on
moto (``test_index_soak.py``): four runs publishing a new model at once, three of which
found no catalog while the fourth had made the trie, each rebuilt the catalog instead of
placing their pairs; each rebuild marked the catalog again and so failed the others'
commits, until all gave up: their pairs were left out of the catalog (``not listed``,
``lists [...] and no more``), nothing lost from the leaves."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ptestore import _retry
from ptestore.fleet.index import create_index, open_index, publish_entries
from ptestore.fleet.index_catalog import REBUILDING
from ptestore.fleet.index_stats import ObjectStats
from ptestore.fleet.index_trie import ModelTrie, Node
from ptestore.fleet.index_v3 import ShardedIndex
from ptestore.testing.fleet_index import device_name, synthetic_entry

from .indexkit import assert_catalogs_match_leaves

#: How long a thread of a test waits for the other to reach its step: a ceiling that
#: fails the test if a step is never reached, not a timing assumption.
CEILING = 120.0


def _sharded(url: str) -> ShardedIndex:
    _, sharded, _ = open_index(url, {})
    assert sharded is not None
    return sharded


def _listed(url: str, model: str) -> set[str]:
    catalog, _ = _sharded(url).read_catalog(model)
    assert catalog is not None
    return {d for c in catalog["classes"] for d in c["devices"]}


def test_a_run_that_found_no_catalog_places_its_pairs_in_the_one_made_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run P reads no catalog of a new model; run Q then publishes it whole (the trie,
    then the catalog) before P writes its leaf. P places its pair in Q's catalog. Before,
    P rebuilt the catalog from the leaves instead, and runs placing pairs meanwhile
    (one per rebuild here) renewed the rebuild's mark each time, failing its commit until
    P gave up: P's pair was never placed."""
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    mine = synthetic_entry("m", device_name(0), socs=2)
    real_read = ShardedIndex.read_catalog
    real_walk = ModelTrie.walk
    busy: list[bool] = []  # another run's publish in progress (not hooked)
    others = iter(range(1, 100))
    others_done: list[bool] = []  # Q has published

    def read_catalog(self: ShardedIndex, model: str) -> tuple[Any, Any]:
        got = real_read(self, model)
        if busy or got[0] is not None or others_done:
            return got
        busy.append(True)
        others_done.append(True)
        try:  # Q, whole, between P's read and P's leaf write
            publish_entries(url, [synthetic_entry("m", device_name(next(others)))], {})
        finally:
            busy.clear()
        return got

    def walk(self: ModelTrie, *, empty: bool = False) -> Iterator[Node]:
        nodes = list(real_walk(self, empty=empty))
        if not busy:  # a run placing a pair while P's rebuild reads the leaves
            busy.append(True)
            try:
                publish_entries(url, [synthetic_entry("m", device_name(next(others)))], {})
            finally:
                busy.clear()
        return iter(nodes)

    monkeypatch.setattr(ShardedIndex, "read_catalog", read_catalog)
    monkeypatch.setattr(ModelTrie, "walk", walk)
    publish_entries(url, [mine], {})
    monkeypatch.undo()
    assert mine["device"] in _listed(url, "m")
    assert assert_catalogs_match_leaves(url, {}) == 1


def test_a_rebuild_in_flight_is_not_failed_by_another_that_starts_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebuild A marks the catalog and reads the leaves; rebuild B starts then, finds
    the mark and takes it as it is (before, B marked it again, which failed A's commit:
    rebuilds that kept marking again failed each other's commits until all gave up). A
    commits at its first attempt; B's commit, over the version A replaced, fails and B
    (forced) rebuilds again over A's catalog."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(6)], {})
    sharded = _sharded(url)
    real_walk = ModelTrie.walk
    a_walking, b_walking, a_done = threading.Event(), threading.Event(), threading.Event()
    names: dict[int | None, str] = {}
    marks_before_walk: dict[str, list[bool]] = {"a": [], "b": []}

    def walk(self: ModelTrie, *, empty: bool = False) -> Iterator[Node]:
        who = names.get(threading.get_ident())
        if who is not None:
            catalog, _ = sharded.read_catalog("m")
            marks_before_walk[who].append(catalog is not None and REBUILDING in catalog)
        if who == "a" and not a_walking.is_set():
            a_walking.set()
            assert b_walking.wait(CEILING), "rebuild B never read the leaves"
        elif who == "b" and not b_walking.is_set():
            b_walking.set()
            assert a_done.wait(CEILING), "rebuild A never ended"
        return real_walk(self, empty=empty)

    monkeypatch.setattr(ModelTrie, "walk", walk)
    stats = {"a": ObjectStats(sharded.catalog_url("m"), "catalog"),
             "b": ObjectStats(sharded.catalog_url("m"), "catalog")}  # fmt: skip
    errors: list[BaseException] = []

    def run(who: str, then: threading.Event | None) -> None:
        names[threading.get_ident()] = who
        try:
            sharded.repair("m", stats[who], force=True)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            for event in (a_walking, b_walking, a_done):
                event.set()
        finally:
            if then is not None:
                then.set()

    a = threading.Thread(target=run, args=("a", a_done))
    a.start()
    assert a_walking.wait(CEILING), "rebuild A never read the leaves"
    b = threading.Thread(target=run, args=("b", None))
    b.start()
    a.join(CEILING)
    b.join(CEILING)
    monkeypatch.undo()
    assert not errors and not a.is_alive() and not b.is_alive()
    assert stats["a"].conflicts == 0 and stats["a"].written  # committed at its first attempt
    assert stats["b"].written and marks_before_walk["b"][0]  # B took A's mark as it was
    assert assert_catalogs_match_leaves(url, {}) == 1
    catalog, _ = sharded.read_catalog("m")
    assert catalog is not None and REBUILDING not in catalog
