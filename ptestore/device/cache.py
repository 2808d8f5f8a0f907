"""Removing cache entries: one under its key's exclusive lock (:func:`remove_entry_locked`),
least-recently-used eviction (:func:`evict`), and the two sweeps of ``ptestore cache``
(:func:`prune`, :func:`clear`), with the error of a sweep stopped part-way: what it had
removed and what the cache keeps. The cache directory's layout and its entries as
listed are :mod:`.layout`'s; their names are found here too (this module's import path
is the one they have always had: ``ptestore.device.cache``).

Each entry is judged from a listing, then read again under its lock, taken without
waiting: one another process holds is busy (kept), one made, remade or used since it was
judged is kept (judged again next time). The cache's directories are checked to be this
user's alone (:meth:`.layout.CacheLayout.check`) before anything in them is removed.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from .._dataclass import dataclass, field
from .._log import get_logger
from ..errors import ConfigurationError, PteStoreError, StorageError
from .entryfiles import clean_entry_locked, dir_bytes, entry_dir_fd, entry_files, freed_since
from .layout import MANIFEST, CacheEntry, CacheLayout, load_entry
from .orphans import remove_orphan_locks

log = get_logger(__name__)

__all__ = ["Removed", "clear", "evict", "prune", "remove_entry_locked", "stopped"]


def remove_entry_locked(layout: CacheLayout, key: str) -> int:
    """Remove entry ``key`` (its lock held exclusively by the caller): the manifest first,
    so the entry stops being valid before any file goes. Returns the bytes freed on the
    file system (:func:`.freed_since`); a link or a file at its path is left alone (0)."""
    directory = layout.entry_dir(key)
    with entry_dir_fd(directory) as fd:
        if fd is None:
            return 0
        files = entry_files(directory)
        try:
            os.unlink(MANIFEST, dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError):  # none, or not one: the entry goes
            pass
        except OSError as exc:
            raise StorageError(f"{layout.manifest(key)}: cannot remove: {exc.strerror}") from exc
    shutil.rmtree(directory, ignore_errors=True)  # never through a link (rmtree refuses one)
    if left := entry_files(directory):  # a prune removes the rest once it can
        kept = sum(size * paths for size, _, _, paths in left.values())  # as counted
        log.warning("%s: removed, but %d bytes of its files could not be", directory, kept)
    return freed_since(files, left)


@dataclass
class Removed:
    """What :func:`evict`, :func:`prune` and :func:`clear` did."""

    removed: list[str] = field(default_factory=list)
    freed: int = 0
    #: Keys left because another process holds them (in use right now).
    busy: list[str] = field(default_factory=list)
    #: Bytes the cache holds afterwards.
    remaining: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "freed": self.freed,
            "busy": self.busy,
            "remaining": self.remaining,
        }


def _same(judged: CacheEntry, now: CacheEntry) -> bool:
    return (judged.state, judged.last_used, judged.manifest) == (
        now.state,
        now.last_used,
        now.manifest,
    )


def _try_remove(layout: CacheLayout, judged: CacheEntry, out: Removed) -> int | None:
    """Remove the entry ``judged`` under its exclusive lock, taken without waiting (held:
    busy). Under the lock it is read again: one made, remade or used since it was judged
    (its state, last use or manifest changed) is kept. Returns the bytes freed, None when
    kept."""
    lock = layout.lock(judged.key, blocking=False)
    if not lock.acquire():
        out.busy.append(judged.key)
        return None
    try:
        if not _same(judged, load_entry(layout, judged.key)):
            lock.release()
            return None  # an ensure made or used it meanwhile: judged again next time
        freed = remove_entry_locked(layout, judged.key)
    except BaseException:
        lock.release()
        raise
    out.freed += freed
    out.removed.append(judged.key)
    lock.remove()  # a StorageError when it cannot be: the entry is gone, counted above
    return freed


def evict(cache_dir: str | os.PathLike[str], max_bytes: int, *, keep: str | None = None) -> Removed:
    """Remove least-recently-used entries until the cache holds at most ``max_bytes``.

    The entry ``keep`` (the one being returned to the caller) is never removed, nor is an
    entry another process holds, nor one used or made again since the listing; broken
    and incomplete entries go first."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ConfigurationError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
    layout = CacheLayout(cache_dir)
    layout.check()
    entries = [load_entry(layout, k) for k in layout.entry_keys()]
    total = sum(e.bytes for e in entries)
    out = Removed()
    order = sorted(entries, key=lambda e: (e.state == "ready", e.last_used or 0.0))
    for e in order:
        if total <= max_bytes:
            break
        if e.key == keep:
            continue
        try:
            freed = _try_remove(layout, e, out)
        except StorageError as exc:  # its lock or files cannot be handled: kept, said
            # (after a make, the entry made is returned all the same)
            if e.key not in out.removed:
                log.warning("%s: not evicted: %s", layout.entry_dir(e.key), exc)
                continue
            log.warning("%s: evicted, but %s", layout.entry_dir(e.key), exc)  # its lock file
            freed = 0
        if freed is not None:  # what left the cache (a file not removed is still there)
            total -= e.bytes - dir_bytes(layout.entry_dir(e.key))
    out.remaining = total
    return out


