"""Index versions 1 and 2: one JSON object holding every entry.

``{"format": "ptestore.index", "version": 2, "updated": "...", "entries": [...]}``
(version 1 had no shared .ptd entries). They are read as they are; a writer with
compare-and-swap migrates them to version 3 on its first publish (:mod:`.index_v3`).
A store without compare-and-swap (another fsspec protocol) keeps version 2, written
unconditionally (last writer wins), as before.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import FormatError, ObjectNotFound
from .index_bounds import (
    MAX_INDEX_DEPTH,
    MAX_ROOT_BYTES,
    MAX_V2_BYTES,
    check_root_size,
    check_v2_entries,
    oversize,
)
from .index_store import IndexStore, ObjectStats

if TYPE_CHECKING:
    from .index_pins import EntryGuard

__all__ = [
    "INDEX_FORMAT",
    "READABLE_VERSIONS",
    "check_index",
    "merge_entries",
    "now",
    "parse_index",
    "publish_v2",
    "read_plain",
    "update_v2",
]

INDEX_FORMAT = "ptestore.index"
#: Versions read (1 has no shared .ptd entries; 3 is the sharded index, a root object).
READABLE_VERSIONS = (1, 2, 3)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_entries(old: dict[str, Any] | None, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A version 2 index: the entries of ``old`` with ``entries`` replacing theirs (keyed
    by ``(model, device)``)."""
    kept = {(e["model"], e["device"]): e for e in (old or {}).get("entries", [])}
    for e in entries:
        kept[(e["model"], e["device"])] = e
    return {
        "format": INDEX_FORMAT,
        "version": 2,
        "updated": now(),
        "entries": [kept[k] for k in sorted(kept)],
    }


def check_index(value: object, url: str) -> dict[str, Any]:
    """``value`` if it is an index (a version 1 or 2 index, or a version 3 root), else
    :class:`FormatError` naming the field."""
    if not isinstance(value, dict):
        raise FormatError(url, "index", type(value).__name__, "a JSON object")
    if value.get("format") != INDEX_FORMAT:
        raise FormatError(url, "index format", value.get("format"), repr(INDEX_FORMAT))
    version = value.get("version")  # True == 1 in Python: a bool is no version
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise FormatError(
            url,
            "index version",
            value.get("version"),
            ", ".join(str(v) for v in READABLE_VERSIONS[:-1]) + f" or {READABLE_VERSIONS[-1]}",
        )
    if value["version"] != 3 and not isinstance(value.get("entries"), list):
        raise FormatError(url, "index entries", value.get("entries"), "a list")
    return value


def parse_index(data: bytes, url: str) -> dict[str, Any]:
    """The index in ``data`` (read from ``url``), checked."""
    from .._jsondepth import load_bounded

    value = check_index(load_bounded(data, url, "index", MAX_INDEX_DEPTH), url)
    check_root_size(value, len(data), url)
    return value


def _v2(value: dict[str, Any], url: str) -> dict[str, Any]:
    """``value`` as an index of version 1 or 2 (a version 3 root is never merged into)."""
    old = check_index(value, url)
    if old["version"] == 3:
        raise FormatError(
            url, "index version", 3, "1 or 2 here (another writer made it a sharded index)"
        )
    check_v2_entries(old["entries"], url)  # merged by (model, device): each one an entry
    return old


def publish_v2(
    store: IndexStore, entries: list[dict[str, Any]], guard: EntryGuard | None = None
) -> list[ObjectStats]:
    """Merge ``entries`` into the version 1/2 index at ``store.root`` (conditionally on
    a store with compare-and-swap, else last writer wins); with ``guard``, not one whose
    artifact another run replaced since (:mod:`.index_pins`)."""
    stats = ObjectStats(store.root, "index", entries=len(entries))

    def merged(old: dict[str, Any] | None) -> dict[str, Any] | None:
        kept = entries
        if guard is not None:
            there = {(e["model"], e["device"]): e for e in (old or {}).get("entries", [])}
            kept = [e for e in entries if guard.admits(there.get((e["model"], e["device"])), e)]
        return merge_entries(old, kept) if kept or old is None else None

    if store.cas:

        def transform(value: dict[str, Any] | None, _version: str | None) -> dict[str, Any] | None:
            return merged(None if value is None else _v2(value, store.root))

        store.update(store.root, transform, stats)
        return [stats]
    data, version = read_plain(store)
    new = merged(None if version is None else _v2(parse_index(data, store.root), store.root))
    stats.attempts = 1
    if new is not None:
        store.write(store.root, new, "overwrite")
        stats.written = True
    return [stats]


def update_v2(
    store: IndexStore,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> tuple[list[dict[str, Any]], list[ObjectStats], int, int]:
    """Apply ``change`` to every entry of the version 1/2 index inside its
    compare-and-swap loop; returns the entries changed, the stats, the number of
    entries examined and of those left as they were that are retired."""
    stats = ObjectStats(store.root, "index")
    made: list[dict[str, Any]] = []
    seen = [0, 0]

    def transform(value: dict[str, Any] | None, _version: str | None) -> dict[str, Any] | None:
        made.clear()
        if value is None:
            raise ObjectNotFound(f"{store.root}: no index")
        old = _v2(value, store.root)
        seen[:] = [len(old["entries"]), 0]
        for e in old["entries"]:
            new = change(e) if isinstance(e, dict) else None
            if new is not None and new != e:
                made.append(new)
            elif isinstance(e, dict) and e.get("retired"):
                seen[1] += 1
        return merge_entries(old, made) if made else None

    if store.cas:
        store.update(store.root, transform, stats)
    else:
        data, version = read_plain(store)
        new = transform(None if version is None else parse_index(data, store.root), version)
        stats.attempts = 1
        if new is not None:
            store.write(store.root, new, "overwrite")
            stats.written = True
    return list(made), [stats], seen[0], seen[1]


def read_plain(store: IndexStore) -> tuple[bytes, str | None]:
    """The index at ``store.root`` on a store without version tokens (``(b"", None)``
    when absent; ``"-"`` for its version), at most :data:`MAX_V2_BYTES`, an object larger
    than a version 3 root only once its first bytes show a version 1/2 index
    (:mod:`.index_root`)."""
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader
    from .index_root import HEAD_BYTES, check_root_head

    try:
        loader = open_loader(store.root, **options_for_loader(store.root, store.options, "dst"))
    except ObjectNotFound:
        return b"", None
    try:
        size = loader.size()
        if size > MAX_V2_BYTES:
            raise oversize(store.root, "index", size, MAX_V2_BYTES)
        if size > MAX_ROOT_BYTES:
            check_root_head(bytes(loader.load(0, HEAD_BYTES)), size, store.root)
        data = bytes(loader.load(0, size))
    finally:
        loader.close()
    store.reads.add(len(data))
    return data, "-"
