"""Opening a file of ptestore's own that must be a regular file (a journal, a cache
manifest, a packed-weight record): never through a symbolic link and never blocking,
so that a link or a FIFO planted at its path is refused at once instead of followed or
waited on (a FIFO would hang every reader). Each caller says in its own words what the
file is; :class:`NotRegular` tells it why the file was refused."""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegular", "file_kind", "open_regular"]


class NotRegular(OSError):
    """What is at the path is not a regular file: ``kind`` says what it is ("a symbolic
    link", or its mode as ``ls -l`` shows it, e.g. ``prw-------`` for a FIFO);
    ``link`` tells a link apart."""

    def __init__(self, path: str, kind: str, link: bool) -> None:
        super().__init__(errno.ELOOP if link else errno.EINVAL, kind, path)
        self.kind = kind
        self.link = link

    def __reduce__(self) -> tuple[object, ...]:
        # OSError's own reduce passes (errno, strerror, filename) to this constructor.
        return (type(self), (self.filename, self.kind, self.link))


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) that is not a regular one is, in words:
    ``"a FIFO (named pipe)"``, ``"a character device"``, ...; a mode it does not name as
    ``ls -l`` shows it."""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return f"not a regular file (mode {stat.filemode(mode)})"


def open_regular(
    path: str | os.PathLike[str], flags: int = os.O_RDONLY
) -> tuple[int, os.stat_result]:
    """The descriptor and ``fstat`` of the regular file at ``path``, opened with ``flags``
    (``O_RDONLY`` by default) and ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC``.

    Raises :class:`FileNotFoundError` when there is none, :class:`NotRegular` for a
    symbolic link or anything but a regular file (nothing is left open), and any other
    :class:`OSError` as ``open`` raised it."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(os.fspath(path), "a symbolic link", True) from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(os.fspath(path), stat.filemode(st.st_mode), False)
    return fd, st
