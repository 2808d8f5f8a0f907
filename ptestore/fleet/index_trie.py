"""The entries of one model in an index v3 as writers change them: a binary trie over
the SHA-256 of the device name, one object per node, no object larger than a bound (the
nodes, and how readers find them: :mod:`.index_nodes`).

Every leaf is updated by compare-and-swap (:meth:`ModelTrie.update`), and:

- a leaf whose update would make it larger than the bound (``leaf_bytes`` of the root's
  layout) is published as **splitting**: its entries are frozen (no writer changes them
  any more, readers still read them);
- a splitting node is then **split**: each non-empty half is created (``mode="create"``;
  an oversized half is created splitting and split in turn), then the node becomes a
  split marker by compare-and-swap from its splitting version. Any writer that meets a
  splitting node finishes the split the same way (the halves are computed from the
  frozen entries, so every helper creates the same objects, and ``create`` never replaces
  a half a writer has updated since); exactly one compare-and-swap commits it.

No node grows with the fleet: a node is at most ``leaf_bytes`` (plus the last entry that
crossed it, until it splits), or one entry.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from .._dataclass import dataclass, field
from ..errors import PreconditionFailed
from .index_nodes import (
    EMPTY,
    LEAF,
    SHARD_FORMAT,
    SPLIT,
    SPLITTING,
    Node,
    TrieNodes,
    device_bits,
)
from .index_store import ObjectStats, dumps

__all__ = [
    "EMPTY",
    "LEAF",
    "Change",
    "Check",
    "SHARD_FORMAT",
    "SPLIT",
    "SPLITTING",
    "ModelTrie",
    "Node",
    "device_bits",
]

#: Guards the outcome records the threads of an update fill.
_LOCK = threading.Lock()

#: ``change(old entry or None) -> new entry`` (None: leave it as it is).
Change = Callable[[dict[str, Any] | None], dict[str, Any] | None]
#: device -> (entry before, entry published) of the changes an update made.
Made = dict[str, tuple[dict[str, Any] | None, dict[str, Any]]]
#: ``check(located)``: a look-up of an update's devices (prefix -> (node, devices)),
#: before any leaf it found is written; raises to refuse it.
Check = Callable[[dict[str, tuple[Node, list[str]]]], None]


class _Moved(Exception):
    """The node an update was aimed at is split (or splitting): look below it."""

    def __init__(self, node: Node) -> None:
        super().__init__(node.prefix)
        self.node = node


@dataclass
class LeafOutcome:
    """What the updates of one model's leaves did."""

    changes: Made = field(default_factory=dict)  # the entries this call changed
    #: The depth of each split this call committed.
    splits: list[int] = field(default_factory=list)
    stats: list[ObjectStats] = field(default_factory=list)
    #: The trie had no node when this call began (a new model).
    fresh: bool = False


