"""An index write whose outcome is unknown (``PublishUncertain``: an attempt's answer was
lost and the retry was refused by a version that is not the writer's, see
``tests/writers/test_s3_lost_answers.py``) is read again like a conflict: a publish and a
retire still end with every entry and catalog right. Before, it ended the update (the run
exited 1 with the index not published)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import PublishUncertain
from ptestore.fleet.index import (
    create_index,
    load_index,
    open_index,
    publish_entries,
    update_index,
)
from ptestore.fleet.index_catalog import live_stamps
from ptestore.fleet.index_store import IndexStore, dumps, shards_line
from ptestore.fleet.index_trie import SPLITTING, LeafOutcome
from ptestore.fleet.index_v3 import ShardedIndex
from ptestore.testing.fleet_index import device_name, synthetic_entry

from .indexkit import assert_catalogs_match_leaves


def _uncertain_writes(
    monkeypatch: pytest.MonkeyPatch,
    landed: bool,
    times: int = 1,
    which: Callable[[str, dict[str, Any]], bool] = lambda url, value: True,
    then: Callable[[], None] = lambda: None,
) -> list[str]:
    """The first ``times`` index writes (of those ``which`` picks) raise
    PublishUncertain, after writing (``landed``: the lost answer of a write that took
    effect; ``then`` runs after it, as another writer would before the retry) or
    without."""
    real = IndexStore.write
    hit: list[str] = []

    def write(
        self: IndexStore, url: str, value: dict[str, Any], mode: str, expected: Any = None
    ) -> None:
        if len(hit) < times and which(url, value):
            hit.append(url)
            if landed:
                real(self, url, value, mode, expected)
                then()
            raise PublishUncertain(f"{url}: a retry of PutObject was refused (stand-in)")
        real(self, url, value, mode, expected)

    monkeypatch.setattr(IndexStore, "write", write)
    return hit


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "lost"])
def test_a_publish_whose_write_is_uncertain_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    entries = [synthetic_entry("m0", device_name(i), socs=2) for i in range(6)]
    hit = _uncertain_writes(monkeypatch, landed, times=3)
    report = publish_entries(url, entries, {})
    assert hit  # landed: every write was (the leaf, the catalog), each found in place
    assert sum(s.conflicts for s in report.stats) == len(hit)
    got = sorted(load_index(url)["entries"], key=lambda e: e["device"])
    assert got == sorted(entries, key=lambda e: e["device"])
    assert assert_catalogs_match_leaves(url, {}) == 1
    # Reported (``fleet run --json``'s index_shards, the summary's line): per object and
    # in all; before, only as conflicts.
    shards = report.to_dict()
    assert [s["uncertain"] for s in shards["shards"]] == [s.uncertain for s in report.stats]
    assert shards["uncertain"] == sum(s["uncertain"] for s in shards["shards"]) == len(hit)
    hot = sorted({s["kind"] for s in shards["shards"] if s["conflicts"]})
    assert shards_line(shards) == (
        f"v3: {shards['objects']} objects, {shards['written']} written, {len(hit)} conflicts "
        f"({len(hit)} uncertain) retried in {len([s for s in report.stats if s.conflicts])} "
        f"({', '.join(hot)})"
    )


def test_a_retire_whose_write_is_uncertain_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    entries = [synthetic_entry("m0", device_name(i), socs=2) for i in range(6)]
    publish_entries(url, entries, {})
    gone = device_name(2)
    _uncertain_writes(monkeypatch, landed=True)
    done = update_index(
        url, lambda e: {**e, "retired": {"reason": "test"}} if e["device"] == gone else None
    )
    assert [e["device"] for e in done.changed] == [gone]
    retired = [e["device"] for e in load_index(url)["entries"] if e.get("retired")]
    assert retired == [gone]
    assert assert_catalogs_match_leaves(url, {}) == 1


def _sharded(url: str) -> ShardedIndex:
    _, sharded, _ = open_index(url, {})
    assert sharded is not None
    return sharded


def _leaves(url: str, model: str) -> dict[str, int]:
    """The leaves of ``model``'s trie per depth, counted by walking it (what a rebuild
    of its catalog records)."""
    nodes = _sharded(url).trie(model).walk(empty=True)
    counts = Counter(len(n.prefix) for n in nodes)
    return {str(k): counts[k] for k in sorted(counts)}


def test_a_split_a_catalog_write_counted_is_counted_once_when_the_write_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog write that counts a publish's splits lands, its answer lost: read
    again, it is found in place and not counted again (it was: {"1": 2, "2": 4} for
    the trie's {"1": 1, "2": 2})."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=4096)
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(2)], {})
    assert _leaves(url, "m") == {"0": 1}
    hit = _uncertain_writes(
        monkeypatch, landed=True, which=lambda url, _: url.endswith("/catalog.json")
    )
    more = [synthetic_entry("m", device_name(i), socs=2) for i in range(2, 6)]
    report = publish_entries(url, more, {})
    assert len(hit) == 1 and sum(s.splits for s in report.stats) == 2
    catalog, _ = _sharded(url).read_catalog("m")
    assert catalog is not None
    assert catalog["leaves"] == _leaves(url, "m") == {"1": 1, "2": 2}


def _two_in_a_full_leaf(tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """An index whose model ``m`` has two entries in one leaf with 100 bytes to spare
    (retiring one with a long reason makes it split)."""
    entries = [synthetic_entry("m", device_name(i), socs=1) for i in range(2)]
    leaf = {"format": "ptestore.index-shard", "version": 3, "model": "m", "prefix": ""}
    size = len(dumps({**leaf, "state": "leaf", "entries": entries}))
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=size + 100)
    publish_entries(url, entries, {})
    assert _leaves(url, "m") == {"0": 1}
    return url, entries


@pytest.mark.parametrize("since", ["in place", "split since"])
def test_a_retire_whose_uncertain_leaf_write_landed_and_split_it_is_reported_and_unlisted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, since: str
) -> None:
    """The leaf write that retires an entry lands (and makes the leaf splitting), its
    answer lost; read again, the leaf is still that (``in place``) or another writer
    has split it since (``split since``). Either way the retire is this run's: reported,
    and the entry taken out of the catalog (before, the change was found already made,
    so neither: the catalog kept listing the retired device as a candidate)."""
    url, _ = _two_in_a_full_leaf(tmp_path)
    gone = device_name(1)

    def split_by_another_writer() -> None:
        if since == "split since":
            trie = _sharded(url).trie("m")
            trie._settle(trie.read(""), LeafOutcome())

    hit = _uncertain_writes(
        monkeypatch,
        landed=True,
        which=lambda _, value: value.get("state") == SPLITTING,
        then=split_by_another_writer,
    )
    done = update_index(
        url, lambda e: {**e, "retired": {"reason": "r" * 300}} if e["device"] == gone else None
    )
    assert len(hit) == 1
    assert [e["device"] for e in done.changed] == [gone]
    retired = [e["device"] for e in load_index(url)["entries"] if e.get("retired")]
    assert retired == [gone]
    assert assert_catalogs_match_leaves(url, {}) == 1
    catalog, _ = _sharded(url).read_catalog("m")
    assert catalog is not None
    assert [c["devices"] for c in catalog["classes"]] == [[device_name(0)]]


def test_a_retire_of_a_version_2_index_whose_write_landed_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read again after its uncertain write landed, the change is found made: it is
    still this run's (reported; before, the retire said it retired nothing)."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", device_name(i)) for i in range(3)], {}, version=2)
    gone = device_name(1)
    _uncertain_writes(monkeypatch, landed=True)
    done = update_index(
        url,
        lambda e: {**e, "retired": {"reason": "test"}} if e["device"] == gone else None,
        version=2,
    )
    assert done.version == 2 and [e["device"] for e in done.changed] == [gone]
    assert [e["device"] for e in load_index(url)["entries"] if e.get("retired")] == [gone]


def test_a_placement_whose_uncertain_write_landed_is_checked_against_its_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run P writes its entry of a pair into the leaf; run W writes its own there after
    it and places it in the catalog. P's placement, which puts the pair back in P's
    class, lands with its answer lost, and a run R writes the catalog (another pair)
    before P reads it again: P finds its placement there. It is still P's to check
    against the leaf, which holds W's entry, and to place that (before, nothing was
    left to change, so P checked nothing: the catalog listed the pair in P's class,
    its leaf held W's entry, and W's class was not listed)."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    pair = device_name(0)
    mine = synthetic_entry("m", pair, socs=3)
    theirs = synthetic_entry("m", pair, socs=4, generation=1)
    assert live_stamps(mine) != live_stamps(theirs)
    publish_entries(url, [synthetic_entry("m", device_name(1))], {})
    real = IndexStore.write
    catalog_writes: list[str] = []
    nested: list[bool] = []

    def write(
        self: IndexStore, where: str, value: dict[str, Any], mode: str, expected: Any = None
    ) -> None:
        if nested or not where.endswith("/catalog.json"):
            real(self, where, value, mode, expected)
            return
        catalog_writes.append(where)
        nested.append(True)
        try:
            if len(catalog_writes) == 1:  # after P's leaf write: W writes and places
                publish_entries(url, [theirs], {})
            elif len(catalog_writes) == 2:  # P's placement lands, then R writes
                real(self, where, value, mode, expected)
                publish_entries(url, [synthetic_entry("m", device_name(2))], {})
                raise PublishUncertain(f"{where}: a retry of PutObject was refused (stand-in)")
        finally:
            nested.clear()
        real(self, where, value, mode, expected)  # the first: stale (W placed since)

    monkeypatch.setattr(IndexStore, "write", write)
    report = publish_entries(url, [mine], {})
    assert len(catalog_writes) >= 2
    assert [s.uncertain for s in report.stats if s.kind == "catalog"] == [1]
    assert _sharded(url).find("m", pair) == theirs
    assert assert_catalogs_match_leaves(url, {}) == 1
