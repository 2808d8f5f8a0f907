"""Checks of a sharded index shared by its tests: the catalogs against the leaves."""

from __future__ import annotations

from typing import Any

from ptestore.fleet.index import open_index
from ptestore.fleet.index_catalog import class_key, live_stamps
from ptestore.fleet.index_store import dumps


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
    """Each model's catalog lists, per distinct stamps, a prefix of the sorted live
    members its leaves hold (all of them unless ``more``), and no class without members;
    returns the number of models checked."""
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    checked = 0
    for seg in sharded.segments():
        model = sharded.model_of(seg)
        assert model is not None
        members: dict[str, list[str]] = {}
        for node in sharded.trie(model).walk():
            for device, entry in node.entries.items():
                stamps = live_stamps(entry)
                if stamps is not None:
                    members.setdefault(class_key(stamps), []).append(device)
        catalog, _ = sharded.read_catalog(model)
        assert catalog is not None, model
        listed = {class_key(c["compatibility"]): c for c in catalog["classes"]}
        assert set(listed) == set(members), (model, set(listed) ^ set(members))
        for key, cls in listed.items():
            devices = sorted(members[key])
            assert cls["devices"] == devices[: len(cls["devices"])], (model, cls, devices)
            assert cls["devices"], (model, cls)
            assert cls["more"] or len(cls["devices"]) == len(devices), (model, cls, devices)
        checked += 1
    return checked
