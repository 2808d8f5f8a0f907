"""A model's catalog rebuilt from its leaves (:meth:`.index_v3.ShardedIndex.repair`):
what a publish does when it finds no catalog after a crash, or a class it emptied while
members remain, and what ``fleet check-index --repair`` does to a catalog that disagrees.

An existing catalog is marked first (unless marked already), then the leaves read, then
the marked version replaced, each by compare-and-swap (:mod:`.index_catalog`: a writer
meanwhile renews the mark, which fails the commit, and the leaves are read again). While
other runs keep writing the catalog, every attempt can fail so: after its attempts the
rebuild gives up with a :class:`~ptestore.errors.PreconditionFailed` naming the catalog,
the model, the index and the attempts (a publish reports it as its ``index_error``,
``check-index --repair`` as ``not repaired: ...``), never silently: the catalog stays as
it was, behind its leaves, until a rebuild commits.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from ..errors import AlreadyExists, FormatError, PreconditionFailed
from .index_catalog import REBUILDING, marked, needs_rebuild, rebuild
from .index_store import ObjectStats
from .index_trie import ModelTrie
from .index_whole import ShardDirectory

__all__ = ["CatalogOwner", "repair_catalog"]


class CatalogOwner(ShardDirectory, Protocol):
    """What a rebuild uses of a version 3 index (:class:`~.index_v3.ShardedIndex`)."""

    def trie(self, model: str) -> ModelTrie: ...

    def catalog_url(self, model: str) -> str: ...

    def read_catalog(self, model: str) -> tuple[dict[str, Any] | None, str | None]: ...


def repair_catalog(
    index: CatalogOwner, model: str, stats: ObjectStats | None = None, *, force: bool = False
) -> None:
    """Rebuild ``model``'s catalog from its leaves when it is missing or a class lists
    no device although it has members (left alone when another run has rebuilt it
    since this one saw that), or a rebuild left its mark; with ``force``, whatever it
    holds (module docstring). A damaged catalog (not JSON, a malformed field: no writer
    can commit over it) is replaced by compare-and-swap on the version read. Other runs
    changing the catalog under every attempt: :class:`PreconditionFailed`."""
    from .._retry import CONFLICT_RETRY

    url = index.catalog_url(model)
    stats = stats or ObjectStats(url, "catalog")
    tries = CONFLICT_RETRY.attempts
    for _ in range(tries):
        try:
            value, version = index.read_catalog(model)
        except FormatError:  # damaged (not JSON, a malformed field): rebuilt over it
            value, version = None, index.store.read(url, oversize_ok=True)[1]
        if value is not None and not (force or needs_rebuild(value) or REBUILDING in value):
            return
        if value is not None and REBUILDING not in value:
            stats.attempts += 1
            mark = marked(value)
            try:
                index.store.write(url, mark, "if-match", version)
            except PreconditionFailed:
                stats.conflicts += 1
                continue
            force = False  # marked by this call: a rebuild committed since is enough
            value, version = index.read_catalog(model)  # the marked version's token
            if value is None or value.get(REBUILDING) != mark[REBUILDING]:
                stats.conflicts += 1  # a writer meanwhile: mark again
                continue
        # Found marked: taken as is (marking again failed the rebuild in flight, and
        # in turn, all). ``force`` stays: that rebuild may have read the leaves before.
        nodes = list(index.trie(model).walk(empty=True))
        leaves = Counter(len(n.prefix) for n in nodes)
        new = rebuild(model, (e for n in nodes for e in n.entries.values()), leaves, index.listed)
        stats.attempts += 1
        try:
            index.store.write(url, new, "create" if version is None else "if-match", version)
            stats.written = True
            return
        except (PreconditionFailed, AlreadyExists):
            stats.conflicts += 1
    root = index.store.root
    raise PreconditionFailed(
        f"{url}: the catalog of model {model!r} changed under every one of {tries} attempts "
        "to rebuild it from its leaves (other runs writing it meanwhile): not rebuilt, it "
        f"stays behind its leaves until `ptestore fleet check-index {root} --repair` (or a "
        "later run of the model) rebuilds it",
        url=url,
    )
