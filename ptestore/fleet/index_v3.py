"""Index version 3: a small root object naming a directory of per-model shards.

``<prefix>/ptestore-index.json`` (the URL devices already use) holds only::

    {"format": "ptestore.index", "version": 3, "created": "...",
     "layout": {"shards": "ptestore-index.v3-1a2b3c4d", "leaf_bytes": 16384, "listed": 8},
     "migrated": {"from_version": 2, "entries": 1234, "at": "..."}}   # after a migration

and never changes after it is created. Under ``<prefix>/<shards>/m/<model>~<hash8>/``
(``~<hash16>`` for a name that is not a plain path segment) each model has:

- ``t<bits>.json``: the nodes of a binary trie over the SHA-256 of the device name
  (:mod:`.index_trie`); a leaf holds entries (the same entries as version 2) and splits
  when it would grow past ``leaf_bytes``;
- ``catalog.json``: the distinct compatibility stamps of the model's live entries with
  the first ``listed`` device names of each, and the trie's leaves per depth
  (:mod:`.index_catalog`).

A run reads the root once, then touches only the catalogs of its models and the leaves
of its pairs, each by compare-and-swap, and reports every one (:class:`ObjectStats`).
A device reads the root, its model's catalog, its own leaf and, when another device's
build wins, that build's leaf (:mod:`.index_view`).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .._dataclass import dataclass, field
from ..errors import PreconditionFailed, PteStoreError
from .index_bounds import ENTRY_ROOM
from .index_catalog import (
    apply_placements,
    check_catalog,
    depth_range,
    live_stamps,
    needs_rebuild,
    rebuild,
)
from .index_lost import check_creates
from .index_pins import EntryGuard, replacing
from .index_place import model_segment
from .index_repair import repair_catalog
from .index_root import DEFAULT_LEAF_BYTES, DEFAULT_LISTED, check_layout, new_layout
from .index_store import IndexStore, ObjectStats, dumps
from .index_trie import EMPTY, Change, Check, ModelTrie, Node
from .index_v2 import INDEX_FORMAT, now
from .index_whole import device_entry, model_nodes, model_segments

__all__ = [
    "DEFAULT_LEAF_BYTES",
    "DEFAULT_LISTED",
    "ShardedIndex",
    "UpdateReport",
    "check_layout",
    "model_segment",
    "new_layout",
    "root_value",
]

#: Guards the reports the threads of an update fill.
_LOCK = threading.Lock()

#: ``change(entry) -> new entry`` (None: keep it).
EntryChange = Callable[[dict[str, Any]], dict[str, Any] | None]


def root_value(layout: dict[str, Any], migrated: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "version": 3,
        "created": now(),
        "layout": layout,
    }
    if migrated is not None:
        out["migrated"] = migrated
    return out


@dataclass
class UpdateReport:
    """What :meth:`ShardedIndex.update` (and ``update_index``) did."""

    #: The entries as this update published them.
    changed: list[dict[str, Any]] = field(default_factory=list)
    #: Entries examined, and of them already retired (left as they were).
    examined: int = 0
    retired: int = 0
    stats: list[ObjectStats] = field(default_factory=list)


class ShardedIndex:
    """The shards of the version 3 index at ``store.root``, with ``layout``."""

    def __init__(self, store: IndexStore, layout: dict[str, Any]) -> None:
        self.store = store
        self.layout = layout
        self.directory = store.url(layout["shards"])
        self.leaf_bytes = int(layout["leaf_bytes"])
        self.listed = int(layout["listed"])
        store.leaf_limit = self.leaf_bytes + ENTRY_ROOM

    # -- where ------------------------------------------------------------------------
    def model_dir(self, model: str) -> str:
        return f"{self.directory}/m/{model_segment(model)}"

    def trie(self, model: str) -> ModelTrie:
        return ModelTrie(self.store, self.model_dir(model), model, self.leaf_bytes)

    def catalog_url(self, model: str) -> str:
        return f"{self.model_dir(model)}/catalog.json"

    def read_catalog(self, model: str) -> tuple[dict[str, Any] | None, str | None]:
        url = self.catalog_url(model)
        value, version = self.store.read_json(url)
        return (None if value is None else check_catalog(value, url, self.listed)), version

    def segments(self) -> list[str]:
        """The model directories (one listing)."""
        return [s for s in self.store.list_names(f"{self.directory}/m") if "~" in s]

    def model_of(self, segment: str) -> str | None:
        """The model name of a directory (from its catalog when the name is hashed)."""
        name = segment.rsplit("~", 1)[0]
        if name:
            return name
        value, _ = self.store.read_json(f"{self.directory}/m/{segment}/catalog.json")
        model = None if value is None else value.get("model")
        return model if isinstance(model, str) else None

    # -- reading ----------------------------------------------------------------------
    def find(self, model: str, device: str) -> dict[str, Any] | None:
        """The entry of ``(model, device)`` (None: none), from its leaf; a lost part of
        the index where it would be is a :class:`FormatError` (:func:`device_entry`)."""
        catalog, _ = self.read_catalog(model)
        return device_entry(self, self.trie(model), catalog, device, depth_range(catalog))[0]

    def iter_entries(self) -> Iterator[dict[str, Any]]:
        """Every entry, model by model (each model's in device order); a missing part of
        the index is a :class:`FormatError`, never "no entries" (:mod:`.index_whole`)."""
        segments = model_segments(self)

        def one(segment: str) -> list[dict[str, Any]]:
            trie = ModelTrie(self.store, f"{self.directory}/m/{segment}", "", self.leaf_bytes)
            found = [e for node in model_nodes(self, trie) for e in node.entries.values()]
            return sorted(found, key=lambda e: str(e.get("device")))

        with cf.ThreadPoolExecutor(max_workers=4) as pool:
            for start in range(0, len(segments), 16):
                for entries in pool.map(one, segments[start : start + 16]):
                    yield from entries

    # -- writing ----------------------------------------------------------------------
    def publish(
        self,
        entries: list[dict[str, Any]],
        *,
        workers: int = 8,
        guard: EntryGuard | None = None,
        errors: dict[str, PteStoreError] | None = None,
    ) -> list[ObjectStats]:
        """Merge ``entries`` (keyed by model and device; each replaces the entry of its
        pair) into their leaves, then their models' catalogs; with ``guard``, not one
        whose artifact another run replaced since (:mod:`.index_pins`). A model whose
        entries cannot be published does not stop the others: its error is put in
        ``errors`` (model -> error), or without it the first (by model) is raised once
        every model is done."""
        by_model: dict[str, dict[str, dict[str, Any]]] = {}
        for e in entries:
            by_model.setdefault(str(e["model"]), {})[str(e["device"])] = e

        def one(model: str) -> list[ObjectStats]:
            wanted = by_model[model]
            changes: dict[str, Change] = {d: replacing(e, guard) for d, e in wanted.items()}
            left = set() if guard is None else guard.left_out(model)
            try:
                return self._update_model(model, changes, placements=wanted, left=left)
            except PteStoreError as exc:
                if errors is None:
                    raise
                with _LOCK:
                    errors[model] = exc
                return []

        return self._each(list(by_model), one, workers)

    def update(
        self, change: EntryChange, *, models: list[str] | None = None, workers: int = 8
    ) -> UpdateReport:
        """Apply ``change`` to every entry (of ``models``), each inside the
        compare-and-swap of its leaf (so it sees the entry as it is then), once the
        model's leaves are read whole (a missing part: :mod:`.index_whole`)."""
        report = UpdateReport()
        names = (
            models
            if models is not None
            else [m for m in map(self.model_of, model_segments(self)) if m]
        )

        def one(model: str) -> list[ObjectStats]:
            trie = self.trie(model)
            located: dict[str, tuple[Node, list[str]]] = {}
            leaving: set[str] = set()  # live entries the change, as they are, retires
            for node in model_nodes(self, trie):
                if node.kind == EMPTY:
                    continue
                located[node.prefix] = (node, list(node.entries))
                seen = list(node.entries.values())
                with _LOCK:
                    report.examined += len(seen)
                    report.retired += sum(1 for e in seen if e.get("retired"))
                for device, entry in node.entries.items():
                    if live_stamps(entry) is not None:
                        new = change(entry)
                        if new is not None and live_stamps(new) is None:
                            leaving.add(device)
            changes = {
                d: (lambda old: None if old is None else change(old))
                for _, ds in located.values()
                for d in ds
            }
            made: list[dict[str, Any]] = []
            stats = self._update_model(model, changes, located=located, made=made, leaving=leaving)
            with _LOCK:
                report.changed.extend(made)
            return stats

        report.stats = self._each(names, one, workers)
        return report

    def _each(
        self, models: list[str], one: Callable[[str], list[ObjectStats]], workers: int
    ) -> list[ObjectStats]:
        out: list[ObjectStats] = []
        if len(models) <= 1:
            for m in models:
                out += one(m)
            return out
        with cf.ThreadPoolExecutor(max_workers=min(workers, len(models))) as pool:
            for stats in pool.map(one, sorted(models)):
                out += stats
        return out

    def _update_model(
        self,
        model: str,
        changes: dict[str, Change],
        *,
        placements: dict[str, dict[str, Any]] | None = None,
        located: dict[str, tuple[Node, list[str]]] | None = None,
        made: list[dict[str, Any]] | None = None,
        leaving: set[str] | None = None,
        left: set[str] | frozenset[str] = frozenset(),
    ) -> list[ObjectStats]:
        """Leaves first, then the catalog; ``placements`` are entries known to be the
        pairs' own (a publish: placed in the catalog even when unchanged, which repairs a
        catalog a crashed run left behind), but those ``left`` out of their leaves (filled
        as they are written: another run's entry is there). ``leaving``: devices whose
        live entry the change is expected to retire (an update's walk), taken out of the
        catalog before any leaf is written, with those ``placements`` retire (see below)."""
        trie = self.trie(model)
        catalog, version = self.read_catalog(model)
        if placements:  # a catalog it would make too large to read: before any leaf
            grown, _ = apply_placements(
                catalog, model, {d: live_stamps(e) for d, e in placements.items()}, [], self.listed
            )
            if grown is not None:
                self.store.check_size(self.catalog_url(model), dumps(grown))
        lo, hi = depth_range(catalog)
        check: Check | None = None
        if located is None:  # a publish: it creates no node its reads show lost, found
            located = trie.locate(list(changes), lo, hi)  # now or below a node split since

            def check(found: dict[str, tuple[Node, list[str]]]) -> None:
                check_creates(self, trie, found, catalog)

            check(located)
        cat_stats = ObjectStats(self.catalog_url(model), "catalog")
        first: tuple[dict[str, Any] | None, str | None] | None = (catalog, version)
        leaving = set(leaving or ()) | {
            d for d, e in (placements or {}).items() if live_stamps(e) is None
        }
        if leaving and catalog is not None:
            # An entry about to be retired leaves the catalog before its leaf says so:
            # the catalog is what select lists as candidates (it reads the leaf of the
            # one it picks only), and a run killed between its leaf writes and its
            # placement would leave it listing a retired entry. Killed between this
            # and the leaf, it leaves a live entry unlisted (as the retire wanted; the
            # device's own select reads its leaf), and the retire run again ends it.
            # Not re-checked: the leaves still hold these entries live.
            self._place(model, dict.fromkeys(leaving), [], cat_stats, first, False)
            if cat_stats.written:
                first = None  # the placement below reads the version this wrote
        outcome = trie.update(changes, lo, hi, located=located, check=check)
        if made is not None:
            made.extend(new for _, new in outcome.changes.values())
        placed = {d: live_stamps(e) for d, e in (placements or {}).items() if d not in left}
        placed.update({d: live_stamps(new) for d, (_, new) in outcome.changes.items()})
        unsettled = leaving - set(placed)  # expected to retire, left as they were
        if unsettled and catalog is not None:
            for node, devs in trie.locate(sorted(unsettled), lo, hi).values():
                placed.update({d: live_stamps(node.entries.get(d)) for d in devs})
        stats, value = [*outcome.stats, cat_stats], catalog
        splits = list(outcome.splits)
        if catalog is None and not outcome.fresh:  # the trie's maker makes it (raced)
            first = self.read_catalog(model)  # or crashed: rebuilt then (forced: another
            if first[0] is None:  # run may make it from leaves read before this one's)
                self.repair(model, cat_stats, force=True)
                return stats
        confirm = bool(outcome.changes or splits)
        value = self._place_settled(trie, placed, splits, cat_stats, first, confirm)
        if needs_rebuild(value):
            # Not forced: this run's placements are in the catalog, and a rebuild
            # committed since read the leaves after they were.
            self.repair(model, cat_stats)
        return stats

    def _place_settled(
        self,
        trie: ModelTrie,
        placed: dict[str, list[Any] | None],
        splits: list[int],
        stats: ObjectStats,
        first: tuple[dict[str, Any] | None, str | None] | None,
        confirm: bool,
    ) -> dict[str, Any] | None:
        """Place ``placed`` in the catalog of ``trie``'s model, then read again the
        leaves of those the placement changed and place again those another run wrote
        since (as they are now): a round at a time, spaced and bounded as the conflicts
        of every index write are (:data:`~ptestore._retry.CONFLICT_RETRY`; each round,
        someone else made progress; past its attempts, left to those runs' own
        placements and said: :class:`~ptestore.errors.PreconditionFailed`, the model's
        index error). Returns the catalog as the last round left it."""
        import logging

        from .._retry import CONFLICT_RETRY

        model, value, url, names = trie.model, None, self.catalog_url(trie.model), ""

        def round_() -> None:
            nonlocal placed, splits, first, value, names
            value, changed = self._place(model, placed, splits, stats, first, confirm)
            splits, first = [], None
            if not changed:
                return
            lo, hi = depth_range(value)
            found: dict[str, dict[str, Any] | None] = dict.fromkeys(changed)
            for node, devs in trie.locate(sorted(changed), lo, hi).values():
                found.update({d: node.entries.get(d) for d in devs})
            placed = {d: live_stamps(e) for d, e in found.items() if live_stamps(e) != placed[d]}
            if placed:
                names = ", ".join(map(repr, sorted(placed)[:3])) + (", ..." * (len(placed) > 3))
                raise _Again(
                    f"another run wrote the leaves of {len(placed)} of them after they were "
                    f"placed ({names}): placed again as the leaves are now"
                )

        try:
            CONFLICT_RETRY.call(
                round_,
                what=f"{url}: placing the pairs of model {model!r} in its catalog",
                retry_on=lambda exc: isinstance(exc, _Again),
                level=logging.DEBUG,
                reason=str,
            )
        except _Again:  # never silent: the model's index error (a run's index_errors)
            raise PreconditionFailed(
                f"{url}: the pairs of model {model!r} were placed in its catalog in every one "
                f"of {CONFLICT_RETRY.attempts} rounds, and other runs wrote the leaves of "
                f"{len(placed)} of them after each ({names}): not placed as their leaves are "
                "now (left to those runs' own placements), the catalog may stay behind its "
                f"leaves until `ptestore fleet check-index {self.store.root} --repair` (or a "
                "later run of the model) rebuilds it",
                url=url,
            ) from None
        return value

    def _place(
        self,
        model: str,
        placed: dict[str, list[Any] | None],
        splits: list[int],
        stats: ObjectStats,
        first: tuple[dict[str, Any] | None, str | None] | None,
        confirm: bool,
    ) -> tuple[dict[str, Any] | None, set[str]]:
        url = self.catalog_url(model)
        changed: set[str] = set()
        # Changed by a write that may have landed (PublishUncertain): checked as changed.
        maybe: set[str] = set()
        uncertain = [stats.uncertain]

        def transform(value: dict[str, Any] | None, _v: str | None) -> dict[str, Any] | None:
            if stats.uncertain > uncertain[0]:  # the last attempt's write may have landed
                uncertain[0] = stats.uncertain
                maybe.update(changed)
            current = None if value is None else check_catalog(value, url, self.listed)
            new, ch = apply_placements(current, model, placed, splits, self.listed)
            changed.clear()
            changed.update(ch)
            return new

        # ``first`` was read before this run wrote its leaves: when it wrote any, "the
        # catalog already says so" must hold for the catalog of after them (a run that
        # changed no leaf places entries whose writers placed them themselves).
        value, _, _ = self.store.update(
            url, transform, stats, first=first, confirm_unchanged=confirm
        )
        return value, changed | maybe

    def repair(self, model: str, stats: ObjectStats | None = None, *, force: bool = False) -> None:
        """Rebuild ``model``'s catalog from its leaves when it is missing or a class lists
        no device although it has members, or a rebuild left its mark; with ``force``,
        whatever it holds (:func:`~.index_repair.repair_catalog`: marked, the leaves
        read, the marked version replaced, each by compare-and-swap). Other runs changing
        the catalog under every attempt: :class:`~ptestore.errors.PreconditionFailed`."""
        repair_catalog(self, model, stats, force=force)

    def write_static(self, entries: list[dict[str, Any]], models: set[str] | None = None) -> int:
        """Write the tries and catalogs of ``entries`` (of ``models`` only, when given)
        into this index's directory, unconditionally: for a directory no root names yet
        (a migration). Returns the number of objects written. An object larger than a
        reader reads (a catalog past 16 MiB) is a :class:`FormatError` before any is
        written."""
        by_model: dict[str, dict[str, dict[str, Any]]] = {}
        for e in entries:
            if models is None or e["model"] in models:
                by_model.setdefault(str(e["model"]), {})[str(e["device"])] = e
        objects: list[tuple[str, dict[str, Any]]] = []
        for model, group in by_model.items():
            trie = self.trie(model)
            nodes, leaves = trie.build(group)
            objects += [(trie.url(p), v) for p, v in nodes]
            catalog = rebuild(model, group.values(), leaves, self.listed)
            objects.append((self.catalog_url(model), catalog))
        for url, value in objects:  # every one readable, before any is written
            self.store.check_size(url, dumps(value))
        with cf.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda o: self.store.write(o[0], o[1], "overwrite"), objects))
        return len(objects)


class _Again(Exception):
    """A round of placements to make again (another run wrote their leaves since); its
    message says so in the retry log."""
