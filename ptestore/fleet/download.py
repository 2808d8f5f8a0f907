"""The download files of :mod:`.fetch`: ``DEST.part`` and ``DEST.part.json`` in the
destination's own directory, opened without following links (``O_NOFOLLOW``; a new
``.part`` with ``O_EXCL``), and resumed only when the ``.part`` is this user's own
regular file with one name; and what pins a download to one version of its object."""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from ..errors import PermissionDenied, local_error
from ..storage.loaders import DataLoader, LocalFileLoader

__all__ = ["open_part", "own_file", "pinned_version", "read_state", "refuse_link"]


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
    to be ours), else a new file (``O_EXCL``: never through a name someone planted)."""
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
        return os.open(part, flags | os.O_CREAT | os.O_EXCL, 0o666)
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
