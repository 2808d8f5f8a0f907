"""The download files of :mod:`.fetch`: ``DEST.part`` and ``DEST.part.json`` in the
destination's own directory, opened without following links (``O_NOFOLLOW``; a new
``.part`` with ``O_EXCL``), and resumed only when the ``.part`` is this user's own
regular file with one name; what pins a download to one version of its object; and
whether the destination has room for it at all (:func:`check_space`, before the first
request; :func:`check_room`, once the clones of its bases are in)."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .._oserror import local_error
from ..errors import (
    ConfigurationError,
    PermissionDenied,
    PteStoreError,
    StorageError,
)
from ..storage.loaders import DataLoader, LocalFileLoader
from ..storage.types import absolute_path

__all__ = [
    "check_room",
    "check_space",
    "clones_from",
    "discard_part",
    "download_error",
    "local_writes",
    "open_part",
    "own_file",
    "pinned_version",
    "read_state",
    "refuse_link",
    "save_state",
]


def refuse_link(path: str) -> None:
    """Refuse a symbolic link, or anything but a regular file, at ``path`` (one of the
    download's own files): fetch never writes through one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot stat: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise PermissionDenied(
            f"{path}: is a symbolic link (to {os.readlink(path)!r}); fetch does not write "
            "through links at its download files: remove it and fetch again"
        )
    if not stat.S_ISREG(st.st_mode):
        raise PermissionDenied(f"{path}: is not a regular file; remove it and fetch again")


