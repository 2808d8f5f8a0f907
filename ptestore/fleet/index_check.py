"""``ptestore fleet check-index``: does every model's catalog of a sharded (version 3)
index agree with its leaves, and repair the ones that do not.

A catalog (:mod:`.index_catalog`) is what ``select`` rates instead of every entry: per
distinct compatibility stamps, the first device names (sorted) of the live entries the
model's leaves hold, and ``more`` when there are others. The runs that publish keep it
so by compare-and-swap; what can still leave one behind its leaves is outside their
reach: a run killed between its leaf writes and its catalog placement (or a retire
between taking its entries out of the catalog and its leaf writes), a catalog object
removed by hand or a lifecycle rule, a rebuild interrupted (or starved by writers)
after it marked the catalog. The next run that touches the model repairs it; this
check finds them without one, and ``repair`` rebuilds each from its leaves
(:meth:`.index_v3.ShardedIndex.repair`, safe beside running writers; one that other runs
keep writing under every attempt is ``not repaired: ...``). A damaged catalog
(not JSON, a field of the wrong type: every publish of its model fails on it) is one
problem, ``damaged catalog: ...``, and ``repair`` replaces it by compare-and-swap on
the version read. A leaf no reader reads (not JSON, past its bound, or read from another
place than it says it belongs: :mod:`.index_place`) is ``damaged leaf: ...``, left by
``repair`` (a catalog is rebuilt from the leaves): restore or remove it by hand. So is a
leaf missing (:func:`~.index_lost.missing_leaf`: below a split node, or the leaf of a
device the catalog lists, read as an empty one: ``missing leaf: ...``): a catalog rebuilt
without its entries would hide the loss from ``gc``, which removes the files of entries
it does not see; restore it (the rebuild itself refuses too, should a leaf go missing
between this check and the rebuild).

Read while runs publish, a catalog can be behind its leaves for the moment between a
run's leaf writes and its placement: check again before repairing a fleet that is busy.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..errors import FormatError, PreconditionFailed

if TYPE_CHECKING:
    from .index_v3 import ShardedIndex

__all__ = [
    "ABSENT",
    "DAMAGED_ENTRY",
    "DAMAGED_LEAF",
    "MISSING_LEAF",
    "V2_ENTRIES",
    "IndexCheck",
    "catalog_problems",
    "check_index",
]

#: The problem of a model named to :func:`check_index` that has neither a catalog nor a
#: live entry in the index (nothing to repair).
ABSENT = "not in this index (no catalog, no live entry)"
#: The problem of a model with a leaf no reader reads (not JSON, past its bound, read
#: from another place than it says it belongs: :mod:`.index_place`): its catalog cannot
#: be checked or rebuilt until the leaf is restored or removed.
DAMAGED_LEAF = "damaged leaf"
UNREPAIRED_LEAF = "a catalog is rebuilt from its leaves: restore or remove the damaged one"
#: The problems of a version 1/2 index: an entry no reader takes as one (not an object,
#: its model or device not a string), under :data:`V2_ENTRIES`; restored or removed by
#: hand (nothing to rebuild it from).
DAMAGED_ENTRY = "damaged entry"
V2_ENTRIES = "entries"
#: The problem of a model with a leaf missing below a split node: restored, not repaired.
MISSING_LEAF = "missing leaf"
UNREPAIRED_MISSING = "a catalog is rebuilt from its leaves: restore the missing one"


@dataclass
class IndexCheck:
    """What :func:`check_index` found (and repaired)."""

    index: str
    #: The index's version (1 and 2 hold their entries in one object: nothing to check).
    version: int
    #: Models checked.
    models: int = 0
    #: ``{model: [problem]}`` of the catalogs that disagree with their leaves, as found.
    problems: dict[str, list[str]] = field(default_factory=dict)
    #: Models whose catalog carries a rebuild's mark (an interrupted or starved rebuild).
    marked: list[str] = field(default_factory=list)
    #: Models whose catalog was rebuilt (with ``repair``).
    repaired: list[str] = field(default_factory=list)
    #: ``{model: [problem]}`` left after the repair (a writer changed the model since).
    left: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Nothing to repair, or all of it repaired."""
        wrong = set(self.problems) | set(self.marked)
        return wrong <= set(self.repaired) and not self.left

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "version": self.version,
            "models": self.models,
            "problems": self.problems,
            "marked": self.marked,
            "repaired": self.repaired,
            "left": self.left,
            "ok": self.ok,
        }


