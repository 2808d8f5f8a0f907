"""Checks of a sharded index shared by its tests: the catalogs against the leaves."""

from __future__ import annotations

from typing import Any

from ptestore.fleet.index import open_index
from ptestore.fleet.index_store import dumps
from ptestore.testing.fleet_index import catalog_disagreements


def leaf_sizes(url: str, options: dict[str, Any] | None = None) -> list[tuple[int, int]]:
    """``(bytes, entries)`` of every leaf of the index at ``url``."""
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    out = []
    for seg in sharded.segments():
        model = sharded.model_of(seg)
        assert model is not None
        for node in sharded.trie(model).walk():
            assert node.value is not None
            out.append((len(dumps(node.value)), len(node.entries)))
    return out


def assert_catalogs_match_leaves(url: str, options: dict[str, Any] | None = None) -> int:
    """Every model's catalog agrees with its leaves (:func:`catalog_disagreements`);
    returns the number of models checked."""
    problems = catalog_disagreements(url, options)
    assert problems == {}, problems
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    return len(sharded.segments())
