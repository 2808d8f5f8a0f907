"""Lock files of keys that have no entry (``cache prune``, ``cache clear``).

An ``ensure`` that fails before its entry exists (a backend's error, a full disk, an
in-place run refused) leaves ``locks/KEY.lock`` and no ``entries/KEY``. Such a lock file
is removed under its exclusive lock, taken without waiting (a running ``ensure`` holds
it: kept), once the entry is seen missing under that lock. A process that opened the
same lock file before it was removed and then gets its ``flock`` sees that the path names
no file, or another one, and locks the file there instead (:class:`.lock.KeyLock`), so
removing it never lets two processes both believe they hold the key.
"""

from __future__ import annotations

import os

from ..errors import StorageError
from .entryfiles import is_key
from .lock import KeyLock

__all__ = ["remove_orphan_locks"]

_SUFFIX = ".lock"


def remove_orphan_locks(entries: str, locks: str) -> list[str]:
    """Remove the lock files under ``locks`` whose key has no directory under
    ``entries`` and that no process holds; returns their keys."""
    try:
        names = sorted(os.listdir(locks))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        key = name[: -len(_SUFFIX)]
        if not name.endswith(_SUFFIX) or not is_key(key):
            continue
        if os.path.lexists(os.path.join(entries, key)):
            continue
        lock = KeyLock(os.path.join(locks, name), blocking=False)
        try:
            if not lock.acquire():
                continue  # held: an ensure of this key is running
        except StorageError:  # not a lock file we can take (a link, unreadable): left alone
            continue
        if os.path.lexists(os.path.join(entries, key)):  # made before we locked it
            lock.release()
            continue
        lock.remove()
        removed.append(key)
    return removed
