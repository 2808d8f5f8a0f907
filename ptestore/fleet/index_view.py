"""What a device reads of an index to choose an artifact for one model.

``select`` rates every live entry of the model. From a version 1/2 index (one object) or
an index given as a dict, those are the entries themselves. From a version 3 index a
device reads a bounded number of small objects, whatever the size of the fleet:

1. the root (a few hundred bytes);
2. the model's catalog: each distinct list of compatibility stamps of its live entries,
   with the first few device names of each (:mod:`.index_catalog`);
3. its own entry's leaf (the depths the catalog names, at once; at most ``leaf_bytes``);
4. when another device's build (or, with nothing that fits, the model's source) is the
   answer, that entry's leaf, checked: still live and still those stamps, else the next.

The entries of the other devices are stand-ins (model, device, stamps) until one is
chosen: every member of a class rates the same, and the first by name of the best class
is the one a version 2 index would give (:func:`ModelView.resolve` reads it). The
others are listed as candidates unread: reading them all would read a leaf per listed
device (the 64 stand-ins of a model of 300 devices: 51 objects, 340 KB, for a select that
reads at most 8 and 64 KiB). A retire takes an entry out of the catalog before its leaf
retires it (:mod:`.index_v3`), so a stand-in is not a retired entry unless the catalog was
damaged or restored by hand, or a retire was killed after retiring a pair a run published
again while it ran (``fleet check-index`` reports each).

A retire that takes every listed device out of a class with more members leaves it
listing none (``"devices": [], "more": true``) until it rebuilds the catalog from the
leaves, after its leaf writes (for good when it is killed between the two). Such a class
still has live builds: its members are looked up in the leaves (:func:`_members`: the
nodes the device's own look-up read first, then depth first from the top, at most
:data:`MAX_SCANNED` more read, none once each such class has a member), the first
:data:`NAMES_PER_CLASS` found by name rated as whole entries (one rating per class), not
necessarily the first of the class by name (the catalog no longer says which). A class
none of whose members the nodes read hold, the leaves not all read, counts as
``unfound``: not rated; with no other build to rate, ``select`` says so
(:meth:`ModelView.unfound_error`), never that the model is retired, which the leaves,
all read, say: then the live entries they hold of kinds the catalog lacks (a run killed
before its catalog write) are rated too, and only none is "retired".

What an index the device does not control can make a look-up cost is bounded, whatever
its catalog holds: each node is read at most once per look-up (the trie keeps what it
read, :meth:`~.index_nodes.TrieNodes.keep`: stand-ins of one leaf read it once, not once
each); at most :data:`MAX_RESOLVED` stand-ins are resolved before the catalog is refused
(a :class:`FormatError` pointing to ``fleet check-index``); and only the first
:data:`MAX_CLASSES` classes (by their first device name), with the first
:data:`NAMES_PER_CLASS` names of each, become stand-ins (``layout.listed`` allows 1,000
names per class: 1,000 classes of 1,000 names rated a million stand-ins, 2.4 GB). A class
past the bound is not rated (``unrated`` counts them: the device's own entry is always
rated); one whose names are cut counts as ``unlisted``, as one with more members than its
catalog lists.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, FormatError
from .index_catalog import class_key, depth_range, live_stamps
from .index_store import ReadCount

if TYPE_CHECKING:
    from .index_nodes import Node
    from .index_trie import ModelTrie
    from .index_v3 import ShardedIndex

__all__ = [
    "MAX_CLASSES",
    "MAX_RESOLVED",
    "MAX_SCANNED",
    "MODELS_NAMED",
    "NAMES_PER_CLASS",
    "ModelView",
    "model_view",
]

#: How many model names an error about a missing model reads and names at most.
MODELS_NAMED = 20
#: The stand-ins one look-up resolves (reads from their leaves) at most: past them, the
#: catalog disagrees with its leaves more than runs changing them meanwhile explain.
MAX_RESOLVED = 16
#: The classes of a catalog (kinds of build) a look-up rates at most, the first by their
#: first device name.
MAX_CLASSES = 1024
#: The names of a class that become stand-ins (candidates) at most.
NAMES_PER_CLASS = 8
#: The nodes of a model's trie one look-up reads at most (besides those its own entry's
#: look-up read) to find members of classes its catalog lists no device of.
MAX_SCANNED = 16


@dataclass
class ModelView:
    """The live entries of one model that ``select`` rates, in device order."""

    model: str
    entries: list[dict[str, Any]]
    #: The model has entries, all of them retired.
    retired_only: bool = False
    #: Classes of builds whose members beyond the listed ones are not stand-ins here.
    unlisted: int = 0
    #: Classes past :data:`MAX_CLASSES`: not rated.
    unrated: int = 0
    reads: ReadCount | None = None
    #: The models with live entries (a version 1/2 index or a dict; else read on demand).
    known_models: list[str] | None = None
    sharded: ShardedIndex | None = None
    depths: tuple[int, int] = (0, 0)
    stand_ins: set[int] = field(default_factory=set)
    #: The URL of the leaf each device's whole entry was read from (a sharded index).
    leaves: dict[str, str] = field(default_factory=dict)
    #: The model's catalog as read (a sharded index; None: none).
    catalog: dict[str, Any] | None = None
    #: The model's trie, keeping the nodes it read (a sharded index).
    trie: ModelTrie | None = None
    #: The stand-ins resolved so far.
    resolved: int = 0
    #: The kind of build each entry is rated as, by ``id``: a stand-in's and a member
    #: found in the leaves (:func:`_members`) that of its class (one rating per class);
    #: an entry not here is its own kind.
    kinds: dict[int, int] = field(default_factory=dict)
    #: Classes listing no device, with members, none of which the nodes read hold (the
    #: leaves not all read): not rated.
    unfound: int = 0

    def kind(self, entry: dict[str, Any]) -> int:
        """The key ``entry`` is rated under: entries of one kind rate the same."""
        return self.kinds.get(id(entry), id(entry))

    def source(self, entry: dict[str, Any], index: str) -> str:
        """Where ``entry`` was read: its leaf, else ``index`` (the index's URL, or how
        an index given as a dict is named)."""
        return self.leaves.get(str(entry.get("device")), index)

    def resolve(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The whole entry ``entry`` stands for: itself, or, for a stand-in, the entry
        read from its leaf when it is still live with the same stamps (None: it changed
        since the catalog was read). A stand-in's leaf lost is a :class:`FormatError`
        (:func:`~.index_whole.device_entry`: the catalog lists its device)."""
        if id(entry) not in self.stand_ins or self.sharded is None or self.trie is None:
            return entry
        from .index_whole import device_entry  # a lost leaf: a FormatError, never None

        if self.resolved >= MAX_RESOLVED:
            raise self._too_many()
        self.resolved += 1
        found, leaf = device_entry(
            self.sharded, self.trie, self.catalog, str(entry["device"]), self.depths
        )
        self.leaves[str(entry["device"])] = leaf
        stamps = live_stamps(found)
        if (
            found is None
            or stamps is None
            or class_key(stamps) != class_key(entry["compatibility"])
        ):
            return None
        return found

    def _too_many(self) -> FormatError:
        """The error of a look-up that resolved :data:`MAX_RESOLVED` stand-ins, none of
        them as its catalog lists it."""
        assert self.sharded is not None
        return FormatError(
            self.sharded.catalog_url(self.model),
            "index catalog devices tried",
            MAX_RESOLVED,
            "fewer listed devices whose leaves do not hold them live with their class's stamps",
            f"the first {MAX_RESOLVED} tried for model {self.model!r} are not: changed while "
            "they were read, or the catalog disagrees with its leaves; run again, and if it "
            f"persists: ptestore fleet check-index {self.sharded.store.root} says which, "
            "--repair rebuilds the catalog from the leaves",
        )

    def unfound_error(self, where: str) -> ConfigurationError:
        """The error of a look-up that found no entry to rate, or none that fits, while
        the catalog lists no device of :attr:`unfound` classes with members and the nodes
        read hold none (``where``: the index as the caller names it): never the portable
        source, which a build of those kinds might have beaten."""
        return ConfigurationError(
            f"{where}: the catalog of model {self.model!r} lists no device of "
            f"{self.unfound} kind(s) of build that have live members (a retire is taking "
            "them out of it, or was stopped before it rebuilt it from the leaves), and the "
            f"first {MAX_SCANNED} nodes of its leaves read hold none of them: run again, and "
            f"if it persists: ptestore fleet check-index {where} --repair rebuilds the "
            "catalog from the leaves"
        )

    def models(self) -> tuple[list[str], int]:
        """The models of the index that have live entries (at most
        :data:`MODELS_NAMED` of them read), and how many more there are."""
        if self.known_models is not None:
            return self.known_models, 0
        assert self.sharded is not None
        segments = self.sharded.segments()
        names = []
        for seg in segments[:MODELS_NAMED]:
            model = self.sharded.model_of(seg)
            if model is None:
                continue
            catalog, _ = self.sharded.read_catalog(model)
            if catalog is not None and catalog["classes"]:
                names.append(model)
        return sorted(names), max(0, len(segments) - MODELS_NAMED)


