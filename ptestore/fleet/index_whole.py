"""Reading every entry of a version 3 index (:mod:`.index_v3`) so that a part of it that
is missing is an error, never "no entries".

A node that does not exist reads as an empty leaf: the leaf of a pair never published,
the half of a split that got no entry. A reader of one device's entry (``select``,
``find_entry``, ``fetch INDEX``, ``ensure INDEX``) rightly answers "no entry" there,
unless the objects it read show the node lost (:func:`device_entry`: its split parent's
other half a leaf, or its split parent naming it among the halves it made, the model's
top node gone under its catalog, a device the catalog lists). A reader of every entry
cannot take a lost leaf or shard directory for an empty one: ``gc`` would remove the
files of the entries it held (:mod:`.orphan_refs`), ``fleet retire`` would retire
nothing there, ``load_index`` and ``iter_entries`` would return fewer entries. What
tells a lost part from an empty one, model by model, its catalog read before its leaves
(:func:`model_nodes`):

- every split node has below it at least the two entries it split, and a half of it that
  does not exist has a split (or splitting) sibling: a split creates each half that gets
  an entry, and a node is never removed, so a half that got none left all of them to
  the other, more than a leaf holds, which was split in turn (:func:`check_splits`);
- every device the catalog lists has an entry in one of the leaves: a writer updates the
  leaves before the catalog, and never removes an entry (:func:`check_listed`);
- every half a split node names (``halves``, :mod:`.index_place`: the halves its split
  made, created before it committed) exists (:func:`check_halves`: the split nodes
  above the halves found missing read again, none in a trie without one).

All hold whatever writers do meanwhile (each is about objects written before the first
one read), so a reader never refuses a sound index that runs are changing. gc
(``strict``) also stops on a catalog that lists live builds while the leaves hold no
live entry (a retire can take an entry out of the catalog, then retire its leaf, between
the two reads: gc says so and is run again) and on a catalog it cannot read; the other
readers leave those to ``fleet check-index``.

The shard directory (:func:`model_segments`): gc requires the copy of the root its
writers leave there (``root.json``); the other readers refuse a directory that holds
neither that copy nor any model's objects (removed or moved; a store may still list the
emptied model directories), and read one without the copy but with a model's objects as
the index an earlier ptestore made (its next publish writes the copy).

What none of this tells: a model's lost directory from a model never published, and a
lost leaf whose devices the catalog does not list beside a split node, where its split
node does not name it: a half its split left empty that got its first entry later (the
split was committed before it existed), or any half below a split marker an earlier
ptestore wrote (no ``halves``). Neither the shape nor any object on the device's path
says such a node was ever made (``gc --job`` checks that every pair of its job has an
entry). One device's look-up does not check the entries below a split node either (it
reads one path of the trie). The writers refuse to hide what these rules show lost
(:mod:`.index_lost`: a catalog rebuild, a publish that would create the node again).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from ..errors import FormatError, PteStoreError
from .index_catalog import check_catalog
from .index_place import HALVES
from .index_root import NAMED
from .index_store import IndexStore
from .index_trie import EMPTY, LEAF, SPLIT, ModelTrie, Node

__all__ = [
    "ShardDirectory",
    "check_halves",
    "check_listed",
    "check_splits",
    "device_entry",
    "incomplete",
    "lost_half",
    "lost_top",
    "model_nodes",
    "model_segments",
    "named_half",
    "sibling",
    "unheld",
]


class ShardDirectory(Protocol):
    """What is read here of a version 3 index (:class:`~.index_v3.ShardedIndex`)."""

    store: IndexStore
    layout: dict[str, Any]
    directory: str
    listed: int

    def segments(self) -> list[str]: ...


def model_segments(index: ShardDirectory, *, strict: bool = False) -> list[str]:
    """The model directories of ``index`` (one listing), once its shard directory is
    known to be there (module docstring); :class:`FormatError` naming the index's URL
    when it is not. ``strict`` (gc): its copy of the root is read first and required."""
    url = index.store.root
    shards = index.layout["shards"]
    if strict and index.store.read(f"{index.directory}/{NAMED}")[1] is None:
        raise FormatError(
            url,
            "index layout.shards",
            shards,
            f"a directory holding {NAMED}, the copy of this root its writers leave there",
            f"there is none at {index.directory}/{NAMED}: its shards were removed or moved, "
            "and the entries they held are unknown. Restore them; an index an earlier "
            "ptestore made without the copy gets it from its next fleet run",
        )
    try:
        segments = index.segments()
    except PteStoreError:
        raise
    except Exception as exc:  # a listing that failed (S3: the network): one line
        from .._retry import to_storage_error

        raise to_storage_error(exc, f"{index.directory}/m/", "listing the models") from exc
    if not strict and not _named_or_held(index, segments):
        raise FormatError(
            url,
            "index layout.shards",
            shards,
            f"a directory holding {NAMED} (the copy of this root its writers leave there) "
            "or a model's shards",
            f"there is neither in {index.directory}: its shards were removed or moved, and "
            "the entries they held are unknown; restore them",
        )
    return segments


def _named_or_held(index: ShardDirectory, segments: list[str]) -> bool:
    """Whether the shard directory holds its copy of the root, or else (an index an
    earlier ptestore made) a model directory holding its catalog or its top node (a
    store may list a directory whose objects were all removed: SeaweedFS keeps it)."""
    if index.store.read(f"{index.directory}/{NAMED}")[1] is not None:
        return True
    for segment in segments:  # the first one holds them, unless they are gone
        for name in ("catalog.json", "t.json"):
            if index.store.read(f"{index.directory}/m/{segment}/{name}", oversize_ok=True)[1]:
                return True
    return False


def model_nodes(index: ShardDirectory, trie: ModelTrie, *, strict: bool = False) -> list[Node]:
    """Every leaf of ``trie``, a model of ``index``, the empty ones included (a node
    that does not exist where a split leads), its catalog read first and both checked
    (module docstring). A missing part is a :class:`FormatError` naming the index's URL
    (with ``strict``, gc's, the node's)."""
    where = f"{trie.directory}/catalog.json"
    catalog: dict[str, Any] | None = None
    try:
        value, _ = index.store.read_json(where)
        catalog = None if value is None else check_catalog(value, where, index.listed)
    except FormatError:
        if strict:
            raise
        catalog = None  # damaged: check-index reports it; the leaves are read as they are
    nodes = list(trie.walk(empty=True))
    held = {d: e for node in nodes for d, e in node.entries.items()}
    try:
        check_splits(trie, nodes)
        if catalog is not None:
            check_listed(catalog, where, held, strict=strict)
        check_halves(trie, nodes)
    except FormatError as exc:
        if strict:
            raise
        raise incomplete(index, exc) from None
    return nodes


def lost_part(index: ShardDirectory, problem: FormatError, refused: str) -> FormatError:
    """The error of a reader or writer of ``index`` that found a part of it missing
    (``problem``, naming the node that tells and the object missing): ``refused``, what
    it does not do and why, follows the problem."""
    return FormatError(
        index.store.root,
        "index shards",
        index.layout["shards"],
        "every node its catalogs and split nodes name",
        f"{problem}; {refused}",
    )


def incomplete(index: ShardDirectory, problem: FormatError) -> FormatError:
    """The error of a reader of every entry of ``index`` that found a part of it
    missing (``problem``, naming the node that tells and the object missing)."""
    return lost_part(
        index,
        problem,
        "the index cannot be read whole: restore what is missing (read as empty, the "
        "entries it held would be left out)",
    )


def check_splits(trie: ModelTrie, leaves: list[Node]) -> None:
    """Every split node above ``leaves`` (the walk's, empty ones included) has at least
    two entries below it (the deepest that has not is named), and a half of one that
    does not exist has a split (or splitting) sibling: a split creates each half that
    gets an entry, and a node is never removed, so a half found missing got none of the
    entries, its sibling all of them (more than a leaf holds: it was split in turn)."""
    below: Counter[str] = Counter()
    for node in leaves:
        for depth in range(len(node.prefix)):  # each node above a leaf is split
            below[node.prefix[:depth]] += len(node.entries)
    for prefix in sorted(below, key=len, reverse=True):  # the split nearest the loss
        if below[prefix] < 2:
            lost = [
                trie.url(n.prefix)
                for n in leaves
                if n.kind == EMPTY and n.prefix.startswith(prefix)
            ]
            raise FormatError(
                trie.url(prefix),
                "index shard state",
                SPLIT,
                "a node whose halves hold the entries it split (at least 2)",
                f"they hold {below[prefix]}: a leaf is missing ({', '.join(lost)} not found)",
            )
    kinds = {n.prefix: n.kind for n in leaves}  # a split node is not among them
    for node in leaves:
        if node.kind != EMPTY or not node.prefix:
            continue
        other = sibling(node.prefix)
        if kinds.get(other) in (LEAF, EMPTY):
            raise lost_half(trie, node.prefix, kinds[other])


def check_halves(trie: ModelTrie, leaves: list[Node]) -> None:
    """Every half a split node above ``leaves`` (the walk's, empty ones included) names
    exists (:mod:`.index_place`: created before the split committed, never removed): the
    split nodes above the halves found missing read again, at once (none for a trie
    without one), the first that names one it lacks a :class:`FormatError`."""
    absent = [n.prefix for n in leaves if n.kind == EMPTY and n.prefix]
    got = trie.store.read_many([trie.url(p[:-1]) for p in absent])
    for prefix in absent:
        problem = named_half(trie, prefix, got[trie.url(prefix[:-1])][0])
        if problem is not None:
            raise problem


def named_half(trie: ModelTrie, prefix: str, above: dict[str, Any] | None) -> FormatError | None:
    """The error of the node ``prefix``, not found, when its split node (``above``, as
    read) names it among the halves its split made; None when it does not (or names
    none: a marker an earlier ptestore wrote)."""
    halves = (above or {}).get(HALVES) if (above or {}).get("state") == SPLIT else None
    if not isinstance(halves, list) or prefix[-1] not in halves:
        return None
    return FormatError(
        trie.url(prefix[:-1]),
        f"index shard {HALVES}",
        halves,
        "halves that exist (a split creates the halves it names before it commits, and a "
        "node is never removed)",
        f"{trie.url(prefix)} is not found: a leaf is missing",
    )


def sibling(prefix: str) -> str:
    """The other half of the split node above the node ``prefix``."""
    return prefix[:-1] + "10"[int(prefix[-1])]


def lost_half(trie: ModelTrie, prefix: str, sibling_kind: str) -> FormatError:
    """The error of the node ``prefix``, not found below a split node whose other half
    is of ``sibling_kind`` (a leaf, or not found either): a leaf is missing."""
    state = "not found either" if sibling_kind == EMPTY else "a leaf"
    return FormatError(
        trie.url(prefix[:-1]),
        "index shard state",
        SPLIT,
        "a node whose halves both exist, unless one got none of the entries it "
        "split (the other got them all, and was split in turn)",
        f"{trie.url(prefix)} is not found and {trie.url(sibling(prefix))} is {state}: "
        "a leaf is missing",
    )


def check_listed(
    catalog: dict[str, Any], where: str, held: dict[str, Any], *, strict: bool = False
) -> None:
    """The catalog at ``where`` agrees with the entries ``held`` in its model's leaves
    (read after it): every device it lists has an entry there; with ``strict`` (gc), a
    catalog listing live builds has a live entry there."""
    classes = catalog["classes"]
    if strict and classes and not any(not e.get("retired") for e in held.values()):
        raise FormatError(
            where,
            "index catalog classes (live builds)",
            len(classes),
            "none while the model's leaves hold no live entry",
            f"they hold {len(held)} entries, none live: a leaf is missing, or the catalog "
            "is behind its leaves (a run retired them meanwhile: run gc again). `ptestore "
            "fleet check-index` says which; restore any missing leaf before a --repair, "
            "which rebuilds the catalog from the leaves as they are",
        )
    for i, c in enumerate(classes):
        for j, device in enumerate(c["devices"]):
            if device not in held:
                raise unheld(where, i, j, device, "none holds it")


def lost_top(trie: ModelTrie, where: str) -> FormatError:
    """The error of ``trie``'s top node, not found while its catalog (``where``) is."""
    return FormatError(
        trie.url(""),
        "index shard",
        "not found",
        "there while its model's catalog is",
        f"{where} is there: a leaf is missing (a writer writes the leaves before the "
        "catalog, and never removes one)",
    )


def unheld(
    where: str, i: int, j: int, device: str, found: str, why: str = "a leaf is missing"
) -> FormatError:
    """The error of the catalog at ``where`` listing ``device`` (its class ``i``, place
    ``j``) that no leaf holds (``found``: what was found instead)."""
    return FormatError(
        where,
        f"index catalog classes[{i}].devices[{j}]",
        device,
        "a device whose entry is in one of the model's leaves",
        f"{found}: {why} (a writer updates the leaves before the catalog, and never "
        "removes an entry)",
    )


def device_entry(
    index: ShardDirectory,
    trie: ModelTrie,
    catalog: dict[str, Any] | None,
    device: str,
    depths: tuple[int, int],
) -> tuple[dict[str, Any] | None, str]:
    """The entry of ``device`` in ``trie`` (None: none) and the URL of the leaf that
    holds it (or would), for a reader of one device's entry (``select``, ``find_entry``,
    ``fetch``, ``ensure``): ``depths`` where its model's ``catalog`` (read first, None:
    none) says the leaves are. An entry absent because a part of the index is missing
    is a :class:`FormatError` naming the index, the model, the device and the part,
    never "no entry" (which hands out the portable source): its node not found below a
    split node whose other half is a leaf or not found either (the other half then read
    once more: one read, only where a half is absent), the model's top node not found
    while its catalog is there (a writer writes the leaves first), a device the catalog
    lists that its leaf does not hold, or its node not found below a split node that
    names it among the halves it made (as :meth:`~.index_trie.ModelTrie.locate` read
    it: no read more). A device the catalog does not list whose
    node is a half a split left empty (its other half split in turn) has no entry (as
    below a split node that names no halves, module docstring)."""
    [(node, _)] = trie.locate([device], *depths).values()
    leaf = trie.url(node.prefix)
    entry = node.entries.get(device)
    if entry is not None:
        return entry, leaf
    problem: FormatError | None = None
    if node.kind == EMPTY and node.prefix:  # its split parent seen (ModelTrie.locate)
        other = trie.read(sibling(node.prefix)).kind
        if other in (LEAF, EMPTY):
            problem = lost_half(trie, node.prefix, other)
    where = f"{trie.directory}/catalog.json"
    if problem is None and catalog is not None and node.kind == EMPTY and not node.prefix:
        problem = lost_top(trie, where)
    for i, c in enumerate((catalog or {}).get("classes", []) if problem is None else []):
        if device in c["devices"]:
            j = c["devices"].index(device)
            if node.kind == EMPTY:
                problem = unheld(where, i, j, device, f"its leaf is {leaf}: not found")
            else:
                problem = unheld(
                    where,
                    i,
                    j,
                    device,
                    f"its leaf is {leaf}: it does not hold it",
                    "the catalog disagrees with its leaves, or the leaf lost it",
                )
            break
    if problem is None and node.kind == EMPTY and node.prefix:  # its split node as read
        problem = named_half(trie, node.prefix, node.above)
    if problem is not None:
        raise lost_part(
            index,
            problem,
            f"the entry of model {trie.model!r} for device {device!r} may be lost with it, "
            "so it is not answered as none (the portable source): `ptestore fleet "
            f"check-index {index.store.root}` says what is missing and what --repair can "
            "rebuild",
        )
    return None, leaf
