"""A staging file (descriptor and path) shared by the local and the generic writer, and
what a local file renamed over another takes from it (:func:`take_over`: the local
writer's publish, ``ensure(in_place=True)``'s staged copy, ``fetch``'s ``.part``)."""

from __future__ import annotations

import os
import stat
import threading

from .._oserror import local_error
from ..errors import StorageError
from ..storage.types import strerror

__all__ = ["FileStaging", "current_umask", "take_over"]

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask (from ``/proc``, else read by setting it, under a lock)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def take_over(fd: int, path: str, new_mode: int | None) -> None:
    """Give the file open at ``fd``, about to be renamed over ``path``, what it keeps of
    the file there (docs/storage.md, the storage-wide rule): a regular file's owner and
    group as far as the process may (as root both:
    :func:`~ptestore.storage.atomic.keep_owner`), then its permission bits, never
    setuid, setgid or sticky (:func:`~ptestore.storage.atomic.replaced_mode`); through
    a symbolic link, the file it names. ``new_mode``: the mode when nothing is there
    (None: left as the file was made). A failure is a
    :class:`~ptestore.errors.StorageError` naming ``path`` and the step."""
    from ..storage.atomic import keep_owner, replaced_mode

    try:
        st = os.stat(path)
    except FileNotFoundError:
        perm = new_mode
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot stat destination: {strerror(exc)}") from exc
    else:
        perm = replaced_mode(st)
        if stat.S_ISREG(st.st_mode):
            keep_owner(fd, st, path)  # first: a change of owner clears setuid and setgid
    if perm is None:
        return
    try:
        os.fchmod(fd, perm)
    except OSError as exc:
        raise local_error(
            exc, f"{path}: cannot set mode {perm:o} on the staging file: {strerror(exc)}"
        ) from exc


class FileStaging:
    """A staging file: its descriptor and name. Knows nothing of the writer.

    ``cleanup()`` unlinks the file unless it was :meth:`mark_published` (renamed or
    linked into place) and closes the descriptor; it is idempotent.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd: int | None = fd
        self.published = False

    def fileno(self) -> int:
        """The open descriptor (raises once closed)."""
        if self.fd is None:
            raise StorageError(f"{self.path}: staging file is closed")
        return self.fd

    def close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def mark_published(self) -> None:
        """The file now lives under the destination name: never unlink it."""
        self.published = True
        self.close_fd()

    def cleanup(self) -> None:
        try:
            if not self.published:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise local_error(
                        exc, f"{self.path}: cannot remove staging file: {strerror(exc)}"
                    ) from exc
        finally:
            self.published = True
            self.close_fd()
