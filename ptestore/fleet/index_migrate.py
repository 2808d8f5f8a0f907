"""Opening an index to write it: a new version 3 root, or a version 1/2 index migrated.

**When**: the first publish (a ``fleet run``, ``fleet retire``, ``update_index``) by a
ptestore that writes version 3, onto a store with compare-and-swap (local files,
``memory://``, S3), that finds a version 1 or 2 index. Reading never migrates; a store
without compare-and-swap keeps version 2.

**How, atomically**: the entries of the old index (read with its version token) are
written as the tries and catalogs of a new directory whose name no one else uses
(``ptestore-index.v3-<random>``), invisible until the root names it. Then the root
object is replaced by the version 3 root **conditionally on the version read**. Until
that compare-and-swap succeeds, devices and older writers see the old index, whole. If
it fails, someone published in between:

- an older ptestore merged entries into the version 2 index: the index is read again,
  the models whose entries changed are written again into the new directory, and the
  swap is retried. No entry such a writer published
  before the swap is lost; one that publishes after it finds a version 3 root, which it
  cannot read, and its run reports the index as not published (``index_error``: "index
  version = 3: must be 1 or 2") instead of overwriting it;
- another migration won: its root is used and this directory is removed.

How an older ptestore publishes: on S3 with ``If-Match``; on a local disk, one from
before version tokens under an exclusive ``flock`` on ``<index>.lock``: it reads the
index, merges and renames its copy over it, with no check at the rename. A local
migration therefore holds that lock too around its compare-and-swap of the root
(:func:`legacy_lock`): such a writer's read and rename never straddle the swap (its
rename would replace the version 3 root with its version 2 copy, and the entries
published into version 3 meanwhile would be lost).

A local writer on another machine, whose ``flock`` does not reach over NFS, can still
rename its version 2 copy over the migrated root. Every root that names a directory
leaves a copy of itself there (:func:`mark_named`, before anything is published into
it), so a version 1/2 root beside a directory that holds one is found where the index
is opened (:func:`named_beside`): a writer refuses to migrate it (the entries published
into that directory would be left out for good), as do the readers of every entry; a
device's look-up warns (:func:`~.index.open_index`), having read the copies of at most
:data:`NAMED_CHECKED` directories (an index it does not control may list thousands).

A writer of an older ptestore that writes unconditionally (a store without
compare-and-swap) cannot be detected; such stores are never migrated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import AlreadyExists, ConfigurationError, FormatError, PreconditionFailed
from .index_bounds import check_entry_size, check_v2_entries
from .index_root import (
    DEFAULT_LEAF_BYTES,
    DEFAULT_LISTED,
    NAMED,
    SHARDS,
    SHARDS_PREFIX,
    check_layout,
    new_layout,
    overwritten,
)
from .index_store import IndexStore, ObjectStats
from .index_v2 import check_index, now
from .index_v3 import ShardedIndex, root_value

__all__ = [
    "LEGACY_LOCK_WAITS",
    "NAMED_CHECKED",
    "check_entries",
    "create_index",
    "legacy_lock",
    "mark_named",
    "migrate_index",
    "named_beside",
    "open_for_writing",
]

#: Called (no arguments) when a migration finds the legacy lock held and waits for it:
#: a test's deterministic hook.
LEGACY_LOCK_WAITS: list[Callable[[], None]] = []


@contextlib.contextmanager
def legacy_lock(store: IndexStore) -> Iterator[None]:
    """Hold the ``flock`` a ptestore from before version tokens took on ``<index>.lock``
    to publish a local index (nothing for other stores)."""
    from ..storage.types import StorageURL

    u = StorageURL.of(store.root)
    if not u.local:
        yield
        return
    import fcntl

    from .._oserror import local_error
    from ..storage.types import strerror

    where = u.path + ".lock"
    try:  # the file those writers open: made when missing, never through a link
        fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise local_error(exc, f"{store.root}: cannot lock {where}: {strerror(exc)}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for hook in LEGACY_LOCK_WAITS:
                hook()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def mark_named(store: IndexStore, root: dict[str, Any]) -> None:
    """Leave a copy of the version 3 root ``root`` in the directory it names, what tells
    a directory a root named from a migration's private copy (:mod:`.index_root`): read,
    and created when missing (every writer that opens the index marks one an earlier
    ptestore made, before it publishes into it). Best effort: a failure is logged, and
    the next writer marks it."""
    from .._log import get_logger
    from ..errors import PteStoreError

    url = f"{store.url(root['layout']['shards'])}/{NAMED}"
    try:
        if store.read(url)[1] is None:
            store.create(url, root)
    except PteStoreError as exc:
        get_logger(__name__).debug("%s: not written: %s", url, exc)


#: The shard directories beside a version 1/2 root whose copy of the root one device's
#: look-up reads at most (:func:`named_beside`): an honest store has none, or the few a
#: migration left; 2,000 empty ones cost a select 2,003 requests on S3, one at a time.
NAMED_CHECKED = 4


def named_beside(store: IndexStore, limit: int | None = None) -> list[str]:
    """The shard directories beside the root URL (a version 1/2 index) that a version 3
    root named: one listing, and a read of each directory's copy of its root, at once.
    None where the store does not let them be listed or read (a device's credentials may
    allow reads only): it is a check, not a read of the index. With ``limit`` (one
    device's look-up), more directories than that are not read: a warning names them,
    and what reads every one (a writer, ``fleet check-index``, gc)."""
    from .._log import get_logger
    from ..errors import PteStoreError

    log = get_logger(__name__)
    try:
        found = store.list_names(store.base() or ".", SHARDS_PREFIX)
        dirs = [n for n in found if SHARDS.fullmatch(n)]
        if limit is not None and len(dirs) > limit:
            log.warning(
                "%s: %d directories named %s* beside it, more than a device's look-up "
                "checks (%d): not read; `ptestore fleet check-index %s` says whether a "
                "version 3 root named one",
                store.root,
                len(dirs),
                SHARDS_PREFIX,
                limit,
                store.root,
            )
            return []

        def named(name: str) -> bool:
            return store.read(f"{store.url(name)}/{NAMED}")[1] is not None

        if len(dirs) <= 1:  # (the common case: none)
            return [n for n in dirs if named(n)]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(max_workers=min(16, len(dirs))) as pool:
            return [n for n, held in zip(dirs, pool.map(named, dirs), strict=True) if held]
    except (PteStoreError, OSError) as exc:
        log.debug("%s: the directories beside it not checked: %s", store.root, exc)
        return []


def _entries_by_model(index: dict[str, Any]) -> dict[str, dict[tuple[str, str], Any]]:
    out: dict[str, dict[tuple[str, str], Any]] = {}
    for e in index["entries"]:
        if isinstance(e, dict):
            out.setdefault(str(e.get("model")), {})[(str(e.get("model")), str(e.get("device")))] = e
    return out


def check_entries(index: dict[str, Any], url: str) -> None:
    """Every entry of the version 1/2 ``index`` (read from ``url``) is one a version 3
    leaf can hold (an object with a string model and device, as
    :meth:`~.index_trie.ModelTrie.parse` requires), else :class:`FormatError` naming the
    index and the entry: checked before a migration writes anything."""
    for i, e in enumerate(check_v2_entries(index["entries"], url)):
        check_entry_size(e, url, f"index entries[{i}]")


def open_for_writing(
    store: IndexStore, *, version: int | None = None
) -> tuple[ShardedIndex | None, dict[str, Any] | None, list[ObjectStats]]:
    """The sharded index to publish into (None: write version 2), what a migration did
    (None when there was none) and the root's stats."""
    if version not in (None, 2, 3):
        raise ConfigurationError(f"{store.root}: index version must be 2 or 3, got {version!r}")
    stats = ObjectStats(store.root, "root")
    from .._retry import CONFLICT_RETRY

    for _ in range(CONFLICT_RETRY.attempts):
        value, token = store.read_json(store.root)
        if value is not None:
            root = check_index(value, store.root)
            if root["version"] == 3:
                if version == 2:
                    raise ConfigurationError(
                        f"{store.root}: is a version 3 (sharded) index; it is never written "
                        "as version 2"
                    )
                sharded = ShardedIndex(store, check_layout(root, store.root))
                mark_named(store, root)
                return sharded, None, [stats]
            if store.cas and (named := named_beside(store)):
                raise overwritten(store.root, root["version"], named)
        if not store.cas or version == 2:
            return None, None, []
        if value is None:  # a new index: its root first, then its shards
            stats.attempts += 1
            layout = new_layout()
            if store.create(store.root, made := root_value(layout)):
                stats.written = True
                mark_named(store, made)
                return ShardedIndex(store, layout), None, [stats]
            stats.conflicts += 1
            continue
        return _migrate(store, root, token, stats)
    raise PreconditionFailed(
        f"{store.root}: the index changed under every one of {CONFLICT_RETRY.attempts} "
        "attempts to open it",
        url=store.root,
    )


def _migrate(
    store: IndexStore, old: dict[str, Any], token: str | None, stats: ObjectStats
) -> tuple[ShardedIndex, dict[str, Any] | None, list[ObjectStats]]:
    """Write ``old``'s entries as version 3 and swap the root (see the module docstring)."""
    check_entries(old, store.root)
    sharded = ShardedIndex(store, new_layout())
    objects = sharded.write_static(old["entries"])
    with legacy_lock(store):
        return _swap(store, old, token, stats, sharded, objects)


def _swap(
    store: IndexStore,
    old: dict[str, Any],
    token: str | None,
    stats: ObjectStats,
    sharded: ShardedIndex,
    objects: int,
) -> tuple[ShardedIndex, dict[str, Any] | None, list[ObjectStats]]:
    """The root swapped to ``sharded``'s by compare-and-swap on ``token``, the version
    2 entries copied again while another writer changes them (the module docstring)."""
    from .._retry import CONFLICT_RETRY

    written = {m: dict(es) for m, es in _entries_by_model(old).items()}
    for _ in range(CONFLICT_RETRY.attempts):
        layout = sharded.layout
        stats.attempts += 1
        info = {
            "from_version": old["version"],
            "entries": len(old["entries"]),
            "objects": objects,
            "at": now(),
        }
        try:
            store.write(
                store.root,
                made := root_value(layout, info),
                "create" if token is None else "if-match",
                token,
            )
            stats.written = True
            mark_named(store, made)
            return sharded, info, [stats]
        except (PreconditionFailed, AlreadyExists):
            stats.conflicts += 1
        value, token = store.read_json(store.root)
        if value is not None and check_index(value, store.root)["version"] == 3:
            won = check_layout(value, store.root)
            if won["shards"] == layout["shards"]:  # this swap, its answer lost
                stats.written = True
                mark_named(store, value)
                return sharded, info, [stats]
            store.remove_tree(sharded.directory)  # another migration won
            return ShardedIndex(store, won), None, [stats]
        old = check_index(value, store.root) if value is not None else {"version": 2, "entries": []}
        try:
            sharded, objects, written = _copy_again(store, old, sharded, objects, written)
        except FormatError:
            store.remove_tree(sharded.directory)  # never named: nothing else reads it
            raise
    raise PreconditionFailed(
        f"{store.root}: the version 2 index changed under every one of "
        f"{CONFLICT_RETRY.attempts} attempts to migrate it to version 3",
        url=store.root,
    )


def _copy_again(
    store: IndexStore,
    old: dict[str, Any],
    sharded: ShardedIndex,
    objects: int,
    written: dict[str, dict[tuple[str, str], Any]],
) -> tuple[ShardedIndex, int, dict[str, dict[tuple[str, str], Any]]]:
    """The models of ``old`` (the version 2 index read again) whose entries differ from
    those ``written`` copied again into ``sharded``'s directory (or everything into a new
    one); :class:`FormatError` for an entry or an object it cannot hold."""
    check_entries(old, store.root)
    now_by_model = _entries_by_model(old)
    stale = {m for m in set(written) | set(now_by_model) if written.get(m) != now_by_model.get(m)}
    # A model copied again starts from an empty directory: nodes of its earlier copy's
    # trie (deeper than the new one, under what is now a leaf) would be taken by a later
    # split for halves a helper made, and bring back the old entries. No root names this
    # directory yet, so no one else writes into it.
    for model in stale:
        store.remove_tree(sharded.model_dir(model))
    if any(store.list_names(sharded.model_dir(m)) for m in stale):
        # Not removed (the removal is best effort): copy everything afresh.
        store.remove_tree(sharded.directory)
        sharded = ShardedIndex(store, new_layout(sharded.leaf_bytes, sharded.listed))
        objects = sharded.write_static(old["entries"])
    else:
        objects += sharded.write_static(old["entries"], stale)
    return sharded, objects, {m: dict(es) for m, es in now_by_model.items()}


def create_index(
    url: str | os.PathLike[str],
    *,
    leaf_bytes: int | None = None,
    listed: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create an empty version 3 index at ``url`` with its shards' bound (``leaf_bytes``,
    default 16 KiB) and the device names its catalogs list per kind of build (``listed``,
    default 8); returns its root. A publish creates one with the defaults when there is
    none: this is for another bound. :class:`~ptestore.errors.AlreadyExists` when there
    is an index already."""
    target = os.fspath(url)
    store = IndexStore(target, dict(storage_options or {}))
    store.require_cas()
    layout = new_layout(
        DEFAULT_LEAF_BYTES if leaf_bytes is None else leaf_bytes,
        DEFAULT_LISTED if listed is None else listed,
    )
    root = root_value(layout)
    try:
        check_layout(root, target)
    except FormatError as exc:
        raise ConfigurationError(
            f"{target}: {exc.field.removeprefix('index layout.')} = {exc.value!r}: must be "
            f"{exc.limit}"
        ) from None
    if not store.create(target, root):
        raise AlreadyExists(f"{target}: an index exists already")
    mark_named(store, root)
    return root


def migrate_index(
    url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Migrate the version 1/2 index at ``url`` to version 3 now, as the next publish
    would (:mod:`.index_migrate`): ahead of a run, since copying a large index takes a
    while (about 10 ms per object on S3). Returns what it copied (the root's
    ``migrated``), None when the index is version 3 already.
    :class:`~ptestore.errors.ObjectNotFound` when there is no index."""
    target = os.fspath(url)
    store = IndexStore(target, dict(storage_options or {}))
    store.require_cas()
    if store.read(target)[1] is None:
        raise store.missing()
    _, migrated, _ = open_for_writing(store)
    return migrated
