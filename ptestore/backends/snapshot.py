"""What the installed distributions said, remembered between processes while they stay
as they were: the ``ptestore.backends`` entry points and the distribution version of a
backend's top-level package, so that an ``ensure`` cache hit from a fresh interpreter
does not import :mod:`importlib.metadata` (email, zipfile, csv: about 35 ms) nor read
every installed distribution's metadata (tens of ms more).

A snapshot is a JSON file (``CACHE_DIR/backends.json`` for :func:`ptestore.ensure`)
holding the facts and the **stamp** of the installation they were read from:
the interpreter, every ``sys.path`` entry (the ``stat`` of one that is not a
directory, such as a zip file), and every distribution's metadata directory found in
those entries (``*.dist-info``, ``*.egg-info``: its name and ``stat``) with the
``stat`` (modification time, size, inode) of the metadata files ``importlib.metadata``
reads for these facts (``METADATA`` or ``PKG-INFO``, ``entry_points.txt``,
``top_level.txt``, and ``RECORD``, ``SOURCES.txt`` or ``installed-files.txt``).
Installing, removing or upgrading a distribution, or editing its metadata in place,
changes the stamp, and a snapshot whose stamp differs from the current one is ignored:
the facts are read again through :mod:`importlib.metadata` and the snapshot rewritten.
Two rules keep that safe:

- the stamp is taken *before* any fact is read, so facts read after a change are
  stored with the older stamp and never trusted;
- no stamp is trusted or stored while anything in it was modified in the last
  :data:`RACY_SECONDS` (a change within the same timestamp tick as the stamp could go
  unseen), nor when a meta-path finder other than the standard one (or the
  ``importlib_metadata`` backport's, which looks in the same places) provides
  distributions (its metadata is not on disk where the stamp looks).

Only metadata is remembered: a backend's module is imported and its ``version`` asked
on every call, so a version declared in code (or computed by a property) is always the
current one. :func:`using` activates a snapshot for a block of code in one thread;
outside such a block nothing here has any effect.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["RACY_SECONDS", "Snapshot", "active", "environment_stamp", "using"]

#: Metadata modified this recently makes the stamp untrusted.
RACY_SECONDS = 2.0
#: The files of a metadata directory that ``importlib.metadata`` reads for the facts kept
#: (version, entry points, which top-level packages a distribution provides).
DIST_INFO_FILES = ("METADATA", "entry_points.txt", "top_level.txt", "RECORD")
EGG_INFO_FILES = (
    "PKG-INFO",
    "entry_points.txt",
    "top_level.txt",
    "SOURCES.txt",
    "installed-files.txt",
)
FORMAT = "ptestore.backends-snapshot/2"  # /2: every declaration of an entry-point name
#: One entry point: its ``module:attr`` value, the version and the name of the
#: distribution declaring it.
Declared = tuple[str, str | None, str | None]
#: A snapshot file larger than this is not one of ours.
MAX_BYTES = 1 << 22


def _is_metadata(name: str) -> bool:
    low = name.lower()
    return low.endswith((".dist-info", ".egg-info")) or low == "egg-info"


def _reads_sys_path(finder: object) -> bool:
    """Whether ``finder`` is the ``importlib_metadata`` backport's own finder (installed
    in ``sys.meta_path`` by importing the backport, as dask does), which finds the same
    metadata directories on ``sys.path`` as the standard one."""
    cls = type(finder)
    return cls.__module__.split(".")[0] == "importlib_metadata" and (
        cls.__name__ == "MetadataPathFinder"
    )


def environment_stamp() -> list[Any] | None:
    """The stamp of the installed distributions as :mod:`importlib.metadata` would find
    them now, or None when it cannot be trusted (see the module docstring)."""
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        if (
            finder is not PathFinder
            and hasattr(finder, "find_distributions")
            and not _reads_sys_path(finder)
        ):
            return None
    newest = 0

    def stat(path: str) -> list[int] | None:
        nonlocal newest
        try:
            st = os.stat(path)
        except OSError:
            return None
        newest = max(newest, st.st_mtime_ns)
        return [st.st_mtime_ns, st.st_size, st.st_ino]

    stamp: list[Any] = [sys.executable, sys.version]
    for entry in sys.path:
        root = entry or "."
        try:
            names = sorted(n for n in os.listdir(root) if _is_metadata(n))
        except OSError:  # not a directory: a zip file's stat covers its content
            stamp.append([entry, stat(root)])
            continue
        # A directory: the names of its metadata directories, not its own mtime (which
        # any file written beside them changes).
        stamp.append([entry, "directory"])
        for name in names:
            path = os.path.join(root, name)
            item: list[Any] = [name, stat(path)]
            # one stat per file importlib.metadata may read (None: absent, or an
            # .egg-info that is a file itself, whose own stat covers it)
            files = DIST_INFO_FILES if name.lower().endswith(".dist-info") else EGG_INFO_FILES
            item += [stat(os.path.join(path, f)) for f in files]
            stamp.append(item)
    if newest > time.time_ns() - int(RACY_SECONDS * 1e9):
        return None
    return stamp


class Snapshot:
    """The facts read while it is active, and those of the file it was loaded from."""

    def __init__(self, stamp: list[Any] | None, facts: dict[str, Any] | None = None) -> None:
        self.stamp = stamp
        given = facts or {}
        #: Every entry point of the group ``ptestore.backends``: name -> its declarations
        #: (several when several distributions declare the name), each ``(module:attr
        #: value, version and name of the distribution declaring it)``; None when not read.
        self.entry_points: dict[str, list[Declared]] | None = None
        if given.get("entry_points") is not None:
            self.entry_points = {
                k: [(d[0], d[1], d[2]) for d in v] for k, v in given["entry_points"].items()
            }
        #: top-level package -> the version of the distribution providing it.
        self.versions: dict[str, str] = dict(given.get("versions") or {})
        self.changed = False

    def learn_entry_points(self, values: dict[str, list[Declared]]) -> None:
        if self.entry_points != values:
            self.entry_points = dict(values)
            self.changed = True

    def learn_version(self, top: str, version: str) -> None:
        if self.versions.get(top) != version:
            self.versions[top] = version
            self.changed = True

    @classmethod
    def load(cls, path: str) -> Snapshot:
        """The snapshot at ``path`` if its stamp is the current one; else an empty one
        (with the current stamp, or None when the stamp cannot be trusted)."""
        import json  # only where a snapshot is kept (ensure): not at every import

        stamp = environment_stamp()
        if stamp is None:
            return cls(None)
        try:
            data = json.loads(raw) if (raw := _read_private(path)) is not None else None
        except ValueError:
            data = None
        if (
            isinstance(data, dict)
            and data.get("format") == FORMAT
            and data.get("stamp") == stamp
            and isinstance(data.get("facts"), dict)
        ):
            facts = data["facts"]
            eps, versions = facts.get("entry_points"), facts.get("versions")
            if (eps is None or _entry_map(eps)) and (versions is None or _str_map(versions)):
                return cls(stamp, facts)
        snap = cls(stamp)
        snap.changed = True  # nothing usable on disk: write what this process reads
        return snap

    def save(self, path: str) -> None:
        """Write the snapshot atomically (best effort: it only saves time)."""
        if self.stamp is None or not self.changed:
            return
        import json

        from ..storage.atomic import put_bytes

        facts = {"entry_points": self.entry_points, "versions": self.versions}
        data = json.dumps({"format": FORMAT, "stamp": self.stamp, "facts": facts}).encode()
        # Not durable: a snapshot lost to a crash is read again from the installation.
        # Without group or others' write, whatever the umask: the cache is this user's
        # alone, and an entry point named here is imported (see :func:`_read_private`).
        with contextlib.suppress(OSError):  # StorageError is one
            put_bytes(path, data, durable=False, permissions=0o644)


def _read_private(path: str) -> bytes | None:
    """The snapshot's bytes if the file at ``path`` is this user's alone (a regular file
    owned by this user or root, not writable by group or others, as the cache's manifests
    must be) and at most :data:`MAX_BYTES`; else None (read from the installation again,
    and the file replaced by one of this user's). An entry point it names is imported:
    one planted by another user through a group-writable file (a cache made under umask
    002 before the snapshot was written ``0o644``) must not be."""
    import os
    import stat

    from .._io import read_bounded

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        shared = stat.S_IWGRP | stat.S_IWOTH
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid not in (os.geteuid(), 0)
            or st.st_mode & shared
            or st.st_size > MAX_BYTES
        ):
            return None
        with open(fd, "rb", closefd=False) as f:
            raw = read_bounded(f, MAX_BYTES)
        return raw if len(raw) <= MAX_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _entry_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str)
        and isinstance(v, list)
        and v
        and all(
            isinstance(d, list)
            and len(d) == 3
            and isinstance(d[0], str)
            and all(x is None or isinstance(x, str) for x in d[1:])
            for d in v
        )
        for k, v in value.items()
    )


def _str_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


_local = threading.local()


def active() -> Snapshot | None:
    """The snapshot active in this thread (inside :func:`using`), else None."""
    snap: Snapshot | None = getattr(_local, "snapshot", None)
    return snap


@contextlib.contextmanager
def using(path: str) -> Iterator[Snapshot]:
    """Within the block (in this thread), the registry and
    :func:`~ptestore.backends.compat.distribution_version` answer from the snapshot at
    ``path`` when it is current, and record what they read; the snapshot is written
    back when the block ends without an exception."""
    snap = Snapshot.load(path)
    previous = active()
    _local.snapshot = snap
    try:
        yield snap
    finally:
        _local.snapshot = previous
    snap.save(path)
