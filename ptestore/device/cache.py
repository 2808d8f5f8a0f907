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

import json
import os
import shutil
import time
from typing import Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, FormatError, PermissionDenied, StorageError
from ..storage.types import StorageURL
from .lock import KeyLock
from .private import SHARED_WRITE, check_private

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "CacheEntry",
    "CacheLayout",
    "check_private",
    "clear",
    "evict",
    "list_entries",
    "prune",
]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "ptestore.cache-entry"
MANIFEST_VERSION = 1
#: A manifest larger than this is not one of ours.
MAX_MANIFEST_BYTES = 1 << 20


#: The mode the cache creates its directories with (the umask may only remove bits).
PRIVATE_DIR_MODE = 0o755


class CacheLayout:
    """Paths of a cache directory."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        text = os.fspath(cache_dir)
        if not isinstance(text, str) or not text:
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

    def make_entry_dir(self, key: str) -> str:
        """Entry ``key``'s directory, created ``0o755`` where missing and checked."""
        directory = self.entry_dir(key)
        os.makedirs(directory, mode=PRIVATE_DIR_MODE, exist_ok=True)
        check_private(directory, "cache entry")
        return directory

    def entry_dir(self, key: str) -> str:
        return os.path.join(self.entries, key)

    def manifest(self, key: str) -> str:
        return os.path.join(self.entries, key, MANIFEST)

    def lock(self, key: str, *, shared: bool = False, blocking: bool = True) -> KeyLock:
        return KeyLock(os.path.join(self.locks, key + ".lock"), shared=shared, blocking=blocking)

    def entry_keys(self) -> list[str]:
        try:
            names = os.listdir(self.entries)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.startswith("."))


