"""The entries of one model in an index v3: a binary trie over the SHA-256 of the device
name, one object per node, no object larger than a bound.

A node is ``<model dir>/t<bits>.json`` where ``<bits>`` is the node's prefix of the
device hash in binary (``t.json`` is the top). Each node is one of::

    {"format": "ptestore.index-shard", "version": 3, "model": "mlp", "prefix": "01",
     "state": "leaf" | "splitting" | "split", "entries": [...]}   # no entries when split,
                                         # "halves": ["0", "1"] instead (index_place)

- a **leaf** holds the entries whose device hash starts with its prefix; a node that does
  not exist below a split node is an empty leaf;
- a leaf whose update would make it larger than the bound (``leaf_bytes`` of the root's
  layout) is published as **splitting**: its entries are frozen (no writer changes them
  any more, readers still read them);
- a splitting node is then **split**: each non-empty half is created (``mode="create"``;
  an oversized half is created splitting and split in turn), then the node becomes a
  split marker by compare-and-swap from its splitting version. Any writer that meets a
  splitting node finishes the split the same way (the halves are computed from the
  frozen entries, so every helper creates the same objects, and ``create`` never replaces
  a half a writer has updated since); exactly one compare-and-swap commits it.

Readers walk from the shallowest depth a leaf can be at (the model's catalog counts the
leaves per depth, :mod:`.index_catalog`) and follow split markers down. No node grows
with the fleet: a node is at most ``leaf_bytes`` (plus the last entry that crossed it,
until it splits), or one entry.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from .._dataclass import dataclass, field
from ..errors import FormatError, PreconditionFailed
from .index_bounds import check_name
from .index_place import HALVES, check_place, device_bits, halves_of
from .index_store import IndexStore, ObjectStats, dumps

__all__ = [
    "EMPTY",
    "LEAF",
    "Change",
    "SHARD_FORMAT",
    "SPLIT",
    "SPLITTING",
    "ModelTrie",
    "Node",
    "device_bits",
]

SHARD_FORMAT = "ptestore.index-shard"
#: Guards the outcome records the threads of an update fill.
_LOCK = threading.Lock()
LEAF, SPLITTING, SPLIT, EMPTY = "leaf", "splitting", "split", "empty"
_STATES = (LEAF, SPLITTING, SPLIT)

#: ``change(old entry or None) -> new entry`` (None: leave it as it is).
Change = Callable[[dict[str, Any] | None], dict[str, Any] | None]
#: device -> (entry before, entry published) of the changes an update made.
Made = dict[str, tuple[dict[str, Any] | None, dict[str, Any]]]


@dataclass
class Node:
    """One node as read: its state, entries (device -> entry) and version token."""

    prefix: str
    kind: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: str | None = None
    value: dict[str, Any] | None = None
    #: Found by :meth:`ModelTrie.locate` missing below a split node: that node's value.
    above: dict[str, Any] | None = None


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


class ModelTrie:
    """The trie of ``model`` under ``directory`` (a URL ending without ``/``)."""

    def __init__(self, store: IndexStore, directory: str, model: str, leaf_bytes: int) -> None:
        self.store = store
        self.directory = directory
        self.model = model
        self.leaf_bytes = leaf_bytes

    # -- nodes ------------------------------------------------------------------------
    def url(self, prefix: str) -> str:
        return f"{self.directory}/t{prefix}.json"

    def value(self, prefix: str, entries: dict[str, dict[str, Any]], state: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": SHARD_FORMAT,
            "version": 3,
            "model": self.model,
            "prefix": prefix,
            "state": state,
        }
        if state != SPLIT:
            out["entries"] = [entries[d] for d in sorted(entries)]
        else:  # the halves a split of ``entries`` made (a node never removed: index_place)
            out[HALVES] = halves_of(prefix, entries)
        return out

    def shape(self, prefix: str, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """A leaf of ``entries``, or a splitting node when it would exceed the bound."""
        leaf = self.value(prefix, entries, LEAF)
        if len(entries) > 1 and len(dumps(leaf)) > self.leaf_bytes and len(prefix) < 256:
            leaf["state"] = SPLITTING
        return leaf

    def parse(self, prefix: str, value: dict[str, Any] | None, version: str | None) -> Node:
        url = self.url(prefix)
        if value is None:
            return Node(prefix, EMPTY, {}, None, None)
        if value.get("format") != SHARD_FORMAT:
            raise FormatError(url, "index shard format", value.get("format"), repr(SHARD_FORMAT))
        state = value.get("state")
        if state not in _STATES:
            raise FormatError(url, "index shard state", state, " or ".join(map(repr, _STATES)))
        entries: dict[str, dict[str, Any]] = {}
        if state != SPLIT:
            raw = value.get("entries")
            if not isinstance(raw, list):
                raise FormatError(url, "index shard entries", raw, "a list")
            for e in raw:
                if not isinstance(e, dict) or not isinstance(e.get("device"), str):
                    raise FormatError(url, "index shard entry", e, "an object with a device")
                check_name(e["device"], url, "index shard entry device")
                entries[e["device"]] = e
        check_place(value, url, prefix, self.directory.rsplit("/", 1)[-1], entries)
        return Node(prefix, str(state), entries, version, value)

    def read(self, prefix: str) -> Node:
        value, version = self.store.read_json(self.url(prefix))
        return self.parse(prefix, value, version)

    def _read_many(self, prefixes: set[str]) -> dict[str, Node]:
        got = self.store.read_many([self.url(p) for p in sorted(prefixes)])
        return {p: self.parse(p, *got[self.url(p)]) for p in prefixes}

    # -- finding ----------------------------------------------------------------------
    def locate(self, devices: list[str], lo: int, hi: int) -> dict[str, tuple[Node, list[str]]]:
        """The node holding each of ``devices``: ``{prefix: (node, devices)}``. Depths
        ``lo``..``hi`` are read at once (where the catalog says leaves are), then one
        depth at a time below a split node. A node found missing below a split is read
        again unless it was read after its parent was seen split: a split creates its
        halves before it commits, so a half read before its parent may be one made since
        (taken for an empty leaf, its entries would read as absent)."""
        out: dict[str, tuple[Node, list[str]]] = {}
        pending = list(dict.fromkeys(devices))
        depth, last = lo, max(lo, hi)
        known: dict[str, Node] = {}
        after_split: set[str] = set()  # read after their parent was seen split
        while pending:
            want = {device_bits(d)[:k] for d in pending for k in range(depth, last + 1)}
            split_before = {p for p, n in known.items() if n.kind == SPLIT}
            got = self._read_many(want - set(known))
            after_split.update(p for p in got if p and p[:-1] in split_before)
            known.update(got)
            still = []
            for d in pending:
                node = self._resolve(device_bits(d), depth, known, after_split)
                if node is None:
                    still.append(d)
                else:
                    if node.kind == EMPTY and node.prefix:  # its split node (its halves)
                        node.above = getattr(known.get(node.prefix[:-1]), "value", None)
                    out.setdefault(node.prefix, (node, []))[1].append(d)
            pending = still
            depth, last = last + 1, last + 1
        return out

    def _resolve(
        self, bits: str, depth: int, known: dict[str, Node], after_split: set[str]
    ) -> Node | None:
        """The node holding the device of ``bits`` from the nodes ``known`` (None: read
        deeper first). An empty half of a split read with its parent is read again, and
        below it, when it turns out split, each node of the path after its parent."""
        for k in range(depth, 257):
            node = known.get(bits[:k])
            if node is None:
                return None
            if node.kind == SPLIT:
                continue
            if node.kind == EMPTY and k > 0:
                node = self._holder(bits, k, known)
            break
        else:  # a device hash has 256 bits: no node below that depth
            url = self.url(bits[:256])
            raise FormatError(url, "index shard state", SPLIT, "a leaf at depth 256")
        while node.kind == EMPTY and node.prefix and node.prefix not in after_split:
            node = known[node.prefix] = self.read(node.prefix)
            after_split.add(node.prefix)
            while node.kind == SPLIT and len(node.prefix) < 256:
                child = bits[: len(node.prefix) + 1]
                node = known[child] = self.read(child)
                after_split.add(child)
        return node

    def _holder(self, bits: str, k: int, known: dict[str, Node]) -> Node:
        """The node that holds a device whose node at depth ``k`` does not exist: that
        empty leaf when its parent is split, else the first node above it that is not
        empty (a catalog that started the walk too deep is never trusted blindly)."""
        j = k - 1
        while j >= 0:
            parent = known.get(bits[:j])
            if parent is None:
                parent = known[bits[:j]] = self.read(bits[:j])
            if parent.kind == SPLIT:
                return known[bits[: j + 1]]
            if parent.kind != EMPTY:
                return parent
            j -= 1
        return known[""]

    def find(self, device: str, lo: int, hi: int) -> tuple[dict[str, Any] | None, str]:
        """The entry of ``device`` (None when there is none) and the URL of the leaf
        that holds it (or would), as the nodes are: a lost leaf reads as empty here.
        Readers use :func:`~.index_whole.device_entry`, which tells them apart."""
        for node, _ in self.locate([device], lo, hi).values():
            return node.entries.get(device), self.url(node.prefix)
        return None, self.url("")

    def walk(self, *, empty: bool = False) -> Iterator[Node]:
        """Every leaf from the top (split markers followed; nodes left unreachable by an
        unfinished split are never read); with ``empty``, the empty leaves too."""
        level = {""}
        while level:
            nodes = self._read_many(level)
            level = set()
            for prefix in sorted(nodes):
                node = nodes[prefix]
                if node.kind == SPLIT:
                    if len(prefix) < 256:
                        level |= {prefix + "0", prefix + "1"}
                elif empty or node.kind != EMPTY:
                    yield node

    # -- writing ----------------------------------------------------------------------
    def update(
        self,
        changes: dict[str, Change],
        lo: int,
        hi: int,
        *,
        located: dict[str, tuple[Node, list[str]]] | None = None,
        workers: int = 8,
    ) -> LeafOutcome:
        """Apply ``changes`` (device -> change of its entry) leaf by leaf, each by
        compare-and-swap; leaves that grow past the bound are split. A leaf takes the
        changes that keep it within what readers read of a node (``leaf_bytes`` plus
        :data:`~.index_bounds.ENTRY_ROOM`), the others after its split: a publish of
        thousands of entries at once into one leaf froze them all in one node readers
        refused. ``located`` is where the devices were found already (a walk)."""
        out = LeafOutcome()
        if located is None:
            located = self.locate(list(changes), lo, hi)
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
