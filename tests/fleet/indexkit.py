"""Checks of a sharded index shared by its tests: the catalogs against the leaves; and
what an older ptestore does to publish into a version 1/2 index."""

from __future__ import annotations

import json
from typing import Any

from ptestore.errors import FormatError, PreconditionFailed
from ptestore.fleet.index import open_index
from ptestore.fleet.index_store import dumps
from ptestore.testing.fleet_index import catalog_disagreements
from ptestore.writers import open_writer, versions


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


def old_writer(url: str, entries: list[dict[str, Any]]) -> None:
    """What a ptestore before version 3 does to publish: read the index with its
    version, refuse any version but 1 and 2, merge, publish if still that version."""
    for _ in range(20):
        got = versions.read_versioned(url)
        old = json.loads(got.data) if got.version is not None else {"entries": []}
        if got.version is not None and old.get("version") not in (1, 2):
            raise FormatError(url, "index version", old.get("version"), "1 or 2")
        kept = {(e["model"], e["device"]): e for e in old["entries"]}
        kept.update({(e["model"], e["device"]): e for e in entries})
        new = {"format": "ptestore.index", "version": 2, "entries": [kept[k] for k in sorted(kept)]}
        w = open_writer(url, auto_mkdir=True)
        w.write(json.dumps(new, indent=1).encode(), 0)
        try:
            w.publish(got.mode, expected=got.version)
            return
        except PreconditionFailed:
            continue
    raise AssertionError("the old writer never published")