def own_file(fd: int, path: str) -> None:
    """The ``.part`` opened as ``fd`` is ours alone: a regular file of this user with no
    other name (a hard link planted there would write into another file)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        raise PermissionDenied(
            f"{path}: owner uid {st.st_uid}, {st.st_nlink} link(s), mode {st.st_mode:o}: "
            f"fetch resumes only its own file (a regular file of uid {os.geteuid()} with "
            "one name): remove it and fetch again"
        )


def open_part(part: str, resume: bool) -> int:
    """The ``.part``'s descriptor: the existing one to resume (``O_NOFOLLOW``, checked
    to be ours), else a new file (``O_EXCL``: never through a name someone planted),
    ``0600`` while it is downloaded: it takes its mode when it is published (fetch's
    ``_publish``: the replaced file's, as a writer's staging file does)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if resume:
            fd = os.open(part, flags)
            try:
                own_file(fd, part)
            except BaseException:
                os.close(fd)
                raise
            return fd
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass
        return os.open(part, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except PermissionDenied:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(part)
        raise local_error(exc, f"{part}: cannot open the download: {exc.strerror}") from exc


def read_state(meta_path: str) -> Any:
    try:
        fd = os.open(meta_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None


def discard_part(dest: str) -> None:
    """Remove ``DEST.part`` and ``DEST.part.json`` (what is there of them)."""
    for name in (dest + ".part", dest + ".part.json"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def pinned_version(url: str, loader: DataLoader) -> dict[str, Any]:
    """What pins a download to one version of the object: the ETag and version id of a
    remote object; the device, inode and ``mtime_ns`` of a local file."""
    if isinstance(loader, LocalFileLoader):
        st = os.fstat(loader.fileno())
        return {"dev": st.st_dev, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
    return {
        "etag": getattr(loader, "etag", None),
        "version_id": getattr(loader, "version_id", None),
    }


def _existing(path: str) -> str:
    """``path``'s nearest ancestor that exists (a fetch makes DEST's directory)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _clones(directory: str, base: str) -> bool:
    """A file system that shares ``base``'s extents with a new file in ``directory``
    (XFS, btrfs: a reflink probe between two unnamed files there; ext4, tmpfs: no);
    False when ``base`` is not a regular file."""
    from ..writers._clone import probe_clone_block_size

    # O_NONBLOCK: a FIFO (or a device) there is never waited on, and not a base.
    try:
        src = os.open(base, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    if not stat.S_ISREG(os.fstat(src).st_mode):
        os.close(src)
        return False
    try:
        dst = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        os.close(src)
        return False
    try:
        return probe_clone_block_size(directory, src, dst) is not None
    finally:
        os.close(src)
        os.close(dst)


def clones_from(directory: str, bases: Sequence[str]) -> bool:
    """One of ``bases`` is on ``directory``'s file system and can be cloned there (its
    chunks then take no new space: :func:`check_space` counts only what they cannot
    give, and the download checks the rest once they are in, :func:`check_room`)."""
    try:
        device = os.stat(_existing(directory)).st_dev
    except OSError:
        return False
    for b in bases:
        try:
            if os.stat(b).st_dev == device:
                return _clones(_existing(directory), b)
        except OSError:
            continue
    return False


def _held(part: str, size: int) -> int:
    """The bytes of the download a ``.part`` already holds: its allocated blocks, not its
    length (a chunked download makes its ``.part`` full-size and sparse at once)."""
    try:
        st = os.lstat(part)
    except OSError:
        return 0
    return min(size, st.st_size, st.st_blocks * 512)


def check_space(
    files: Sequence[tuple[dict[str, Any], str]],
    bases: Sequence[str] | Mapping[str, Sequence[str]] = (),
) -> None:
    """Refuse, before the first download request, a fetch whose destination's file
    system has no room for it: the files' sizes (as the index or their trailer names
    them) less the blocks their ``.part`` already holds (allocated, not its length: a
    chunked ``.part`` is sparse), against the blocks free to this user (``statvfs``),
    per file system: a :class:`~ptestore.errors.StorageError` ``errno`` ENOSPC naming
    the files, the directory, the bytes needed and free. ``bases``: the files' bases
    (the same for every file, or by file path). Where a base is on the file system and
    can be cloned there (a reflink probe: XFS, btrfs) a clone takes no new space: a file
    counts only what its largest such base cannot give (the bytes still downloaded are
    checked again once the clones are in, :func:`check_room`); where it cannot clone
    (ext4, tmpfs) every chunk taken from a base is a copy and the whole size counts. The
    destination's old file counts as used, since it is replaced only once the download
    is checked."""
    wanted: dict[int, tuple[str, int, list[str]]] = {}  # device -> (directory, bytes, files)
    for want, path in files:
        size = want.get("size")
        if not isinstance(size, int) or size <= 0:
            continue
        directory = _existing(os.path.dirname(absolute_path(path)))
        device = os.stat(directory).st_dev
        own = bases.get(path, ()) if isinstance(bases, Mapping) else bases
        clonable = 0
        if clones_from(directory, own):
            sizes = [_size_on(b, device) for b in own]
            clonable = max(sizes, default=0)
        have = _held(path + ".part", size)
        where, total, names = wanted.get(device, (directory, 0, []))
        wanted[device] = (where, total + max(0, size - have - clonable), [*names, path])
    for directory, needed, names in wanted.values():
        _refuse_short(", ".join(names), directory, needed, "needed", "nothing was downloaded")


def _size_on(path: str, device: int) -> int:
    """``path``'s size when it is on ``device``, else 0."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if st.st_dev == device else 0


def check_room(dest: str, needed: int, cloned: int) -> None:
    """Refuse to download the ``needed`` bytes a download to ``dest`` still lacks once
    its bases' clones are in (``cloned`` bytes, which take no new space) when its file
    system has not that much free: a :class:`~ptestore.errors.StorageError` ENOSPC
    naming the destination, the bytes to download and free, before the store is asked
    for them (what is in the ``.part`` is kept for a fetch run again)."""
    directory = os.path.dirname(absolute_path(dest))
    after = f"{cloned} bytes cloned from the bases take none; nothing more was downloaded"
    _refuse_short(dest, directory, needed, "to download", after)


def _refuse_short(what: str, directory: str, needed: int, kind: str, after: str) -> None:
    """A :class:`~ptestore.errors.StorageError` ENOSPC naming ``what``, the ``needed``
    bytes (``kind``: needed, to download) and the free ones when ``directory``'s file
    system has fewer free for this user; ``after``: what became of the download."""
    from .._io import free_bytes

    free = free_bytes(directory)
    if free is not None and needed > free:
        raise StorageError(
            f"{what}: not enough free space to fetch: {needed} bytes {kind}, {free} free in "
            f"{directory} ({os.strerror(errno.ENOSPC)}); {after}",
            errno=errno.ENOSPC,
        )


def download_error(
    exc: OSError, dest: str, url: str, failed: str
) -> StorageError | ConfigurationError:
    """A failure of the local file system while the download of ``url`` to ``dest``
    writes ``failed`` (its ``.part`` or ``.part.json``: a full disk, an I/O error, a
    clone the kernel refuses) as a :class:`~ptestore.errors.StorageError` naming the
    destination first, then the ``errno`` and the file that failed
    (:class:`~ptestore.errors.PermissionDenied` for access, as
    :func:`~ptestore._oserror.local_error` maps it), never a raw ``OSError``:
    the CLI's exit codes and ``ensure``'s offline fallback see it as what it is, and the
    message does not depend on which of the download's threads hit it first."""
    number = exc.errno or 0
    code = errno.errorcode.get(number, str(exc.errno))
    reason = exc.strerror or (os.strerror(number) if number else str(exc))
    return local_error(
        exc,
        f"{dest}: the download of {url} stopped: {reason} ({code}, in {failed}); a fetch "
        "run again resumes it",
    )


@contextmanager
def local_writes(dest: str, url: str, failed: str) -> Iterator[None]:
    """:func:`download_error` for what the block raises (writing ``failed``)."""
    try:
        yield
    except PteStoreError:
        raise
    except OSError as exc:
        raise download_error(exc, dest, url, failed) from exc


def save_state(meta_path: str, data: bytes, dest: str, url: str) -> None:
    """Write ``DEST.part.json`` (atomically); a failure (``put_bytes``'s
    :class:`~ptestore.errors.StorageError` too) is :func:`download_error`."""
    from ..storage.atomic import put_bytes

    try:
        put_bytes(meta_path, data)
    except OSError as exc:
        raise download_error(exc, dest, url, meta_path) from exc