def prune(cache_dir: str | os.PathLike[str], max_bytes: int | None = None) -> Removed:
    """Remove broken and incomplete entries (and the leftovers of runs that died, lock
    files of keys without an entry included), then, with ``max_bytes``,
    least-recently-used entries until the cache fits."""
    layout = CacheLayout(cache_dir)
    layout.check()
    out = Removed()
    try:
        for key in layout.entry_keys():
            e = load_entry(layout, key)
            if e.state != "ready":
                _try_remove(layout, e, out)
                continue
            lock = layout.lock(key, blocking=False)
            if lock.acquire():
                try:  # read again under the lock: the files the entry names now
                    manifest = load_entry(layout, key).manifest
                    directory = layout.entry_dir(key)
                    out.freed += clean_entry_locked(directory, manifest, keep_packed=True)
                finally:
                    lock.release()
        remove_orphan_locks(layout.entries, layout.locks)
    except StorageError as exc:
        raise stopped(layout, "prune", len(out.removed), out.freed, exc) from exc
    if max_bytes is not None:
        more = evict(cache_dir, max_bytes)
        out.removed += more.removed
        out.freed += more.freed
        out.busy += [k for k in more.busy if k not in out.busy]
        out.remaining = more.remaining
    else:
        out.remaining = sum(dir_bytes(layout.entry_dir(k)) for k in layout.entry_keys())
    return out


def clear(cache_dir: str | os.PathLike[str]) -> Removed:
    """Remove every entry no other process holds (and the lock files of keys without an
    entry)."""
    layout = CacheLayout(cache_dir)
    layout.check()
    out = Removed()
    try:
        for key in layout.entry_keys():
            e = load_entry(layout, key)
            if _try_remove(layout, e, out) is None and key not in out.busy:
                # used or remade since it was read: still removed (clear removes every entry)
                _try_remove(layout, load_entry(layout, key), out)
        remove_orphan_locks(layout.entries, layout.locks)
    except StorageError as exc:
        raise stopped(layout, "clear", len(out.removed), out.freed, exc) from exc
    out.remaining = sum(dir_bytes(layout.entry_dir(k)) for k in layout.entry_keys())
    return out


def stopped(
    layout: CacheLayout, what: str, removed: int, freed: int, exc: StorageError
) -> StorageError:
    """The error of a ``cache prune``, ``prune --stale`` or ``clear`` (``what``) stopped
    part-way (``exc``: what stopped it, a file or lock file it could not remove), with
    what it had removed (``removed`` entries, ``freed`` bytes) and what the cache keeps."""
    try:
        kept = f", {_entries(len(layout.entry_keys()))} kept"
    except PteStoreError:
        kept = ""
    done = f"{_entries(removed)} ({freed} bytes freed)"
    return StorageError(
        f"{layout.root}: cache {what} stopped: {exc}; it had removed {done}{kept}",
        errno=exc.errno,
    )


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"
