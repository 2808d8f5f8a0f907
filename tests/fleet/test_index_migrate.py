"""The migration of a version 1/2 index to version 3 when it has to copy again: a model
an older writer changed meanwhile is copied afresh (no node of its first copy left for a
later split to take), and a damaged version 2 index is refused before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import FormatError
from ptestore.fleet.index import find_entry, load_index, publish_entries
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


def _v2(url: str, entries: list[Any]) -> None:
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"model": "m"}, "index entries[1].device = None: must be a string"),
        ("junk", "index entries[1] = 'junk': must be an object with a model and a device"),
        ({**synthetic_entry("x", "a"), "model": 5}, "index entries[1].model = 5: must be a string"),
        (
            {**synthetic_entry("m", "z"), "device": 5},
            "index entries[1].device = 5: must be a string",
        ),
    ],
)
def test_a_damaged_version_2_index_is_refused_before_anything_is_written(
    tmp_path: Path, bad: Any, message: str
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    _v2(url, [synthetic_entry("m", "a"), bad])
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", "b")], {})
    assert str(caught.value) == f"{url}: {message}"
    assert json.loads(Path(url).read_text())["version"] == 2
    kept = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert [k for k in kept if k != "ptestore-index.json.lock"] == ["ptestore-index.json"]
    with pytest.raises(FormatError) as caught:  # a reader refuses it too, never skips it
        find_entry(url, "m", "a")
    assert str(caught.value) == f"{url}: {message}"


def test_an_entry_damaged_during_the_migration_is_refused_and_the_copy_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged entry written between the copy and the root swap: the swap fails, the
    index is read again and refused; the root stays version 2 and the copy is gone."""
    url = str(tmp_path / "ptestore-index.json")
    good = [synthetic_entry("m", device_name(i)) for i in range(3)]
    _v2(url, good)
    real = ShardedIndex.write_static

    def then_damage(self: ShardedIndex, *args: Any, **kw: Any) -> int:
        n = real(self, *args, **kw)
        _v2(url, [*good, {"model": "m", "device": ["d"]}])
        return n

    monkeypatch.setattr(ShardedIndex, "write_static", then_damage)
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", "b")], {})
    assert str(caught.value) == f"{url}: index entries[3].device = ['d']: must be a string"
    assert json.loads(Path(url).read_text())["version"] == 2
    kept = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert [k for k in kept if k != "ptestore-index.json.lock"] == ["ptestore-index.json"]


def _legacy_local_writer(url: str, entry: dict[str, Any], read: Any, go: Any) -> None:
    """What ptestore did before version tokens to publish a local index: flock
    ``<index>.lock``, read, merge, rename over it, with no check at the rename (here it
    waits for ``go`` between its read and its rename)."""
    import fcntl
    import os

    with open(url + ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = json.loads(Path(url).read_text())
        read.set()
        go.wait()
        assert old["version"] in (1, 2)
        old["entries"].append(entry)
        Path(url + ".tmp").write_text(json.dumps(old, indent=1))
        os.replace(url + ".tmp", url)


def test_a_legacy_local_writer_racing_the_migration_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A legacy writer read the version 2 index, the migration swapped the root, then
    the writer renamed its version 2 copy over it: the entries published into version 3
    meanwhile were lost for good. The migration now takes the writer's lock: it waits
    for the rename (the hook lets the writer go on once it waits), then migrates what
    the writer left."""
    import threading

    from ptestore.fleet import index_migrate
    from ptestore.fleet.index import migrate_index

    url = str(tmp_path / "ptestore-index.json")
    _v2(url, [synthetic_entry("m", "old-a")])
    read, go = threading.Event(), threading.Event()
    monkeypatch.setattr(index_migrate, "LEGACY_LOCK_WAITS", [go.set], raising=False)
    writer = threading.Thread(
        target=_legacy_local_writer, args=(url, synthetic_entry("m", "old-c"), read, go)
    )
    writer.start()
    read.wait()
    try:
        migrate_index(url)
        publish_entries(url, [synthetic_entry("m", "new-b")], {})
    finally:
        go.set()  # without the lock the migration never waits: the writer goes on now
        writer.join()
    publish_entries(url, [synthetic_entry("m", "new-d")], {})
    got = sorted(e["device"] for e in load_index(url)["entries"])
    assert got == ["new-b", "new-d", "old-a", "old-c"]
    assert len(list(tmp_path.glob("ptestore-index.v3-*"))) == 1
