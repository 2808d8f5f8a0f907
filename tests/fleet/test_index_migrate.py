"""The migration of a version 1/2 index to version 3 when it has to copy again: a model
an older writer changed meanwhile is copied afresh (no node of its first copy left for a
later split to take), and a damaged version 2 index is refused before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ptestore.fleet.index import load_index, publish_entries
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.index_v3 import ShardedIndex, model_segment
from ptestore.testing.fleet_index import device_name, synthetic_entry

from .indexkit import assert_catalogs_match_leaves, old_writer


def _small(e: dict[str, Any]) -> dict[str, Any]:
    """What an older ptestore might write for the same pair: a smaller entry."""
    return {k: e[k] for k in ("model", "device", "key", "pte", "compatibility", "created")}


@pytest.mark.parametrize("removal", ["works", "fails"])
def test_a_model_copied_again_keeps_no_node_of_its_first_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removal: str
) -> None:
    """The first copy of ``m`` is a split trie; an older writer shrinks its entries
    before the root swap, so the second copy is one leaf. A later split of that leaf
    must make its halves, not find the first copy's and bring back its entries. When
    the removal of the first copy fails (it is best effort), everything is copied into
    a directory of its own."""
    url = str(tmp_path / "ptestore-index.json")
    if removal == "fails":
        monkeypatch.setattr(IndexStore, "remove_tree", lambda self, url: None)
    big = [synthetic_entry("m", device_name(i)) for i in range(20)]
    old_writer(url, big)
    real = ShardedIndex.write_static
    raced: list[int] = []

    def then_an_old_writer(self: ShardedIndex, *args: Any, **kw: Any) -> int:
        n = real(self, *args, **kw)
        if not raced:  # once, between the first copy and the swap
            raced.append(1)
            old_writer(url, [_small(e) for e in big])
        return n

    monkeypatch.setattr(ShardedIndex, "write_static", then_an_old_writer)
    publish_entries(url, [synthetic_entry("other", "x")], {})
    monkeypatch.undo()
    root = json.loads(Path(url).read_text())
    segment = tmp_path / root["layout"]["shards"] / "m" / model_segment("m")
    assert sorted(p.name for p in segment.iterdir()) == ["catalog.json", "t.json"]
    new = [synthetic_entry("m", f"new-{i}") for i in range(12)]
    publish_entries(url, new, {})  # splits the leaf
    after = {e["device"]: e for e in load_index(url)["entries"] if e["model"] == "m"}
    assert sorted(after) == sorted([e["device"] for e in big + new])
    assert [d for d, e in after.items() if not d.startswith("new-") and "source" in e] == []
    assert assert_catalogs_match_leaves(url) == 2