def read_manifest(path: str, *, private: bool = False) -> dict[str, Any] | None:
    """The manifest at ``path``; None when there is none. One ``open`` and one read
    (and with ``private``, one ``fstat``: :func:`check_private`).

    Raises :class:`FormatError` for a file that is not a cache manifest."""
    try:
        with open(path, "rb") as f:
            if private:
                check_private(path, "cache entry's manifest", os.fstat(f.fileno()))
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    except PermissionDenied:
        raise
    except OSError as exc:
        raise StorageError(f"{path}: cannot read the cache manifest: {exc.strerror}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise FormatError(path, "manifest size", len(raw), f"at most {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise FormatError(path, "manifest", raw[:40], f"JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        got = data.get("format") if isinstance(data, dict) else data
        raise FormatError(path, "manifest format", got, repr(MANIFEST_FORMAT))
    if data.get("version") != MANIFEST_VERSION:
        raise FormatError(path, "manifest version", data.get("version"), str(MANIFEST_VERSION))
    return data


def _stamp_of(st: os.stat_result) -> dict[str, int]:
    return {
        "size": st.st_size,
        "ino": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def file_stamp(path: str) -> dict[str, int]:
    """What an entry's manifest records of one of its files: size, inode, ``mtime_ns``
    and ``ctime_ns`` (one ``stat``)."""
    return _stamp_of(os.stat(path))


def files_intact(directory: str, manifest: dict[str, Any]) -> bool:
    """Whether every file the manifest names is there as recorded (one ``stat`` each),
    owned by this user (or root) and not writable by group or others. A manifest
    written before ``ctime_ns`` was recorded is compared without it."""
    files = manifest.get("files")
    if not isinstance(files, dict) or "pte" not in files:
        return False
    me = os.geteuid()
    for rec in files.values():
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
            return False
        name = rec["name"]
        if os.sep in name or name.startswith("."):
            return False
        try:
            st = os.stat(os.path.join(directory, name))
        except OSError:
            return False
        if st.st_uid not in (me, 0) or st.st_mode & SHARED_WRITE:
            return False
        now = _stamp_of(st)
        keys = ("size", "ino", "mtime_ns", "ctime_ns") if "ctime_ns" in rec else _OLD_STAMP
        if any(now[k] != rec.get(k) for k in keys):
            return False
    return True


#: What manifests recorded of a file before ``ctime_ns``.
_OLD_STAMP = ("size", "ino", "mtime_ns")


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


def _dir_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total


def load_entry(layout: CacheLayout, key: str) -> CacheEntry:
    directory = layout.entry_dir(key)
    size = _dir_bytes(directory)
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
    state = "ready" if (in_place or files_intact(directory, manifest)) else "broken"
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
    so that the entry stops being valid before any of its files goes. Returns the bytes
    freed."""
    directory = layout.entry_dir(key)
    freed = _dir_bytes(directory)
    try:
        os.unlink(layout.manifest(key))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StorageError(f"{layout.manifest(key)}: cannot remove: {exc.strerror}") from exc
    shutil.rmtree(directory, ignore_errors=True)
    return freed


def packed_weights_file(name: str) -> bool:
    """Whether ``name`` is one of the XNNPACK packed-weight files ``ensure(...,
    xnnpack_cache=True)`` keeps beside an entry (:mod:`.packed`)."""
    return name == "xnnpack.json" or (
        name.startswith("xnnpack-")
        and name.endswith((".xpwc", ".xpwc.json", ".xpwc.lock", ".refused.json"))
    )


def clean_entry_locked(
    layout: CacheLayout,
    key: str,
    manifest: dict[str, Any] | None,
    *,
    keep_packed: bool = False,
) -> None:
    """Remove files of entry ``key`` that its manifest does not name (staging files of a
    run that died; the caller holds the key exclusively, so no run is writing them);
    ``keep_packed``: not the entry's XNNPACK packed-weight files (an entry made again
    loses them: they were bound to the files it replaces)."""
    directory = layout.entry_dir(key)
    keep = {MANIFEST}
    if manifest is not None and isinstance(manifest.get("files"), dict):
        keep |= {
            r["name"]
            for r in manifest["files"].values()
            if isinstance(r, dict) and isinstance(r.get("name"), str)
        }
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep and not (keep_packed and packed_weights_file(name)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


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


def _try_remove(layout: CacheLayout, key: str, out: Removed) -> bool:
    lock = layout.lock(key, blocking=False)
    if not lock.acquire():
        out.busy.append(key)
        return False
    try:
        out.freed += remove_entry_locked(layout, key)
        out.removed.append(key)
    finally:
        lock.remove()
    return True


def evict(cache_dir: str | os.PathLike[str], max_bytes: int, *, keep: str | None = None) -> Removed:
    """Remove least-recently-used entries until the cache holds at most ``max_bytes``.

    The entry ``keep`` (the one being returned to the caller) is never removed, nor is an
    entry another process holds; broken and incomplete entries go first."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ConfigurationError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
    layout = CacheLayout(cache_dir)
    entries = [load_entry(layout, k) for k in layout.entry_keys()]
    total = sum(e.bytes for e in entries)
    out = Removed()
    order = sorted(entries, key=lambda e: (e.state == "ready", e.last_used or 0.0))
    for e in order:
        if total <= max_bytes:
            break
        if e.key == keep:
            continue
        if _try_remove(layout, e.key, out):
            total -= e.bytes
    out.remaining = total
    return out


def prune(cache_dir: str | os.PathLike[str], max_bytes: int | None = None) -> Removed:
    """Remove broken and incomplete entries (and the leftovers of runs that died), then,
    with ``max_bytes``, least-recently-used entries until the cache fits."""
    layout = CacheLayout(cache_dir)
    out = Removed()
    for key in layout.entry_keys():
        e = load_entry(layout, key)
        if e.state != "ready":
            _try_remove(layout, key, out)
            continue
        lock = layout.lock(key, blocking=False)
        if lock.acquire():
            try:
                clean_entry_locked(layout, key, e.manifest, keep_packed=True)
            finally:
                lock.release()
    if max_bytes is not None:
        more = evict(cache_dir, max_bytes)
        out.removed += more.removed
        out.freed += more.freed
        out.busy += [k for k in more.busy if k not in out.busy]
        out.remaining = more.remaining
    else:
        out.remaining = sum(_dir_bytes(layout.entry_dir(k)) for k in layout.entry_keys())
    return out


def clear(cache_dir: str | os.PathLike[str]) -> Removed:
    """Remove every entry no other process holds."""
    layout = CacheLayout(cache_dir)
    out = Removed()
    for key in layout.entry_keys():
        _try_remove(layout, key, out)
    out.remaining = sum(_dir_bytes(layout.entry_dir(k)) for k in layout.entry_keys())
    return out


def touch(path: str) -> None:
    """Record a use of the entry whose manifest is ``path``."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:  # a read-only cache still serves hits; only LRU order suffers
        pass
