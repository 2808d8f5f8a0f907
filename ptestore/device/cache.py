"""The on-device cache directory: entries, their manifests, last use and eviction.

Layout (everything below ``cache_dir``)::

    entries/<key>/manifest.json   what the entry is (written last, atomically)
    entries/<key>/model.pte       the specialized program (published atomically)
    entries/<key>/model.ptd       its external weights, when the source has a .ptd
    locks/<key>.lock              the advisory lock of the key (see :mod:`.lock`)
    backends.json                 what the installed distributions said about the
                                  backends, and the stamp of the installation it
                                  holds for (:mod:`ptestore.backends.snapshot`)

An entry is valid only when its manifest exists and every file it names has the size,
inode, modification time and status-change time (``ctime``) the manifest records: a crash
between publishing the files and the manifest, or a file changed behind the cache's back
(even one rewritten at the same size with its ``mtime`` set back: no call sets ``ctime``
back), reads as a miss, never as a hit on a partial or foreign file. That check is by
``stat`` and trusts what ``stat`` cannot see: a change within the same tick of the file
system's clock as the entry's last change, or one made by a process that can set the
clock back or write the disk directly (this user's or root's; see :func:`check_private`).

The cache is this user's alone, as ssh wants its files (:func:`check_private`): the cache
directory, ``entries/``, ``locks/``, each entry's directory and manifest must be owned by
this user (or root) and not writable by group or others, else
:class:`~ptestore.errors.PermissionDenied` names the path, its owner and mode and the fix;
an entry's file writable by group or others, or owned by someone else, is not a hit
(made again). The cache creates its directories ``0o755`` and its files without group or
others' write (whatever the umask). The last use of an entry is the modification time of
its manifest, set by :func:`~ptestore.device.ensure` on every hit (``os.utime``:
no data written, independent of ``atime`` and of mount options such as ``noatime``).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from .._args import path_argument
from .._dataclass import dataclass, field
from .._log import get_logger
from ..errors import ConfigurationError, FormatError, PteStoreError, StorageError
from ..storage.types import StorageURL
from .entryfiles import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    check_entry_dir,
    clean_entry_locked,
    dir_bytes,
    entry_dir_fd,
    entry_files,
    file_stamp,
    files_intact,
    freed_since,
    is_key,
    packed_weights_file,
    read_manifest,
)
from .lock import KeyLock
from .orphans import remove_orphan_locks
from .private import check_private

log = get_logger(__name__)

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "CacheEntry",
    "CacheLayout",
    "check_private",
    "clear",
    "evict",
    "file_stamp",
    "files_intact",
    "list_entries",
    "packed_weights_file",
    "prune",
    "read_manifest",
]


#: The mode the cache creates its directories with (the umask may only remove bits).
PRIVATE_DIR_MODE = 0o755


class CacheLayout:
    """Paths of a cache directory."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        text = path_argument(cache_dir, "cache_dir")
        if not text:
            raise ConfigurationError(f"cache_dir must be a directory path, got {cache_dir!r}")
        url = StorageURL.of(text)
        if not url.local:
            raise ConfigurationError(
                f"cache_dir {text!r}: the cache is a local directory, not a URL"
            )
        self.root = url.path
        self.entries = os.path.join(self.root, "entries")
        self.locks = os.path.join(self.root, "locks")
        self.snapshot = os.path.join(self.root, "backends.json")

    def create(self) -> None:
        """Create the cache's directories (``0o755``) where missing, and check that they
        are this user's alone (:func:`check_private`)."""
        for d in (self.root, self.entries, self.locks):
            try:
                os.makedirs(d, mode=PRIVATE_DIR_MODE, exist_ok=True)
            except FileExistsError as exc:
                raise ConfigurationError(f"{d}: exists and is not a directory") from exc
            except OSError as exc:
                raise StorageError(
                    f"{d}: cannot create the cache directory: {exc.strerror}"
                ) from exc
            check_private(d, "cache directory" if d == self.root else "cache directory's")

    def check(self) -> None:
        """The cache's directories that exist are this user's alone
        (:func:`check_private`), before anything in them is removed: a ``cache
        prune``/``clear`` (or an eviction) of a cache others can write to would follow
        what they planted there (``entries`` a link to another directory)."""
        for d in (self.root, self.entries, self.locks):
            check_private(d, "cache directory" if d == self.root else "cache directory's")

    def make_entry_dir(self, key: str) -> str:
        """Entry ``key``'s directory, created ``0o755`` where missing and checked."""
        directory = self.entry_dir(key)
        check_entry_dir(directory)  # a link to elsewhere is refused before makedirs
        os.makedirs(directory, mode=PRIVATE_DIR_MODE, exist_ok=True)
        check_entry_dir(directory)
        return directory

    def entry_dir(self, key: str) -> str:
        return os.path.join(self.entries, key)

    def manifest(self, key: str) -> str:
        return os.path.join(self.entries, key, MANIFEST)

    def lock(self, key: str, *, shared: bool = False, blocking: bool = True) -> KeyLock:
        return KeyLock(os.path.join(self.locks, key + ".lock"), shared=shared, blocking=blocking)

    def entry_keys(self) -> list[str]:
        """The keys of the entries: the real directories under ``entries/`` named as a
        key is (anything else there is not an entry, and left alone)."""
        try:
            with os.scandir(self.entries) as it:
                return sorted(
                    e.name for e in it if is_key(e.name) and e.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            return []
        except NotADirectoryError as exc:  # cache_dir (or its entries/) a file
            culprit = self.entries if os.path.isdir(self.root) else self.root
            raise ConfigurationError(
                f"{culprit}: not a directory; a cache directory (cache_dir) and its "
                "entries/ are directories"
            ) from exc


@dataclass
class CacheEntry:
    """One entry of a cache directory, as ``ptestore cache ls`` shows it."""

    key: str
    path: str
    #: ``"ready"``, ``"incomplete"`` (no manifest: an interrupted run) or ``"broken"``
    #: (a manifest whose files are missing or changed, or one that cannot be read).
    state: str
    bytes: int
    #: Last use (seconds since the epoch): the manifest's modification time.
    last_used: float | None
    source: str | None = None
    in_place: bool = False
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "path": self.path,
            "state": self.state,
            "bytes": self.bytes,
            "last_used": self.last_used,
            "source": self.source,
            "in_place": self.in_place,
            "xnnpack_cache": self.xnnpack_cache,
        }

    @property
    def xnnpack_cache(self) -> str | None:
        """The entry's XNNPACK packed-weight file (``ensure(..., xnnpack_cache=True)``):
        the path of one with its record beside it, else None (not checked here)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return None
        for name in sorted(names):
            if name.endswith(".xpwc") and name + ".json" in names:
                return os.path.join(self.path, name)
        return None


def _usable(manifest: dict[str, Any], path: str) -> bool:
    """Whether an artifact can be built from ``manifest`` (what a hit returns): its
    source named, its provenance record readable. A manifest whose provenance field is
    damaged is broken: a hit on it is a miss, and prune removes it."""
    if manifest.get("in_place") and not isinstance(manifest.get("source"), str):
        return False
    record = manifest.get("provenance")
    if record is None:
        return True
    from ..provenance.record import Provenance

    try:
        Provenance.from_dict(record, path)
    except Exception:  # any damage: not an artifact
        return False
    return True


def load_entry(layout: CacheLayout, key: str) -> CacheEntry:
    directory = layout.entry_dir(key)
    size = dir_bytes(directory)
    path = layout.manifest(key)
    try:
        manifest = read_manifest(path)
    except (FormatError, StorageError):
        return CacheEntry(key, directory, "broken", size, None)
    if manifest is None:
        return CacheEntry(key, directory, "incomplete", size, None)
    try:
        used = os.stat(path).st_mtime
    except OSError:
        used = None
    in_place = bool(manifest.get("in_place"))
    intact = in_place or files_intact(directory, manifest)
    state = "ready" if intact and _usable(manifest, path) else "broken"
    src = manifest.get("source")
    return CacheEntry(
        key,
        directory,
        state,
        size,
        used,
        src if isinstance(src, str) else None,
        in_place,
        manifest,
    )


def list_entries(cache_dir: str | os.PathLike[str]) -> list[CacheEntry]:
    """Every entry of the cache, most recently used first."""
    layout = CacheLayout(cache_dir)
    entries = [load_entry(layout, k) for k in layout.entry_keys()]
    entries.sort(key=lambda e: -(e.last_used or 0.0))
    return entries


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
        raise _stopped(layout, "prune", out, exc) from exc
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
        raise _stopped(layout, "clear", out, exc) from exc
    out.remaining = sum(dir_bytes(layout.entry_dir(k)) for k in layout.entry_keys())
    return out


def _stopped(layout: CacheLayout, what: str, out: Removed, exc: StorageError) -> StorageError:
    """The error of a ``cache prune``/``clear`` stopped part-way (``exc``: what stopped
    it, a file or lock file it could not remove), with what it had removed and what the
    cache keeps."""
    try:
        kept = f", {_entries(len(layout.entry_keys()))} kept"
    except PteStoreError:
        kept = ""
    removed = f"{_entries(len(out.removed))} ({out.freed} bytes freed)"
    return StorageError(
        f"{layout.root}: cache {what} stopped: {exc}; it had removed {removed}{kept}",
        errno=exc.errno,
    )


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def touch(path: str) -> None:
    """Record a use of the entry whose manifest is ``path``."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:  # a read-only cache still serves hits; only LRU order suffers
        pass
