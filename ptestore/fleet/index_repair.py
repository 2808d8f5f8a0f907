"""A model's catalog rebuilt from its leaves (:meth:`.index_v3.ShardedIndex.repair`):
what a publish does when it finds no catalog after a crash, or a class it emptied while
members remain, and what ``fleet check-index --repair`` does to a catalog that disagrees.

An existing catalog is marked first (unless marked already), then the leaves read, then
the marked version replaced, each by compare-and-swap (:mod:`.index_catalog`: a writer
meanwhile renews the mark, which fails the commit, and the leaves are read again), its
attempts spaced as the conflicts of every index write are (a back-off that doubles,
with jitter, up to half a second: :data:`~ptestore._retry.CONFLICT_RETRY`). While other
runs keep writing the catalog, every attempt can fail so: after its attempts the rebuild
gives up with a :class:`~ptestore.errors.PreconditionFailed` naming the catalog,
the model, the index and the attempts (a publish reports it as its ``index_error``,
``check-index --repair`` as ``not repaired: ...``), never silently: the catalog stays as
it was, behind its leaves, until a rebuild commits.

A rebuild reads the leaves as they are, so a leaf that is lost would drop out of the
catalog with its devices, and with it what tells ``gc`` that entries are missing (it
checks the catalog against the leaves, and removes the files of entries it does not
see). Before it writes, a rebuild therefore checks what its reads show lost
(:func:`~.index_lost.missing_leaf`: the top node while a catalog is there, a split
node's half, or a device the catalog it replaces lists, whose node does not exist) and
refuses with a :class:`FormatError` naming the index, the node and the model, leaving
the catalog as it was (its own mark taken off again).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from ..errors import AlreadyExists, FormatError, PreconditionFailed
from .index_catalog import REBUILDING, marked, needs_rebuild, rebuild
from .index_lost import missing_leaf
from .index_store import ObjectStats
from .index_trie import ModelTrie
from .index_whole import ShardDirectory, lost_part

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
    import logging

    from .._retry import CONFLICT_RETRY

    url = index.catalog_url(model)
    stats = stats or ObjectStats(url, "catalog")
    mine: str | None = None  # the mark this call set

    def attempt() -> None:
        """One attempt; :class:`_Again` when another writer changed the catalog under
        it (the next attempt, after the conflict policy's back-off, reads it again)."""
        nonlocal force, mine
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
                raise _Again("another run wrote the catalog before this one marked it") from None
            force, mine = False, mark[REBUILDING]  # a rebuild committed since is enough
            value, version = index.read_catalog(model)  # the marked version's token
            if value is None or value.get(REBUILDING) != mark[REBUILDING]:  # mark again
                raise _Again("another run wrote the catalog just after this one marked it")
        # Found marked: taken as is (marking again failed the rebuild in flight, and
        # in turn, all). ``force`` stays: that rebuild may have read the leaves before.
        trie = index.trie(model)
        nodes = list(trie.walk(empty=True))
        lost = missing_leaf(trie, nodes, value, url, there=version is not None)
        if lost is not None:
            if value is not None and mine is not None and value.get(REBUILDING) == mine:
                _unmark(index, url, value, version)
            raise _not_rebuilt(index, model, lost)
        leaves = Counter(len(n.prefix) for n in nodes)
        new = rebuild(model, (e for n in nodes for e in n.entries.values()), leaves, index.listed)
        stats.attempts += 1
        try:
            index.store.write(url, new, "create" if version is None else "if-match", version)
        except (PreconditionFailed, AlreadyExists):
            raise _Again(
                "another run wrote the catalog while this one read the leaves, so the "
                "catalog rebuilt from them was not written"
            ) from None
        stats.written = True

    def again(exc: BaseException) -> bool:
        if isinstance(exc, _Again):
            stats.conflicts += 1
            return True
        return False

    try:  # retried as IndexStore.update retries its conflicts: backing off between them
        CONFLICT_RETRY.call(
            attempt,
            what=f"{url}: rebuilding the catalog of model {model!r} from its leaves",
            retry_on=again,
            level=logging.DEBUG,
            reason=lambda exc: f"{exc}: the catalog and the leaves are read again",
        )
    except _Again:
        root = index.store.root
        raise PreconditionFailed(
            f"{url}: the catalog of model {model!r} changed under every one of "
            f"{CONFLICT_RETRY.attempts} attempts to rebuild it from its leaves (other runs "
            "writing it meanwhile): not rebuilt, it stays behind its leaves until `ptestore "
            f"fleet check-index {root} --repair` (or a later run of the model) rebuilds it",
            url=url,
        ) from None


class _Again(Exception):
    """An attempt of a rebuild that another writer of the catalog failed; its message
    says how, in the retry log (never shown as this class)."""


def _unmark(index: CatalogOwner, url: str, value: dict[str, Any], version: str | None) -> None:
    """The catalog at ``url`` as it was before this rebuild marked it (``value`` at
    ``version``), unless a writer has changed it since (then left as that writer made it)."""
    try:
        index.store.write(
            url, {k: v for k, v in value.items() if k != REBUILDING}, "if-match", version
        )
    except PreconditionFailed:
        pass


def _not_rebuilt(index: CatalogOwner, model: str, problem: FormatError) -> FormatError:
    """The error of a rebuild of ``model``'s catalog that found a leaf missing
    (``problem``, naming the node that tells and the one missing)."""
    return lost_part(
        index,
        problem,
        f"the catalog of model {model!r} is not rebuilt: rebuilt from the leaves as they "
        "are, it would leave out the entries the missing leaf held and hide its loss from "
        "gc, which removes the files of entries it does not see. Restore the leaf (`ptestore "
        f"fleet check-index {index.store.root}` says what is missing)",
    )