def _from_entries(model: str, all_entries: list[Any], source: str) -> ModelView:
    """The view of a version 1/2 index (or one given as a dict, ``source`` naming it):
    an entry that is not one (:func:`~.index_bounds.v2_entry_problems`) is refused, never
    skipped (it hid a model's entry: the portable source was handed out)."""
    from .index_bounds import check_v2_entries

    entries: list[dict[str, Any]] = check_v2_entries(all_entries, source)
    live = [e for e in entries if not e.get("retired")]  # fleet/retire.py
    mine = [e for e in live if e.get("model") == model]
    gone = not mine and any(e.get("model") == model for e in entries)
    models = sorted({str(e.get("model")) for e in live})
    return ModelView(model, mine, retired_only=gone, known_models=models)


def model_view(
    index: dict[str, Any] | str | os.PathLike[str],
    model: str,
    device: str,
    storage_options: dict[str, Any] | None = None,
) -> ModelView:
    """What ``select`` rates for ``model`` on the device named ``device`` (see the
    module docstring)."""
    if isinstance(index, dict):
        return _from_entries(model, list(index.get("entries", [])), "<index>")
    from .index import open_index

    root, sharded, store = open_index(index, storage_options)
    if sharded is None:
        view = _from_entries(model, list(root["entries"]), os.fspath(index))
        view.reads = store.reads
        return view
    from .index_whole import device_entry

    catalog, _ = sharded.read_catalog(model)
    depths = depth_range(catalog)
    trie = sharded.trie(model)
    trie.keep()  # each node read once, however many stand-ins resolve (module docstring)
    # a lost part of the index where its entry would be: a FormatError, never "none"
    own, leaf = device_entry(sharded, trie, catalog, device, depths)
    entries: list[dict[str, Any]] = []
    if own is not None and not own.get("retired"):
        entries.append(own)
    view = ModelView(model, entries, reads=store.reads, sharded=sharded, depths=depths)
    view.catalog, view.trie = catalog, trie
    view.leaves[device] = leaf
    classes = (catalog or {}).get("classes", [])
    mine = live_stamps(own)
    unlisted: dict[str, dict[str, Any]] = {}  # classes to look up in the leaves
    for cls in classes[:MAX_CLASSES]:
        names = [n for n in cls["devices"] if n != device]  # its own: read from its leaf
        for name in names[:NAMES_PER_CLASS]:
            stand_in = {"model": model, "device": name, "compatibility": cls["compatibility"]}
            entries.append(stand_in)
            view.stand_ins.add(id(stand_in))
            view.kinds[id(stand_in)] = id(cls["compatibility"])
        if cls.get("more") or len(names) > NAMES_PER_CLASS:
            view.unlisted += 1
        key = class_key(cls["compatibility"])
        if not names and cls.get("more") and (mine is None or class_key(mine) != key):
            unlisted[key] = cls  # a retire emptied its list (module docstring)
    if unlisted:
        found, whole = _members(trie, set(unlisted), device)
        for key, cls in unlisted.items():
            members = found.pop(key, [])
            _add(view, members, id(cls["compatibility"]))
            view.unfound += not members and not whole
        if whole and not entries:  # the leaves, all read, hold builds the catalog lacks
            for members in found.values():
                _add(view, members, id(members[0][0]["compatibility"]))
    view.unrated = max(0, len(classes) - MAX_CLASSES)
    entries.sort(key=lambda e: str(e["device"]))
    view.retired_only = (
        not entries and not view.unfound and (catalog is not None or own is not None)
    )
    return view


