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
others may hold is itself a race; never opened through a symbolic link,
:func:`ptestore.storage.flock.locked`), hashes the destination under it, and renames only
if the hash is the one expected (:func:`swap`). Every conditional publisher of the file
takes the same lock. A destination that is a symbolic link is refused: its hash is the
linked file's, its lock would be the link's (not the one publishers through the file's
own path take) and the rename would replace the link, so two publishers of one version,
one through each name, would both succeed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator

from .._io import read_bounded
from .._oserror import local_error
from ..errors import ConfigurationError
from ..storage.flock import locked
from ..storage.regular import file_kind
from ..storage.types import strerror
from .base import Versioned, version_conflict

__all__ = [
    "LOCK_SUFFIX",
    "file_version",
    "lock_path",
    "read_file_versioned",
    "swap",
    "version_lock",
]

#: The lock file of ``DIR/NAME`` is ``DIR/.NAME.ptestore.lock``.
LOCK_SUFFIX = ".ptestore.lock"
_PIECE = 1 << 20
#: The bytes of the destination's name a lock file's name keeps (255 - 1 - 14).
_LOCK_NAME_BYTES = 255 - 1 - len(LOCK_SUFFIX)


def lock_path(path: str) -> str:
    """The lock file beside ``path``: ``.NAME.ptestore.lock``, NAME cut to 200 characters
    and then to the 240 bytes that fit NAME_MAX (255) with the dot and the suffix, at a
    character (a name's characters say nothing of its bytes: ``é`` takes two). Every name
    short enough for the cut by characters alone keeps the lock file it had."""
    from .._text import head_bytes

    directory, name = os.path.split(path)
    return os.path.join(directory, f".{head_bytes(name[:200], _LOCK_NAME_BYTES)}{LOCK_SUFFIX}")


def _token(hexdigest: str) -> str:
    return "sha256:" + hexdigest


def file_version(path: str) -> str | None:
    """The version token of the file at ``path`` (None: no file); anything but a regular
    file is refused as :func:`read_file_versioned` refuses it (a FIFO was waited on)."""
    digest = hashlib.sha256()
    try:
        with os.fdopen(_open_regular(path), "rb") as f:
            while piece := f.read(_PIECE):
                digest.update(piece)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot read its version: {strerror(exc)}") from exc
    return _token(digest.hexdigest())


def read_file_versioned(path: str, max_bytes: int | None = None) -> Versioned:
    """The bytes of the file at ``path`` and their version token, from one open file;
    a file larger than ``max_bytes`` is hashed a piece at a time, never held (its
    ``oversize``); what is read takes the file's size, not ``max_bytes``
    (:func:`~ptestore._io.read_bounded`). Anything but a regular file (a FIFO, a
    device, a directory) is a :class:`~ptestore.errors.ConfigurationError`, never
    waited on nor read: opened without blocking, then looked at."""
    try:
        with os.fdopen(_open_regular(path), "rb") as f:
            if max_bytes is None:
                data = f.read()
            else:
                data = read_bounded(f, max_bytes)  # as large as the file, not the bound
                if len(data) > max_bytes:
                    digest = hashlib.sha256(data)
                    size = len(data)
                    while piece := f.read(_PIECE):
                        digest.update(piece)
                        size += len(piece)
                    return Versioned(b"", _token(digest.hexdigest()), size)
    except FileNotFoundError:
        return Versioned(b"", None)
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot read: {strerror(exc)}") from exc
    return Versioned(data, _token(hashlib.sha256(data).hexdigest()))


def _open_regular(path: str) -> int:
    """A descriptor of the regular file at ``path`` (followed through a link), opened
    without blocking: a FIFO would wait for a writer, a device answer forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a socket (or a FIFO/device without a peer)
            raise
        try:
            kind = file_kind(os.stat(path).st_mode)
        except OSError:
            kind = "not a regular file"
        raise _not_regular(path, kind) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, file_kind(st.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(path: str, kind: str) -> ConfigurationError:
    return ConfigurationError(f"{path}: is {kind}, not a regular file; refusing to read it")


@contextlib.contextmanager
def version_lock(path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``path``'s conditional publishes."""
    where = lock_path(path)
    held = contextlib.ExitStack()
    try:  # 0o666 less the umask: publishers of other users in a shared group lock it too
        held.enter_context(locked(where, mode=0o666))
    except OSError as exc:
        why = (
            "it is a symbolic link, never followed (remove it)"
            if exc.errno == errno.ELOOP
            else strerror(exc)
        )
        raise local_error(exc, f"{path}: cannot lock {where}: {why}") from exc
    with held:
        yield


def swap(
    path: str, expected: str, commit_point: Callable[[], None], replace: Callable[[], None]
) -> None:
    """Under ``path``'s lock: refuse a symbolic link, compare the file's version with
    ``expected`` (:class:`~ptestore.errors.PreconditionFailed` when it differs), then
    ``commit_point()`` and ``replace()`` (the rename). An interrupt before the commit
    point (waiting for the lock, hashing) publishes nothing."""
    with version_lock(path):
        try:
            link = stat.S_ISLNK(os.lstat(path).st_mode)
        except FileNotFoundError:
            link = False
        except OSError as exc:
            raise local_error(exc, f"{path}: cannot stat it: {strerror(exc)}") from exc
        if link:
            raise ConfigurationError(
                f"{path}: is a symbolic link (to {os.path.realpath(path)}); "
                "publish(mode='if-match') compares and replaces the file at the path it is "
                "given: publish to the file's own path instead"
            )
        found = file_version(path)
        if found != expected:
            raise version_conflict(path, expected, found)
        commit_point()
        replace()
