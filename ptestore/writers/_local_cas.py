"""Compare-and-swap of local files: the version token and the lock beside the file.

A local file's version token is ``"sha256:<hex>"`` of its bytes. Not its stat identity
``(st_dev, st_ino, st_size, st_mtime_ns)``: every publish renames a new inode into place,
the old inode number is free for reuse at once, and file times have the kernel's coarse
clock (a few milliseconds), so two same-size versions written in a row can show the same
identity and a stale writer would replace the newer one (a lost update). Equal hashes mean
equal bytes, and a read-modify-write made from the same bytes is as valid as one made
from the "same version". The cost is one read of the destination per conditional publish
(what compare-and-swap is for: indexes, manifests, counters, small records).

``publish(mode="if-match")`` takes an exclusive ``flock`` on ``.<name>.ptestore.lock``
in the destination's directory (created on first use and left there: removing a lock file
others may hold is itself a race), hashes the destination under it, and renames only if
the hash is the one expected. Every conditional publisher of the file takes the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator

from ..errors import local_error
from ..storage.types import strerror
from .base import Versioned

__all__ = ["LOCK_SUFFIX", "file_version", "lock_path", "read_file_versioned", "version_lock"]

#: The lock file of ``DIR/NAME`` is ``DIR/.NAME.ptestore.lock``.
LOCK_SUFFIX = ".ptestore.lock"
_PIECE = 1 << 20


def lock_path(path: str) -> str:
    """The lock file beside ``path``."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name[:200]}{LOCK_SUFFIX}")


def _token(hexdigest: str) -> str:
    return "sha256:" + hexdigest


def file_version(path: str) -> str | None:
    """The version token of the file at ``path`` (None: no file)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while piece := f.read(_PIECE):
                digest.update(piece)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot read its version: {strerror(exc)}") from exc
    return _token(digest.hexdigest())


def read_file_versioned(path: str) -> Versioned:
    """The bytes of the file at ``path`` and their version token, from one open file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Versioned(b"", None)
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot read: {strerror(exc)}") from exc
    return Versioned(data, _token(hashlib.sha256(data).hexdigest()))


@contextlib.contextmanager
def version_lock(path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``path``'s conditional publishes."""
    where = lock_path(path)
    try:
        fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise local_error(
            exc, f"{path}: cannot open the lock file {where}: {strerror(exc)}"
        ) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise local_error(exc, f"{path}: cannot lock {where} (flock): {strerror(exc)}") from exc
        yield
    finally:
        os.close(fd)  # releases the flock
