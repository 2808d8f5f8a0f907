"""Local files: a hidden staging file beside the destination, published by rename or link.

Guarantees (POSIX filesystems such as ext4, XFS, btrfs, f2fs, APFS):

- **Atomic**: readers see the previous file or the complete new one (``rename(2)`` and
  ``link(2)`` within one directory). Readers that opened the old file keep reading the
  old bytes, so publishing onto the file being read (replace-the-source) is safe.
- **Durable** (``durable=True``, the default): the staging file is fsynced
  (``F_FULLFSYNC`` on macOS) before the rename and the directory after it. Any fsync
  error is fatal: the staging is discarded and fsync is never retried. While a large
  output is written, each :data:`WRITEBACK_PIECE` written is handed to the disk at once
  (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, a hint that does not wait), so the
  copy and its writeback overlap and the final fsync has little left to do: a 1 GiB
  durable copy on ext4 takes about two thirds of the time of copying first and syncing
  after (docs/benchmarks.md), and the dirty pages a copy leaves in memory stay few.
- **Isolated**: the staging file is created with ``O_EXCL`` and mode ``0o600`` in the
  destination's own directory and is never visible under the destination name.
- **No-clobber**: ``publish(mode="create")`` uses ``link(2)``, which fails with
  ``EEXIST`` if the destination exists, between processes and hosts sharing the
  filesystem, without a check-then-write window.
- **Compare-and-swap**: ``publish(mode="if-match", expected=V)`` hashes the destination
  under an exclusive ``flock`` on ``.<name>.ptestore.lock`` beside it and renames only
  if it still is version ``V`` (its SHA-256, :mod:`._local_cas` says why not its stat
  identity); a destination that is a symbolic link is refused. Conditional publishers
  exclude each other, between processes and hosts where the filesystem's ``flock``
  works; an ``overwrite`` does not take the lock.
- **Free space**: :meth:`LocalFileWriter.ensure_space` compares the output's size with
  ``statvfs`` of the directory and refuses (``errno`` ENOSPC) before anything is written;
  every write or copy that grows the staging file by :data:`ROOM_CHECK` or more checks
  the same first, so a large copy fails before it fills the disk.
- **Cleanup**: discard, garbage collection and interpreter exit unlink the staging file.
  After a crash (SIGKILL, power loss) a stale ``.<name>.ptestore-<hex>.tmp`` may remain;
  ``ptestore gc DIR`` removes those (never a file a live writer still holds: writers
  keep an exclusive ``flock`` on their staging file).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sys
from typing import ClassVar

from .._io import file_size_limit, free_bytes, pwrite_all
from .._oserror import local_error
from ..errors import (
    ConfigurationError,
    ObjectNotFound,
    PublishUncertain,
    StorageError,
)
from ..storage.types import DataLoader, absolute_path, strerror
from ._clone import HasFileno, clone_range, probe_clone_block_size
from ._dirs import check_name_lengths, make_parents, remove_made
from ._staging import FileStaging, current_umask, take_over
from .base import (
    DataWriter,
    PublishMode,
    PublishResult,
    WriterGuarantees,
    already_exists,
)

__all__ = ["ROOM_CHECK", "TEMP_NAME_RE", "WRITEBACK_PIECE", "LocalFileWriter", "staging_name"]

#: Matches the names of ptestore's own staging files (and nothing a user would create).
TEMP_NAME_RE = re.compile(r"^\.(?P<name>.*)\.ptestore-(?P<token>[0-9a-f]{16})\.tmp$", re.DOTALL)

_MAX_PREFIX = 200  # bytes: keep staging names under NAME_MAX (255) for long destination names
#: A durable writer starts the writeback of every this many bytes written in a row (and
#: copies in pieces of this size): 8-64 MiB gave the same times on ext4 here, 128 MiB
#: less overlap.
WRITEBACK_PIECE = 16 << 20
#: A write or copy growing the staging file by at least this much first checks the free
#: space (``statvfs``), so a large output fails before it fills the disk.
ROOM_CHECK = 1 << 20
_FALLBACK_ERRNOS = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM}
)
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV})


def staging_name(dest_name: str) -> str:
    """A fresh hidden staging name for a destination file name (its head cut to
    ``_MAX_PREFIX`` bytes, at a character: under NAME_MAX whatever its characters)."""
    from .._text import head_bytes

    return f".{head_bytes(dest_name, _MAX_PREFIX)}.ptestore-{os.urandom(8).hex()}.tmp"


def _full_fsync(fd: int) -> None:
    if sys.platform == "darwin" and hasattr(fcntl, "F_FULLFSYNC"):
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
    else:
        os.fsync(fd)


class LocalFileWriter(DataWriter):
    """Writer for a local file (plain paths and ``file://`` URLs).

    Parameters
    ----------
    path:
        The destination file. Its directory must exist unless ``auto_mkdir`` is true.
    durable:
        fsync the file before and the directory after publishing (default true).
    auto_mkdir:
        Create missing parent directories first (fsspec's option of the same name).
    """

    guarantees: ClassVar[WriterGuarantees] = WriterGuarantees(
        atomic_publish=True, exclusive_create=True, durable=True, conditional_update=True
    )
    options: ClassVar[frozenset[str]] = frozenset({"durable", "auto_mkdir"})

    def __init__(
        self, path: str | os.PathLike[str], *, durable: bool = True, auto_mkdir: bool = False
    ) -> None:
        self.path = absolute_path(os.fspath(path))  # '..' is the kernel's to resolve
        super().__init__(self.path)
        self.durable = durable
        self.directory, name = os.path.split(self.path)
        if not name:
            raise ConfigurationError(f"{self.path}: names a directory (it ends in '/'), not a file")
        if os.path.isdir(self.path):
            raise ConfigurationError(f"{self.path}: is a directory, not a file name")
        check_name_lengths(self.path)  # not at publish, after all the work
        #: Directories made for it (``auto_mkdir``), removed by a discard while empty.
        self._made: list[str] = []
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        retries = 3 if auto_mkdir else 0
        while True:
            try:
                self._made += make_parents(self.directory) if auto_mkdir else []
            except OSError as exc:
                raise local_error(
                    exc, f"{self.path}: cannot create directory {self.directory}: {strerror(exc)}"
                ) from exc
            tmp = os.path.join(self.directory, staging_name(name))
            try:
                fd = os.open(tmp, flags, 0o600)
                break
            except FileExistsError:  # pragma: no cover - 64 random bits collided
                continue
            except FileNotFoundError as exc:
                if retries:  # another writer's discard removed it meanwhile: make it again
                    retries -= 1
                    continue
                if os.path.isdir(self.directory):  # there: a file system that takes no
                    raise ConfigurationError(  # new file (/proc, /sys): rerunning won't help
                        f"{self.path}: cannot create a staging file in {self.directory}: "
                        f"{strerror(exc)} (the directory exists; its file system takes no "
                        "new files there)"
                    ) from exc
                raise ObjectNotFound(
                    f"{self.path}: destination directory {self.directory} does not exist"
                ) from exc
            except OSError as exc:
                raise local_error(
                    exc,
                    f"{self.path}: cannot create a staging file in {self.directory}: "
                    f"{strerror(exc)}",
                ) from exc
        staging = FileStaging(tmp, fd)
        try:
            # Mark the staging file as live for `ptestore gc` (released when fd closes or
            # on crash). Filesystems without flock (some NFS mounts: ENOLCK) only lose
            # that marker; gc then relies on the file's age alone.
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass
            self._st = staging
            self._track_staging(staging)
        except BaseException:  # Ctrl-C before the writer owns it: no live-looking leftover
            try:
                staging.cleanup()
            except OSError:  # pragma: no cover - the interrupt is what the caller sees
                pass
            remove_made(self._made)
            raise
        #: ``[start, end)``: bytes written in a row whose writeback was not started yet.
        self._unsent = (0, 0)

    @property
    def staging_path(self) -> str:
        """Path of the hidden staging file (for tests and diagnostics)."""
        return self._st.path

    def _fd(self) -> int:
        return self._st.fileno()

    def _write(self, data: memoryview, offset: int) -> None:
        self._room_for(f"a write of {data.nbytes} bytes", offset, data.nbytes)
        try:
            pwrite_all(self._fd(), data, offset)
        except OSError as exc:
            raise local_error(
                exc,
                f"{self.path}: write of {data.nbytes} bytes at offset {offset} failed: "
                f"{strerror(exc)} (staging file {self._st.path} discarded)",
            ) from exc
        self._written(offset, data.nbytes)

    def _written(self, offset: int, size: int) -> None:
        """``size`` bytes at ``offset`` were just written (not cloned): once a durable
        writer has :data:`WRITEBACK_PIECE` bytes written in a row, start their
        writeback (see the module's docstring). Writes that are not in a row (metadata,
        a replacement elsewhere) are left to the fsync at publish."""
        if not self.durable:
            return
        start, end = self._unsent
        if offset != end:
            start = offset
        end = offset + size
        if end - start >= WRITEBACK_PIECE:
            from .._libc import start_writeback

            start_writeback(self._fd(), start, end - start)
            start = end
        self._unsent = (start, end)

    #: source device -> clone block size (None: no clones), probed on first use
    _clone_probes: dict[int, int | None] | None = None

    def clone_block_size(self, loader: DataLoader) -> int | None:
        """The file system's block size when ``loader`` is a local file (or another
        descriptor-backed source) on this writer's file system and that file system
        shares extents (XFS with reflink, btrfs, bcachefs); else None. Probed once per
        source device."""
        if not isinstance(loader, HasFileno):
            return None
        try:
            src_fd = loader.fileno()
            dev = os.fstat(src_fd).st_dev
        except (OSError, StorageError):
            return None
        probed = self._clone_probes
        if probed is None:
            probed = self._clone_probes = {}
        if dev not in probed:
            probed[dev] = probe_clone_block_size(self.directory, src_fd, self._fd())
        return probed[dev]

    def _copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        if not isinstance(loader, HasFileno) or not hasattr(os, "copy_file_range"):
            super()._copy_from(loader, src_offset, size, dst_offset)
            return
        block = self.clone_block_size(loader)
        if block is not None and (src_offset - dst_offset) % block == 0:
            # Congruent: the partial block at each end is copied, the whole blocks
            # between them are shared with the source.
            head = min(size, -dst_offset % block)
            middle = (size - head) // block * block
            if middle and self._clone(loader, src_offset + head, middle, dst_offset + head):
                self._kernel_copy(loader, src_offset, head, dst_offset)
                tail = head + middle
                self._kernel_copy(loader, src_offset + tail, size - tail, dst_offset + tail)
                self.bytes_cloned += middle
                return
        self._kernel_copy(loader, src_offset, size, dst_offset)

    def _clone(self, loader: HasFileno, src_offset: int, size: int, dst_offset: int) -> bool:
        try:
            return clone_range(loader.fileno(), src_offset, size, self._fd(), dst_offset)
        except OSError as exc:
            raise local_error(
                exc,
                f"{self.path}: cloning {size} bytes from {loader.name} at offset {src_offset} "
                f"to offset {dst_offset} failed: {strerror(exc)} (staging file "
                f"{self._st.path} discarded)",
            ) from exc

    def _kernel_copy(self, loader: HasFileno, src_offset: int, size: int, dst_offset: int) -> None:
        """``copy_file_range`` (which may itself share extents), else through Python."""
        self._room_for(f"a copy of {size} bytes from {loader.name}", dst_offset, size)
        src_fd, dst_fd = loader.fileno(), self._fd()
        done = 0
        while done < size:
            try:
                n = os.copy_file_range(
                    src_fd,
                    dst_fd,
                    min(size - done, WRITEBACK_PIECE),
                    src_offset + done,
                    dst_offset + done,
                )
            except OSError as exc:
                if exc.errno in _FALLBACK_ERRNOS and isinstance(loader, DataLoader):
                    # not supported here: copy through Python
                    super()._copy_from(loader, src_offset + done, size - done, dst_offset + done)
                    return
                raise local_error(
                    exc,
                    f"{self.path}: copying {size} bytes from {loader.name} at offset "
                    f"{src_offset} to offset {dst_offset} failed: {strerror(exc)} "
                    f"(staging file {self._st.path} discarded)",
                ) from exc
            if n == 0:
                raise StorageError(
                    f"{self.path}: source {loader.name} shrank while copying: wanted {size} "
                    f"bytes at offset {src_offset}, got {done}"
                )
            self._written(dst_offset + done, n)
            done += n

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        fd = self._fd()
        tmp = self._st.path
        actual = os.fstat(fd).st_size
        if actual != size:  # pragma: no cover - would be a bug in this module
            raise StorageError(f"{self.path}: staging file has {actual} bytes, expected {size}")
        if self.durable:
            try:
                _full_fsync(fd)
            except OSError as exc:
                raise local_error(
                    exc,
                    f"{self.path}: fsync of the staging file failed: {strerror(exc)}; nothing "
                    "was published (fsync is never retried)",
                ) from exc
        # what it replaces: its permission bits, its owner and group where we may
        take_over(fd, self.path, 0o666 & ~current_umask())
        if mode == "if-match":
            self._publish_if_match(tmp)
        else:
            self._commit_point()
            self._rename_or_link(mode, tmp)
        self._st.mark_published()
        self._made.clear()  # they hold the output now
        if self.durable:
            self._fsync_directory()
        return PublishResult(url=self.path, size=size)

    def discard(self) -> None:
        super().discard()
        remove_made(self._made)  # a failed write leaves no empty folder (``_dirs.py``)

    def _abandon(self, why: str) -> None:
        super()._abandon(why)
        remove_made(self._made)

    def _publish_if_match(self, tmp: str) -> None:
        """Compare and rename under the destination's lock (:func:`._local_cas.swap`).
        The commit hook runs before the lock (a writer paused there must not hold the
        others up); the commit point is once the lock is held and the version matched."""
        from ._local_cas import swap

        assert self._expected is not None
        if self.commit_hook is not None:
            self.commit_hook(self)
        rename = lambda: self._rename_or_link("overwrite", tmp)  # noqa: E731
        swap(self.path, self._expected, lambda: self._commit_point(hook=False), rename)

    def _rename_or_link(self, mode: PublishMode, tmp: str) -> None:
        if mode == "overwrite":
            try:
                os.replace(tmp, self.path)
            except OSError as exc:
                raise local_error(
                    exc, f"{self.path}: cannot rename staging file {tmp} over it: {strerror(exc)}"
                ) from exc
        else:
            try:
                os.link(tmp, self.path)
            except FileExistsError as exc:
                raise already_exists(self.path, "file") from exc
            except OSError as exc:
                if exc.errno in _NO_LINK_ERRNOS:
                    raise StorageError(
                        f"{self.path}: the filesystem does not support hard links, which "
                        f"publish(mode='create') needs: {strerror(exc)}"
                    ) from exc
                raise local_error(
                    exc, f"{self.path}: cannot link staging file {tmp} to it: {strerror(exc)}"
                ) from exc
            try:
                os.unlink(tmp)
            except OSError:  # the published file is fine; gc removes the extra name
                pass

    def _ensure_space(self, size: int, end: int) -> None:
        """Refuse, before writing, an output of ``size`` new bytes that the destination's
        file system has no room for (``statvfs``: the blocks available to this user),
        with :class:`~ptestore.errors.StorageError` ``errno`` ENOSPC naming the bytes
        needed, the bytes free and the directory. Bytes staged already count as room.
        An output of ``end`` bytes past this process's file-size limit
        (``RLIMIT_FSIZE``, ``ulimit -f``; cloned bytes count) is refused too: its copy
        would fail with EFBIG part-way."""
        limit = file_size_limit()
        if limit is not None and end > limit:
            raise StorageError(
                f"{self.path}: an output of up to {end} bytes is past this process's "
                f"file-size limit of {limit} bytes (RLIMIT_FSIZE, ulimit -f); nothing was "
                "written: raise the limit and run again",
                errno=errno.EFBIG,
            )
        free = free_bytes(self.directory)
        needed = size - os.fstat(self._fd()).st_blocks * 512
        if free is not None and needed > free:
            raise self._no_room(f"an output of {size} bytes", needed, free)

    def _room_for(self, what: str, offset: int, size: int) -> None:
        """Before a write or copy that grows the staging file by :data:`ROOM_CHECK` bytes
        or more: refuse it (ENOSPC, nothing of it written) if the file system has less
        room than that, instead of filling the disk first."""
        grows = min(size, offset + size - self._size)
        if grows < ROOM_CHECK:
            return
        free = free_bytes(self.directory)
        if free is not None and grows > free:
            raise self._no_room(f"{what} at offset {offset}", grows, free)

    def _no_room(self, what: str, needed: int, free: int) -> StorageError:
        return StorageError(
            f"{self.path}: not enough free space for {what}: {needed} bytes needed, {free} "
            f"bytes free on the file system of {self.directory}; nothing of it was written "
            f"({os.strerror(errno.ENOSPC)})",
            errno=errno.ENOSPC,
        )

    def _fsync_directory(self) -> None:
        try:
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise PublishUncertain(
                f"{self.path}: published, but cannot open directory {self.directory} to fsync "
                f"it: {strerror(exc)}; the new file is in place but may not survive a crash"
            ) from exc
        try:
            os.fsync(dfd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # fs without directory fsync
                raise PublishUncertain(
                    f"{self.path}: published, but fsync of directory {self.directory} failed: "
                    f"{strerror(exc)}; the new file is in place but may not survive a crash "
                    "(not retried)"
                ) from exc
        finally:
            os.close(dfd)
