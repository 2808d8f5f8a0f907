"""The artifact a packed-weight file is made or loaded for, opened once: hashed, parsed
and handed to the runtime through the same inodes.

A check that hashes the ``.pte`` and ``.ptd`` by path and a runtime that opens them by
path seconds later can see two files: another one renamed over the path meanwhile (a
fetch of the next version, with the same named-data keys) was packed, or run, under the
first one's digests. :class:`PinnedArtifact` opens each file once, before anything is
hashed, and keeps it open: the digests and the parse read those inodes
(``/proc/self/fd/N``), and the runtime is given the same paths (a child inherits the
descriptors at the same numbers: :attr:`PinnedArtifact.fds`), so it opens exactly the
files that were hashed. What a descriptor cannot pin, a write into the same inode, shows
in its stamp (device, inode, size, mtime, ctime): :meth:`PinnedArtifact.changed`.

Without ``/proc`` the paths are handed on as they are, and :meth:`~PinnedArtifact.changed`
also reports a file whose path no longer names the inode opened.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import IntegrityError, ObjectNotFound
from .identity import file_sha256
from .record import PathLike, stamp

__all__ = ["PinnedArtifact"]


class PinnedArtifact:
    """The ``.pte`` (and ``.ptd``) open, read-only, until :meth:`close`.

    ``pte``/``ptd``: the caller's paths (the names in messages and in the digests a
    record remembers); :attr:`pte_path`/:attr:`ptd_path`: what to open to read the very
    inodes held. A file that is not there is :class:`ObjectNotFound`; one that is not a
    regular file (a directory, a FIFO) a :class:`~ptestore.errors.ConfigurationError`
    naming it, as any local read of ptestore refuses it."""

    def __init__(self, pte: PathLike, ptd: PathLike | None = None) -> None:
        self.pte = os.fspath(pte)
        self.ptd = None if ptd is None else os.fspath(ptd)
        self._loaders: list[Any] = []
        try:
            for path in (self.pte, self.ptd):
                if path is not None:
                    self._loaders.append(_open(path))
        except BaseException:
            self.close()
            raise
        #: Each file's stamp when it was opened, in the order pte, ptd.
        self.stamps = [stamp(os.fstat(fd)) for fd in self.fds]
        self._proc = all(os.path.exists(_proc(fd)) for fd in self.fds)

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors held (the ``.pte``'s, then the ``.ptd``'s): what a child that
        opens :attr:`pte_path`/:attr:`ptd_path` must inherit (``pass_fds``)."""
        return tuple(loader.fileno() for loader in self._loaders)

    @property
    def paths(self) -> tuple[str, ...]:
        """The caller's paths, in the order of :attr:`fds`."""
        return (self.pte,) if self.ptd is None else (self.pte, self.ptd)

    def _read_path(self, i: int) -> str:
        return _proc(self.fds[i]) if self._proc else os.path.abspath(self.paths[i])

    def read_path(self, path: str) -> str:
        """What to open to read the file held for the caller's ``path`` (one of
        :attr:`paths`)."""
        return self._read_path(self.paths.index(path))

    @property
    def pte_path(self) -> str:
        """The ``.pte`` held: ``/proc/self/fd/N``, or its absolute path without ``/proc``."""
        return self._read_path(0)

    @property
    def ptd_path(self) -> str | None:
        """The ``.ptd`` held, as :attr:`pte_path` (None without one)."""
        return None if self.ptd is None else self._read_path(1)

    @property
    def pinned(self) -> bool:
        """Whether :attr:`pte_path` and :attr:`ptd_path` name the inodes held
        (``/proc/self/fd/N``), not the caller's paths."""
        return self._proc

    def changed(self) -> list[str]:
        """The caller's paths whose inode changed since it was opened (a write, a
        ``chmod``, a link removed or renamed over it: its stamp differs), or, without
        ``/proc``, whose path no longer names that inode unchanged."""
        out = []
        for path, fd, then in zip(self.paths, self.fds, self.stamps, strict=True):
            now = stamp(os.fstat(fd))
            if not self._proc and now == then:
                try:
                    now = stamp(os.stat(path))
                except OSError:
                    now = {}
            if now != then:
                out.append(path)
        return out

    def check_unchanged(
        self, pte_sha256: str, ptd_sha256: str | None, cause: BaseException | None = None
    ) -> None:
        """What was run is still the artifact of these digests (after the runtime ran
        it in children that opened :attr:`pte_path`/:attr:`ptd_path`): a file whose
        inode :meth:`changed` (written in place, or only its name removed or renamed
        over) is hashed again and must have its digest; without ``/proc`` (the children
        opened the paths) it is refused at once. :class:`IntegrityError` otherwise.

        ``cause``: a child's failure, checked before it is judged (one on an artifact
        written meanwhile says nothing of the artifact the file is for: never a
        refusal); the :class:`IntegrityError` is raised from it."""
        wanted = dict(zip(self.paths, (pte_sha256, ptd_sha256), strict=False))
        for path in self.changed():
            now = file_sha256(self.read_path(path)) if self._proc else None
            if now != wanted[path]:
                raise IntegrityError(
                    f"{path}: changed while its packed-weight file was made (SHA-256 "
                    f"{now or 'of another file'} != {wanted[path]}, the digest it was made "
                    "for); nothing published",
                    published=False,
                ) from cause

    def close(self) -> None:
        loaders, self._loaders = self._loaders, []
        for loader in loaders:
            loader.close()

    def __enter__(self) -> PinnedArtifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _proc(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _open(path: str) -> Any:
    """A :class:`~ptestore.storage.loaders.LocalFileLoader` of ``path`` (regular files
    only, never blocking on a FIFO), a missing file named as the artifact."""
    from ..storage.loaders import LocalFileLoader

    try:
        return LocalFileLoader(path)
    except ObjectNotFound:
        raise ObjectNotFound(f"{path}: no such file (the artifact)") from None
