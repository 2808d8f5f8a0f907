"""A lookup while another run splits the leaf it looks for: the reads of one batch may
come back in any order, and a half read before its parent was split is one the split
may have made since (it is read again), so an entry never reads as absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptestore.fleet.index import create_index, find_entry, open_index, publish_entries
from ptestore.fleet.index_trie import ModelTrie, Node, device_bits
from ptestore.testing.fleet_index import synthetic_entry


def test_a_lookup_during_a_split_finds_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=1024)  # one entry per leaf: leaves at several depths
    publish_entries(url, [synthetic_entry("m", f"dev-{i}") for i in range(16)], {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    catalog, _ = sharded.read_catalog("m")
    assert catalog is not None
    deepest = max(int(k) for k in catalog["leaves"])
    leaf_of = {d: len(n.prefix) for n in sharded.trie("m").walk() for d in n.entries}
    target = next(d for d, k in sorted(leaf_of.items()) if k < deepest)
    k, bits = leaf_of[target], device_bits(target)
    rival = next(
        f"rival-{i}"
        for i in range(1 << 20)
        if device_bits(f"rival-{i}")[: k + 1] == bits[:k] + ("1" if bits[k] == "0" else "0")
    )
    real = ModelTrie._read_many
    raced: list[str] = []

    def deepest_first(self: ModelTrie, prefixes: set[str]) -> dict[str, Node]:
        if raced or len(prefixes) < 2:
            return real(self, prefixes)
        out: dict[str, Node] = {}
        for p in sorted(prefixes, key=len, reverse=True):  # an order a batch may take
            out.update(real(self, {p}))
            if p == bits[: k + 1]:  # the half read missing; now the rival splits its parent
                raced.append(rival)
                publish_entries(url, [synthetic_entry("m", rival)], {})
        return out

    monkeypatch.setattr(ModelTrie, "_read_many", deepest_first)
    found = find_entry(url, "m", target)
    assert raced == [rival]
    assert found is not None and found["device"] == target
    monkeypatch.undo()
    assert {n.prefix: len(n.entries) for n in sharded.trie("m").walk()}[bits[: k + 1]] == 1
