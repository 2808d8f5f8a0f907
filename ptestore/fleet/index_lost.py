"""What a writer of a version 3 index checks before it writes what would hide a lost
node (:mod:`.index_whole` tells a lost node from an empty one; a node is never removed).

- A catalog rebuild (:mod:`.index_repair`) reads the leaves as they are: rebuilt without
  a lost leaf's devices, the catalog no longer tells ``gc`` that entries are missing
  (:func:`missing_leaf`).
- A publish creates the node of a pair that has none (``If-None-Match``): created again
  with the run's entries alone, a lost leaf reads as holding only them, its other
  devices as having no entry, and no reader, ``check-index`` or ``gc`` can tell any
  more (:func:`check_creates`, on the publish's look-up and on each look-up again below
  a node another writer split since, :meth:`.index_trie.ModelTrie.update`). A node the
  trie does not say existed is created as before: a model's first leaf, a half its split
  left empty (it names the halves it made), and the halves a split creates itself
  (:mod:`.index_trie`).
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError
from .index_place import HALVES, device_bits
from .index_trie import EMPTY, LEAF, ModelTrie, Node
from .index_whole import (
    ShardDirectory,
    check_halves,
    check_splits,
    lost_half,
    lost_part,
    lost_top,
    named_half,
    sibling,
    unheld,
)

__all__ = ["check_creates", "missing_leaf"]


def missing_leaf(
    trie: ModelTrie,
    leaves: list[Node],
    catalog: dict[str, Any] | None,
    where: str,
    *,
    there: bool,
) -> FormatError | None:
    """What shows a leaf of ``trie`` missing, for a rebuild of its catalog at ``where``
    (``catalog``, None: none or damaged; ``there``: an object at ``where``, damaged or
    not; read before ``leaves``, the walk's, empty ones included), or None: the top node
    not found while a catalog is there (a writer writes the leaves before the catalog), a
    split node's (:func:`check_splits`, :func:`check_halves`), or a device the catalog
    lists whose node does not exist (its entry was in a leaf before the catalog listed
    it, and a leaf is never removed; a listed device its existing leaf lacks is the
    catalog's fault, which a rebuild repairs). Rebuilt without that leaf's entries, the
    catalog would hide its loss (gc checks the catalog against the leaves)."""
    if there and [(n.prefix, n.kind) for n in leaves] == [("", EMPTY)]:
        return lost_top(trie, where)
    try:
        check_splits(trie, leaves)
    except FormatError as exc:
        return exc
    held = {d for n in leaves for d in n.entries}
    absent = [n.prefix for n in leaves if n.kind == EMPTY]
    for i, c in enumerate((catalog or {}).get("classes", [])):
        for j, device in enumerate(c["devices"]):
            bits = device_bits(device)
            lost = next((p for p in absent if bits.startswith(p)), None)
            if device not in held and lost is not None:
                return unheld(where, i, j, device, f"its leaf is {trie.url(lost)}: not found")
    try:
        check_halves(trie, leaves)
    except FormatError as exc:
        return exc
    return None


def check_creates(
    index: ShardDirectory,
    trie: ModelTrie,
    located: dict[str, tuple[Node, list[str]]],
    catalog: dict[str, Any] | None,
) -> None:
    """Refuse a publish into ``trie`` whose devices ``located`` (by
    :meth:`~.index_trie.ModelTrie.locate`, after ``catalog`` was read; None: none) lead
    to a node that does not exist and that its reads show lost, by the rules of
    :func:`~.index_whole.device_entry`: its other half a leaf or not found either below a
    split marker naming no halves (that half read once), the top node while a catalog is
    there, the node of a device the catalog lists, or a half its split node names. A
    :class:`FormatError` naming the index, the node and the model, before any write."""
    where = f"{trie.directory}/catalog.json"
    for node, _ in located.values():
        if node.kind != EMPTY:
            continue
        p, problem = node.prefix, None
        if p and HALVES not in (node.above or {}):  # a marker an earlier ptestore wrote
            other = trie.read(sibling(p)).kind
            problem = lost_half(trie, p, other) if other in (LEAF, EMPTY) else None
        if not p and catalog is not None:
            problem = lost_top(trie, where)
        for i, c in enumerate((catalog or {}).get("classes", [])):
            for j, d in enumerate(c["devices"]):
                if problem is None and device_bits(d).startswith(p):
                    problem = unheld(where, i, j, d, f"its leaf is {trie.url(p)}: not found")
        if problem is None and p:
            problem = named_half(trie, p, node.above)
        if problem is not None:
            raise lost_part(
                index,
                problem,
                f"the entries of model {trie.model!r} are not published: created with them "
                "alone, the missing leaf would hide its loss (read as holding only them, its "
                "other devices as having no entry, by every reader, check-index and gc). "
                f"Restore it (`ptestore fleet check-index {index.store.root}` says what is "
                "missing)",
            )