def catalog_problems(sharded: ShardedIndex, model: str) -> tuple[list[str], bool]:
    """What ``model``'s catalog says that its leaves do not (empty when it agrees): per
    distinct stamps, the listed devices must be a non-empty prefix of the sorted live
    members the leaves hold (all of them unless ``more``), and no class without
    members; and whether it carries a rebuild's mark. The catalog is read before the
    leaves: a device it lists has an entry in them then, unless a leaf is missing."""
    from .index_catalog import REBUILDING, class_key, live_stamps
    from .index_lost import missing_leaf

    members: dict[str, list[str]] = {}
    trie = sharded.trie(model)
    damaged: FormatError | None = None
    try:
        catalog, _ = sharded.read_catalog(model)
    except FormatError as exc:
        catalog, damaged = None, exc
    try:
        nodes = list(trie.walk(empty=True))
    except FormatError as exc:  # the leaves are what a catalog is checked against
        return [f"{DAMAGED_LEAF}: {exc}"], False
    there = catalog is not None or damaged is not None
    lost = missing_leaf(trie, nodes, catalog, sharded.catalog_url(model), there=there)
    if lost is not None:  # the top node, a split node's half, or a listed device's leaf
        return [f"{MISSING_LEAF}: {lost}"], False
    for node in nodes:
        for device, entry in node.entries.items():
            stamps = live_stamps(entry)
            if stamps is not None:
                members.setdefault(class_key(stamps), []).append(device)
    if damaged is not None:
        return [f"damaged catalog: {damaged}"], False
    if catalog is None:
        return (["no catalog"] if members else [ABSENT]), False
    problems = []
    listed = {class_key(c["compatibility"]): c for c in catalog["classes"]}
    for key in sorted(set(listed) ^ set(members)):
        where = "listed without a live entry" if key in listed else "not listed"
        problems.append(f"class {key}: {where}")
    for key in sorted(set(listed) & set(members)):
        cls, devices = listed[key], sorted(members[key])
        shown = cls["devices"]
        if not shown or shown != devices[: len(shown)]:
            problems.append(f"class {key}: lists {shown}, its entries are {devices}")
        elif not cls["more"] and len(shown) != len(devices):
            problems.append(f"class {key}: lists {shown} and no more, its entries are {devices}")
    return problems, REBUILDING in catalog


def check_index(
    url: str | os.PathLike[str],
    options: dict[str, Any] | None = None,
    *,
    repair: bool = False,
    models: Collection[str] | None = None,
    workers: int = 8,
) -> IndexCheck:
    """Check every model's catalog of the index at ``url`` against its leaves (``models``:
    only those, without listing the index), ``workers`` models at a time; with
    ``repair``, rebuild each that disagrees or carries a mark, then check it again.
    :class:`~ptestore.errors.ObjectNotFound` when there is no index; a storage option
    that applies to none of it (as read, and written with ``repair``; any, for a local
    index) a :class:`~ptestore.errors.ConfigurationError` before it is read."""
    from concurrent.futures import ThreadPoolExecutor

    from .index import open_index
    from .index_store import check_index_options

    target = os.fspath(url)
    check_index_options(options, target, write=repair)
    root, sharded, _ = open_index(target, options, whole=True)
    out = IndexCheck(target, int(root["version"]))
    if sharded is None:  # no catalogs: its entries that no reader takes as entries
        from .index_bounds import v2_entry_problems

        damaged = v2_entry_problems(root["entries"], target)
        if damaged:
            out.problems[V2_ENTRIES] = [f"{DAMAGED_ENTRY}: {exc}" for exc in damaged]
        return out
    index = sharded

    def one(job: tuple[str, bool]) -> tuple[str, list[str], bool, list[str] | None, bool]:
        """A model's problems, its mark, what is left after a repair (None: none tried)
        and whether its catalog was rebuilt."""
        name, listed = job
        try:
            model = (index.model_of(name) or name) if listed else name
        except FormatError as exc:  # a hashed name's catalog unreadable: not repairable
            return name, [f"damaged catalog (its model name unreadable): {exc}"], False, None, False
        problems, mark = catalog_problems(index, model)
        if not (repair and (problems or mark)) or problems == [ABSENT]:
            return model, problems, mark, None, False
        if problems and problems[0].startswith(DAMAGED_LEAF):  # nothing to rebuild from
            return model, problems, mark, [f"not repaired: {UNREPAIRED_LEAF}"], False
        if problems and problems[0].startswith(MISSING_LEAF):  # its entries unknown
            return model, problems, mark, [f"not repaired: {UNREPAIRED_MISSING}"], False
        try:
            index.repair(model, force=True)
        except (FormatError, PreconditionFailed) as exc:  # a rebuilt catalog too large to
            # read, or other runs writing the catalog under every attempt: not written
            return model, problems, mark, [f"not repaired: {exc}"], False
        return model, problems, mark, catalog_problems(index, model)[0], True

    if models is None:
        jobs = [(segment, True) for segment in index.segments()]
    else:
        jobs = [(model, False) for model in dict.fromkeys(models)]
    with ThreadPoolExecutor(max(1, min(workers, len(jobs))), "ptestore-check") as pool:
        for model, problems, mark, again, rebuilt in pool.map(one, jobs):
            out.models += 1
            if problems:
                out.problems[model] = problems
            if mark:
                out.marked.append(model)
            if rebuilt:
                out.repaired.append(model)
            if again:
                out.left[model] = again
    return out
