"""The nodes of one model's entries in an index v3, as readers find them: a binary trie
over the SHA-256 of the device name, one object per node, no object larger than a bound
(how writers update and split it: :mod:`.index_trie`).

A node is ``<model dir>/t<bits>.json`` where ``<bits>`` is the node's prefix of the
device hash in binary (``t.json`` is the top). Each node is one of::

    {"format": "ptestore.index-shard", "version": 3, "model": "mlp", "prefix": "01",
     "state": "leaf" | "splitting" | "split", "entries": [...]}   # no entries when split,
                                         # "halves": ["0", "1"] instead (index_place)

- a **leaf** holds the entries whose device hash starts with its prefix; a node that does
  not exist below a split node is an empty leaf;
- a **splitting** node is a leaf whose entries are frozen while its split is made
  (readers still read them);
- a **split** node (a split marker) holds no entries: they are in its halves.

Readers walk from the shallowest depth a leaf can be at (the model's catalog counts the
leaves per depth, :mod:`.index_catalog`) and follow split markers down
(:meth:`TrieNodes.locate`, :meth:`TrieNodes.walk`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .._dataclass import dataclass, field
from ..errors import FormatError
from .index_bounds import check_name
from .index_place import HALVES, check_place, device_bits, halves_of
from .index_store import IndexStore, dumps

__all__ = [
    "EMPTY",
    "LEAF",
    "SHARD_FORMAT",
    "SPLIT",
    "SPLITTING",
    "Node",
    "TrieNodes",
    "device_bits",
]

SHARD_FORMAT = "ptestore.index-shard"
LEAF, SPLITTING, SPLIT, EMPTY = "leaf", "splitting", "split", "empty"
_STATES = (LEAF, SPLITTING, SPLIT)


@dataclass
class Node:
    """One node as read: its state, entries (device -> entry) and version token."""

    prefix: str
    kind: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: str | None = None
    value: dict[str, Any] | None = None
    #: Found by :meth:`TrieNodes.locate` missing below a split node: that node's value.
    above: dict[str, Any] | None = None


class TrieNodes:
    """The nodes of ``model``'s trie under ``directory`` (a URL ending without ``/``):
    their URLs and values, read and found (:class:`~.index_trie.ModelTrie` writes them)."""

    def __init__(self, store: IndexStore, directory: str, model: str, leaf_bytes: int) -> None:
        self.store = store
        self.directory = directory
        self.model = model
        self.leaf_bytes = leaf_bytes
        #: The nodes read so far, by prefix, when a reader keeps them (:meth:`keep`).
        self.kept: dict[str, Node] | None = None

    def keep(self) -> TrieNodes:
        """Keep every node found (not a missing one) once read, for this object's life:
        one device's look-up that resolves several entries reads each node once (a
        snapshot: a node split since is read as it was, its entries still there). A
        node found missing is read again each time (:meth:`locate` reads such a half
        again after its split node)."""
        self.kept = {}
        return self

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
        return self._read_many({prefix})[prefix]

    def _read_many(self, prefixes: set[str]) -> dict[str, Node]:
        kept = {} if self.kept is None else self.kept
        out = {p: kept[p] for p in prefixes if p in kept}
        wanted = sorted(prefixes - set(out))
        got = self.store.read_many([self.url(p) for p in wanted])
        for p in wanted:
            out[p] = node = self.parse(p, *got[self.url(p)])
            if self.kept is not None and node.kind != EMPTY:
                self.kept[p] = node
        return out

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