def _add(view: ModelView, members: list[tuple[dict[str, Any], str]], kind: int) -> None:
    """The first :data:`NAMES_PER_CLASS` of ``members`` (found in the leaves, with
    their leaf) by name among ``view``'s entries, rated as one ``kind``."""
    for entry, leaf in sorted(members, key=lambda m: str(m[0]["device"]))[:NAMES_PER_CLASS]:
        view.entries.append(entry)
        view.kinds[id(entry)] = kind
        view.leaves[str(entry["device"])] = leaf


def _members(
    trie: ModelTrie, wanted: set[str], device: str
) -> tuple[dict[str, list[tuple[dict[str, Any], str]]], bool]:
    """The live entries that ``trie``'s leaves hold, but ``device``'s, by class (by
    :func:`class_key`), each with the URL of its leaf, looking for members of the classes
    ``wanted``; and whether every leaf was read. The nodes read already (kept: the
    device's own look-up) first, then depth first from the top, split markers followed,
    toward those nodes first; at most :data:`MAX_SCANNED` nodes read (a node found
    missing counts), none once every class wanted has a member."""
    from .index_trie import EMPTY, SPLIT
    from .index_whole import named_half

    found: dict[str, list[tuple[dict[str, Any], str]]] = {}
    kept = dict(trie.kept or {})
    toward = {p[:k] for p in kept for k in range(len(p) + 1)}
    seen: set[str] = {device}

    def take(node: Node) -> None:
        for name, entry in node.entries.items():
            stamps = live_stamps(entry)
            if stamps is None or name in seen:
                continue
            seen.add(name)
            found.setdefault(class_key(stamps), []).append((entry, trie.url(node.prefix)))

    for node in kept.values():
        if node.kind != SPLIT:
            take(node)
    stack, reads = [""], 0
    above: dict[str, dict[str, Any] | None] = {}  # a half's split node, as read
    while stack:
        prefix = stack.pop()
        if wanted <= found.keys():
            return found, False
        if prefix not in kept:
            if reads >= MAX_SCANNED:
                return found, False
            reads += 1
            node = trie.read(prefix)
            lost = node.kind == EMPTY and named_half(trie, prefix, above.get(prefix))
            if lost:  # a half its split made is missing: never read as no entries
                raise lost
            if node.kind != SPLIT:
                take(node)
        else:
            node = kept[prefix]
        if node.kind == SPLIT and len(prefix) < 256:  # toward the kept ones: popped first
            above[prefix + "0"] = above[prefix + "1"] = node.value
            stack += sorted((prefix + "1", prefix + "0"), key=lambda p: p in toward)
    return found, True