class ModelTrie(TrieNodes):
    """The trie of ``model`` under ``directory`` (a URL ending without ``/``): its
    nodes as :class:`~.index_nodes.TrieNodes` reads them, updated and split here."""

    # -- writing ----------------------------------------------------------------------
    def update(
        self,
        changes: dict[str, Change],
        lo: int,
        hi: int,
        *,
        located: dict[str, tuple[Node, list[str]]] | None = None,
        workers: int = 8,
        check: Check | None = None,
    ) -> LeafOutcome:
        """Apply ``changes`` (device -> change of its entry) leaf by leaf, each by
        compare-and-swap; leaves that grow past the bound are split. A leaf takes the
        changes that keep it within what readers read of a node (``leaf_bytes`` plus
        :data:`~.index_bounds.ENTRY_ROOM`), the others after its split: a publish of
        thousands of entries at once into one leaf froze them all in one node readers
        refused. ``located`` is where the devices were found already (a walk).
        ``check`` sees every look-up this call makes before a leaf it found is written:
        its first (without ``located``) and each below a node found split since (a
        publish refuses there a node its reads show lost, :func:`.index_lost.check_creates`)."""
        out = LeafOutcome()
        if located is None:
            located = self.locate(list(changes), lo, hi)
            if check is not None:
                check(located)
        out.fresh = all(n.prefix == "" and n.kind == EMPTY for n, _ in located.values())
        carried: Made = {}  # what an uncertain write may have made above a split since
        while located:
            moved: list[tuple[str, list[str]]] = []
            with cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(located)))) as pool:
                futures = {
                    pool.submit(
                        self._update_leaf,
                        node,
                        {d: changes[d] for d in devs},
                        out,
                        {d: carried[d] for d in devs if d in carried},
                    ): (node.prefix, devs)
                    for node, devs in located.values()
                }
                carried = {}
                for fut in cf.as_completed(futures):
                    later, carry = fut.result()
                    carried.update(carry)
                    if later:
                        moved.append((futures[fut][0], later))
            located = {}
            for prefix, devs in moved:  # split since, or by this change: below it
                depth = len(prefix) + 1
                for p, (node, ds) in self.locate(devs, depth, depth).items():
                    located.setdefault(p, (node, []))[1].extend(ds)
            if check is not None and located:
                check(located)
        return out

    def _update_leaf(
        self, node: Node, changes: dict[str, Change], out: LeafOutcome, carried: Made
    ) -> tuple[list[str], Made]:
        """Update one leaf; returns the devices to look for below it (it turned out to
        be split, or this update split it before their changes), and the changes a
        write of this call whose outcome was unknown may have made to them (``carried``
        from above: an entry found as such a write made it is recorded as this call's
        change, which a retire's catalog placement and report need)."""
        prefix = node.prefix
        stats = ObjectStats(self.url(prefix), "leaf", entries=len(changes))
        made: Made = {}
        landed: Made = {}
        later: list[str] = []  # changes left for after the split this update makes
        room = self.store.limit(self.url(prefix))[0]  # what readers read of a node
        # The changes of the last write tried: a write whose outcome was unknown and that
        # is found in place on the next read made them (the store says it may have).
        tried: Made = {}

        def transform(value: dict[str, Any] | None, version: str | None) -> dict[str, Any] | None:
            current = self.parse(prefix, value, version)
            if current.kind in (SPLIT, SPLITTING):
                raise _Moved(current)
            entries = dict(current.entries)
            made.clear()
            landed.clear()
            later.clear()
            size = len(dumps(self.value(prefix, entries, SPLITTING)))
            for device, change in changes.items():
                old = entries.get(device)
                new = change(old)
                if new is None or new == old:
                    if device in carried and old == carried[device][1]:
                        landed[device] = carried[device]  # made above, before its split
                    continue
                grown = size + len(dumps(new)) + 1 - (0 if old is None else len(dumps(old)) + 1)
                if made and grown > room and len(prefix) < 256:
                    later.append(device)  # past what readers read: after the split
                    continue
                entries[device] = new
                made[device] = (old, new)
                size = grown
            if made:
                tried.clear()
                tried.update(made)
            return self.shape(prefix, entries) if made else None

        try:
            value, _version, written = self.store.update(
                self.url(prefix), transform, stats, first=(node.value, node.version)
            )
        except _Moved as moved:
            if moved.node.kind == SPLITTING:
                stats.splits += self._settle(moved.node, out)
            _record(out, stats)
            # A write of this call whose outcome was unknown may have landed before the
            # split (it may have caused it): its changes are in the halves now.
            carry = {**carried, **(tried if stats.uncertain else {})}
            return list(changes), {d: c for d, c in carry.items() if d in changes}
        with _LOCK:
            out.changes.update(landed)
        if written:
            out_changes = dict(made or tried)
            if value is not None and value.get("state") == SPLITTING:
                now = self.read(prefix)
                if now.kind == SPLITTING:
                    stats.splits += self._settle(now, out)
            with _LOCK:
                out.changes.update(out_changes)
        _record(out, stats)
        return list(later), {d: carried[d] for d in later if d in carried}

    def _settle(self, node: Node, out: LeafOutcome) -> int:
        """Finish splitting ``node`` (see the module docstring); returns the splits this
        call committed (its own and its halves')."""
        depth = len(node.prefix)
        halves: dict[str, dict[str, dict[str, Any]]] = {"0": {}, "1": {}}
        for device, entry in node.entries.items():
            halves[device_bits(device)[depth]][device] = entry
        deeper = []
        for bit, entries in halves.items():
            if not entries:
                continue  # an empty leaf is a node that does not exist
            child = node.prefix + bit
            value = self.shape(child, entries)
            self.store.create(self.url(child), value)  # False: a helper did, or a writer since
            if value["state"] == SPLITTING:
                deeper.append(child)
        committed = 0
        try:
            self.store.write(
                self.url(node.prefix),
                self.value(node.prefix, node.entries, SPLIT),
                "if-match",
                node.version,
            )
            committed = 1
            with _LOCK:
                out.splits.append(depth)
        except PreconditionFailed:
            pass  # another helper committed it (a splitting node only ever becomes split)
        for child in deeper:
            now = self.read(child)
            if now.kind == SPLITTING:
                committed += self._settle(now, out)
        return committed

    # -- building ---------------------------------------------------------------------
    def build(
        self, entries: dict[str, dict[str, Any]]
    ) -> tuple[list[tuple[str, dict[str, Any]]], Counter[int]]:
        """The nodes of a trie holding ``entries`` (written by a migration into a fresh
        directory), and its leaves per depth."""
        nodes: list[tuple[str, dict[str, Any]]] = []
        leaves: Counter[int] = Counter()
        sizes = {d: len(dumps(e)) + 1 for d, e in entries.items()}
        overhead = len(dumps(self.value("", {}, LEAF))) + 300

        def rec(prefix: str, group: dict[str, dict[str, Any]]) -> None:
            size = overhead + sum(sizes[d] for d in group)
            if len(group) <= 1 or size <= self.leaf_bytes or len(prefix) >= 256:
                nodes.append((prefix, self.value(prefix, group, LEAF)))
                leaves[len(prefix)] += 1
                return
            nodes.append((prefix, self.value(prefix, group, SPLIT)))
            for bit in "01":
                half = {d: e for d, e in group.items() if device_bits(d)[len(prefix)] == bit}
                if half:
                    rec(prefix + bit, half)
                else:
                    leaves[len(prefix) + 1] += 1

        if entries:
            rec("", entries)
        else:
            leaves[0] += 1
        return nodes, leaves


def _record(out: LeafOutcome, stats: ObjectStats) -> None:
    with _LOCK:
        out.stats.append(stats)
