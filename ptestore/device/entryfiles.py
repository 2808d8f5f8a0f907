"""The files of a cache entry as the cache reads and checks them: the manifest (read
without blocking and never through a link), the stamps of the entry's files, which names
under ``entries/`` are entries at all, and what an entry's directory holds.

An entry is a real directory (never a symbolic link) whose name is a key (32 lowercase
hex digits, :func:`~ptestore.device.keys.entry_key`); anything else under ``entries/``
(a stray file, a link to elsewhere) is not an entry: listed by nothing, never cleaned or
removed through. :mod:`.cache` re-exports what it always offered from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from typing import Any

from .._io import read_bounded
from ..errors import FormatError, PermissionDenied, StorageError
from ..storage.regular import NotRegular, open_regular
from .private import SHARED_WRITE, check_private

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "check_entry_dir",
    "clean_entry_locked",
    "dir_bytes",
    "entry_dir_fd",
    "entry_files",
    "file_stamp",
    "files_intact",
    "free_stale_locked",
    "freed_remake_failed",
    "freed_since",
    "is_key",
    "packed_weights_file",
    "read_manifest",
    "read_regular",
    "remove_foreign",
]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "ptestore.cache-entry"
MANIFEST_VERSION = 1
#: A manifest larger than this is not one of ours.
MAX_MANIFEST_BYTES = 1 << 20

_HEX = frozenset("0123456789abcdef")


def is_key(name: str) -> bool:
    """Whether ``name`` has the form of a cache key (32 lowercase hex digits)."""
    return len(name) == 32 and set(name) <= _HEX


def read_regular(path: str, limit: int, what: str, *, private: bool = False) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path``: opened without blocking
    and never through a symbolic link (a FIFO planted there would hang the reader), so
    anything but a regular file is a :class:`StorageError` naming it (``what``: "cache
    manifest"); with ``private``, the file must be this user's alone
    (:func:`check_private`). :class:`FileNotFoundError` when there is none."""
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        raise
    except NotRegular as exc:
        if exc.link:
            raise StorageError(f"{path}: cannot read the {what}: it is a symbolic link") from exc
        raise StorageError(f"{path}: the {what} is not a regular file ({exc.kind})") from exc
    except OSError as exc:
        raise StorageError(f"{path}: cannot read the {what}: {exc.strerror}") from exc
    try:
        if private:
            check_private(path, f"{what}", st)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return read_bounded(f, limit)
    except (PermissionDenied, StorageError):
        raise
    except OSError as exc:
        raise StorageError(f"{path}: cannot read the {what}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def read_manifest(path: str, *, private: bool = False) -> dict[str, Any] | None:
    """The manifest at ``path``; None when there is none. One ``open`` (non-blocking,
    not through a link), one ``fstat`` and one read (with ``private``, the manifest must
    be this user's alone: :func:`check_private`).

    Raises :class:`FormatError` for a file that is not a cache manifest (JSON nested too
    deeply to read included), :class:`StorageError` for one that cannot be read or is not
    a regular file."""
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES, "cache entry's manifest", private=private)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise FormatError(path, "manifest size", len(raw), f"at most {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(raw)
    except RecursionError as exc:  # "[[[[..." under the size cap
        raise FormatError(
            path, "manifest", raw[:40], "JSON (it is nested too deeply to read)"
        ) from exc
    except ValueError as exc:
        raise FormatError(path, "manifest", raw[:40], f"JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise FormatError(path, "manifest format", got, repr(MANIFEST_FORMAT))
    if isinstance(data.get("version"), bool) or data.get("version") != MANIFEST_VERSION:
        raise FormatError(path, "manifest version", data.get("version"), str(MANIFEST_VERSION))
    return data


def check_entry_dir(directory: str) -> None:
    """Refuse an entry path that is not a real directory (a symbolic link to elsewhere,
    a file): the cache would read, clean and remove through it. Then
    :func:`check_private`. A missing path is not checked."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as exc:  # classified as make_entry_dir's (a name too long: exit 2)
        from .._oserror import local_error
        from ..storage.types import strerror

        message = f"{directory}: cannot stat the cache entry: {strerror(exc)}"
        raise local_error(exc, message) from exc
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else stat.filemode(st.st_mode)
        raise PermissionDenied(
            f"{directory}: the cache entry is {kind}, not a directory: ensure would read, "
            "clean and remove files through it; ptestore uses only entry directories it "
            f"made. Fix: rm {directory} (or use another --cache-dir)"
        )
    check_private(directory, "cache entry", st)


@contextlib.contextmanager
def entry_dir_fd(directory: str) -> Iterator[int | None]:
    """A descriptor of the entry's directory, opened never through a link (None when it
    is missing or not a real directory: not an entry); its names are then worked on
    relative to it (``dir_fd=``), so nothing outside the entry is touched."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # missing, a link (ELOOP), a file (ENOTDIR): not an entry
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


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


#: What manifests recorded of a file before ``ctime_ns``.
_OLD_STAMP = ("size", "ino", "mtime_ns")


def files_intact(directory: str, manifest: dict[str, Any]) -> bool:
    """Whether every file the manifest names is there as recorded (one ``lstat`` each: a
    regular file, not a link), owned by this user (or root) and not writable by group or
    others. A manifest written before ``ctime_ns`` was recorded is compared without it."""
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
            st = os.lstat(os.path.join(directory, name))
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_uid not in (me, 0) or st.st_mode & SHARED_WRITE:
            return False
        now = _stamp_of(st)
        keys = ("size", "ino", "mtime_ns", "ctime_ns") if "ctime_ns" in rec else _OLD_STAMP
        if any(now[k] != rec.get(k) for k in keys):
            return False
    return True


def _regular_files(directory: str) -> Iterator[os.stat_result]:
    """The ``lstat`` of each regular file under ``directory`` (subdirectories included,
    links not followed), a file with several names once per name."""
    for root, _dirs, files in os.walk(directory, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield st


def dir_bytes(directory: str) -> int:
    """The bytes of the regular files under ``directory`` (subdirectories included, links
    not followed): what an entry holds against ``max_bytes``, what ``cache ls`` and
    ``remaining`` count. Their apparent sizes (``st_size``, as ``ls -l`` shows them): a
    budget on what the models weigh, the same on every file system; a sparse file (an
    interrupted download's ``.part``) counts its whole size, what it may come to hold."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return 0
    except OSError:
        return 0
    return sum(st.st_size for st in _regular_files(directory))


#: A file as :func:`entry_files` finds it: ``(st_dev, st_ino)``.
Inode = tuple[int, int]


#: What :func:`entry_files` knows of a file: its apparent size, the bytes it has
#: allocated (``st_blocks * 512``), its links (``st_nlink``), its paths under the
#: directory.
FileInfo = tuple[int, int, int, int]


def entry_files(directory: str) -> dict[Inode, FileInfo]:
    """The regular files under ``directory`` (links not followed), each file once:
    ``(st_dev, st_ino) -> (size, allocated, links, paths under directory)``; what
    :func:`freed_since` compares after a removal."""
    out: dict[Inode, FileInfo] = {}
    for st in _regular_files(directory):
        known = out.get((st.st_dev, st.st_ino))
        paths = 1 if known is None else known[3] + 1
        out[(st.st_dev, st.st_ino)] = (st.st_size, st.st_blocks * 512, st.st_nlink, paths)
    return out


def freed_since(before: dict[Inode, FileInfo], after: dict[Inode, FileInfo]) -> int:
    """The bytes a removal freed on the file system, of the files ``before`` found in a
    directory (:func:`entry_files`), ``after`` what is left there: the blocks each file
    held (``st_blocks * 512``: a sparse file frees what it held, not its size), each file
    once, and only one whose every link was under the directory and is gone now (a file
    also linked elsewhere frees nothing; one that could not be removed neither)."""
    left = set(after)
    return sum(
        allocated
        for inode, (_, allocated, links, paths) in before.items()
        if inode not in left and links <= paths
    )


def packed_weights_file(name: str) -> bool:
    """Whether ``name`` is one of the XNNPACK packed-weight files ``ensure(...,
    xnnpack_cache=True)`` keeps beside an entry (:mod:`.packed`)."""
    return name == "xnnpack.json" or (
        name.startswith("xnnpack-")
        and name.endswith((".xpwc", ".xpwc.json", ".xpwc.lock", ".refused.json"))
    )


def clean_entry_locked(
    directory: str,
    manifest: dict[str, Any] | None,
    *,
    keep_packed: bool = False,
) -> int:
    """Remove files of the entry in ``directory`` that its manifest does not name
    (staging files of a run that died, the work directory of an XNNPACK maker that was
    killed; the caller holds the key exclusively, so no run is writing them);
    ``keep_packed``: not the entry's XNNPACK packed-weight files (an entry made again
    loses them: they were bound to the files it replaces). Only within the entry's real
    directory (never through a link). Returns the bytes freed (:func:`freed_since`)."""
    keep = {MANIFEST}
    if manifest is not None and isinstance(manifest.get("files"), dict):
        keep |= {
            r["name"]
            for r in manifest["files"].values()
            if isinstance(r, dict) and isinstance(r.get("name"), str)
        }
    with entry_dir_fd(directory) as fd:
        if fd is None:
            return 0
        before = entry_files(directory)
        for name in os.listdir(fd):
            if name in keep or (keep_packed and packed_weights_file(name)):
                continue
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    if name.startswith(".xnnpack-"):  # a killed maker's work directory
                        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
                    continue
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    return freed_since(before, entry_files(directory))


def free_stale_locked(directory: str) -> bool:
    """Free the entry in ``directory`` before it is made again (the caller holds its key
    exclusively, and its lookup missed: stale, broken or incomplete): its manifest first
    (a crash meanwhile leaves an incomplete entry, never one naming files that are gone),
    then every file in it (the model and its ``.ptd``, which no call can be served again
    once the entry is made again, its packed-weight files, the leftovers of a run that
    died here: :func:`clean_entry_locked`), so that an update needs room for the new
    copy alone, not for the old and the new side by side. A process handed the old
    paths earlier keeps the file it opened or mapped (an unlink removes a name, not an
    open file). Returns whether there was a manifest to remove (an earlier entry)."""
    with entry_dir_fd(directory) as fd:
        if fd is None:
            return False
        try:
            os.unlink(MANIFEST, dir_fd=fd)
            had = True
        except OSError:  # none, or a directory there: the publish says what fails
            had = False
    clean_entry_locked(directory, None)
    return had


def freed_remake_failed(directory: str) -> None:
    """What a remake that failed left of the entry in ``directory`` whose earlier version
    it freed (:func:`free_stale_locked`: no manifest, no files of it left) removed: the
    leftovers of its run (:func:`clean_entry_locked`), then the directory itself when
    nothing else is in it (``rmdir``). It stayed as an empty "incomplete" entry that
    ``cache ls`` listed until a prune. The caller holds the key exclusively."""
    clean_entry_locked(directory, None)
    with contextlib.suppress(OSError):  # not empty, not there: left
        os.rmdir(directory)


def remove_foreign(directory: str, names: Iterable[str]) -> None:
    """Remove the entry's files ``names`` that are neither this user's nor root's (an
    entry :func:`files_intact` refuses), before the entry is made again: its new files
    must be new ones of this user's, not the old ones replaced in place, which keeps the
    replaced file's owner where the process may (root's does). The caller holds the key
    exclusively; only within the entry's real directory."""
    me = os.geteuid()
    with entry_dir_fd(directory) as fd:
        if fd is None:
            return
        for name in names:
            try:
                if os.lstat(name, dir_fd=fd).st_uid not in (me, 0):
                    os.unlink(name, dir_fd=fd)
            except OSError:  # missing, or left: the make says what fails
                continue
