"""The on-device cache directory: its paths (:class:`CacheLayout`), its entries as
``cache ls`` lists them (:class:`CacheEntry`), their manifests and last use. Removing
entries (eviction, prune, clear) is :mod:`.cache`'s.

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
no data written, independent of ``atime`` and of mount options such as ``noatime``),
never set back (:func:`touch`: a hit under a clock behind does not put the model in
use first in line for eviction).
"""

from __future__ import annotations

import os
import time
from typing import Any

from .._args import path_argument
from .._dataclass import dataclass, field
from ..errors import ConfigurationError, FormatError, StorageError
from ..storage.types import StorageURL
from .entryfiles import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    check_entry_dir,
    dir_bytes,
    file_stamp,
    files_intact,
    is_key,
    packed_weights_file,
    read_manifest,
)
from .lock import KeyLock
from .private import check_private

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "CacheEntry",
    "CacheLayout",
    "PRIVATE_DIR_MODE",
    "check_private",
    "file_stamp",
    "files_intact",
    "list_entries",
    "load_entry",
    "packed_weights_file",
    "read_manifest",
    "touch",
]


#: The mode the cache creates its directories with (the umask may only remove bits).
PRIVATE_DIR_MODE = 0o755


def make_directory(path: str, what: str) -> None:
    """Create directory ``path`` (``0o755``, its parents too) where missing; a failure
    classified as the writers classify theirs (:func:`ptestore._oserror.local_error`):
    access refused, a component that is a file (ENOTDIR) or a name longer than the file
    system takes (its limit named) is bad input (exit 2), as is a directory whose file
    system takes no new one (``/proc``, ``/sys``: ENOENT under a directory that is
    there); a full disk or an I/O error a :class:`~ptestore.errors.StorageError`."""
    try:
        os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    except FileExistsError as exc:
        raise ConfigurationError(f"{path}: exists and is not a directory") from exc
    except OSError as exc:
        from .._oserror import local_error
        from ..storage.types import strerror

        message = f"{path}: cannot create the {what}: {strerror(exc)}"
        made = exc.filename if isinstance(exc.filename, str) else path  # a parent's mkdir
        parent = os.path.dirname(os.path.normpath(made))
        if isinstance(exc, FileNotFoundError) and os.path.isdir(parent):
            raise ConfigurationError(  # rerunning won't help
                f"{message} (the directory {parent} exists; its file system takes no new "
                "directory there)"
            ) from exc
        raise local_error(exc, message) from exc


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
            make_directory(d, "cache directory")
            check_private(d, "cache directory" if d == self.root else "cache directory's")

    def check(self) -> None:
        """The cache's directories that exist are this user's alone
        (:func:`check_private`), before anything in them is removed: a ``cache
        prune``/``clear`` (or an eviction) of a cache others can write to would follow
        what they planted there (``entries`` a link to another directory)."""
        for d in (self.root, self.entries, self.locks):
            check_private(d, "cache directory" if d == self.root else "cache directory's")

    def make_entry_dir(self, key: str) -> str:
        """Entry ``key``'s directory, created ``0o755`` where missing and checked; a
        failure classified as the cache directory's (:func:`make_directory`: access
        refused, a file in the way, a name too long are bad input, exit 2; a full disk
        a :class:`~ptestore.errors.StorageError` whose ``errno`` is ENOSPC or EDQUOT),
        never a bare ``OSError``."""
        directory = self.entry_dir(key)
        check_entry_dir(directory)  # a link to elsewhere is refused before makedirs
        make_directory(directory, "cache entry's directory")  # as the cache's own
        check_entry_dir(directory)
        return directory

    def remove_empty_entry_dir(self, key: str) -> None:
        """Entry ``key``'s directory removed when it is empty (``rmdir``: one holding
        anything, a link or a file at its path, are left alone): what a failed make
        leaves of a directory it created (:func:`.artifact.hit_or_make`)."""
        try:
            os.rmdir(self.entry_dir(key))
        except OSError:  # not empty (a download to resume), not there, not a directory
            pass

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


def as_read(record: Any) -> Any:
    """A manifest's provenance ``record`` as the trailer it was read from said it: before
    records kept their version (this ptestore), one read from a version 1 or 2 trailer
    was stored saying 3, its content named by its whole SHA-256 (``sha256:``), which a
    version-3 record refuses. Offline such an entry is served (the files it fetched are
    unchanged), and listed, kept by prune and evicted as any ready entry; online it is a
    miss, fetched again once (:func:`.artifact.lookup` reads the manifest as it says)."""
    content = record.get("content") if isinstance(record, dict) else None
    if not isinstance(content, dict) or record.get("version") != 3:
        return record
    if not str(content.get("sha256")).startswith("sha256:"):
        return record
    return {**record, "version": 1 if content.get("chunks") is None else 2}


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
        Provenance.from_dict(as_read(record), path)
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


#: :data:`ptestore.gc.PLAUSIBLE_SINCE` in nanoseconds (a hit does not import gc): a clock
#: that reads earlier has not been set.
_PLAUSIBLE_SINCE_NS = 946_684_800 * 10**9


def touch(path: str) -> None:
    """Record a use of the entry whose manifest is ``path``: its modification time set
    to now, never back (at least its current one and a nanosecond). A hit while the
    clock is behind (a device that booted with 1970, or its build date, before its time
    was set) leaves the entry where its last use put it, never first in line for
    eviction. Never a time that :func:`ptestore.gc.implausible` refuses against the
    clock (before 2000, or more than a day ahead of it: a last use stamped while the
    clock was ahead, which its next hit bumped a nanosecond on and on): the time is then
    left as it is, neither set back nor carried further ahead."""
    now = time.time_ns()
    try:
        stamp = max(now, os.stat(path).st_mtime_ns + 1)
        if stamp != now or now < _PLAUSIBLE_SINCE_NS:  # rare: gc's rule, imported then
            from ..gc import implausible

            if implausible(stamp / 1e9, now / 1e9) is not None:
                return
        os.utime(path, ns=(stamp, stamp))
    except OSError:  # a read-only cache still serves hits; only LRU order suffers
        pass
