"""The in-place journal: what an in-place specialization will change, made durable
before any byte of the file changes, and applied from the journal alone.

The journal is ``.<name>.ptestore-jrnl2`` beside the file (the versions before named it
``.<name>.ptestore-journal``: still found, :func:`~ptestore.journal_read.find_journal`).
Its layout::

    [payload: replacement bytes, new metadata, new trailer]   (the run's spool)
    [plan: JSON]                                              (what to do)
    [footer: MAGIC, plan offset u64, plan size u64]
    [commit: COMMIT_V2, sha256 of the plan and the footer]

The plan names what the payload must be (``plan["check"]``): the SHA-256 of each chunk
of the file's content (:mod:`ptestore.provenance.chunks`, the same chunks a trailer
records) that a write touches, as the file will have it, and the SHA-256 of each write
past the content (the trailer). A run with a trailer computes those chunks for its
record anyway, so the payload costs no hashing of its own (older journals end in
``COMMIT``, the SHA-256 of everything before it: still read and applied).

Writing it: payload, plan and the commit record, one ``fsync``, then the directory's
``fsync``. Only then is the file touched. A journal without a valid commit record, or
whose payload does not give the chunks its plan names, was never started on the file
(or is damaged): it is discarded, or refused if the file is already marked. A
committed one is applied, step by step, each step reading only the journal, so applying
again after a crash at any point gives the same file:

1. the FlatBuffer file identifier (bytes 4..8) is replaced by :data:`CHANGING`, and the
   file ``fsync``-ed: from here the ExecuTorch runtime refuses the file;
2. the old ranges of moved segments are released (``fallocate(PUNCH_HOLE)`` where the
   file system has it; elsewhere they stay allocated, unreferenced);
3. every write of the plan (replacements, metadata, trailer; the metadata, written
   only where it changed, still with :data:`CHANGING` in place of the identifier) and
   the new size (``ftruncate``), then ``fsync``;
4. the real identifier, ``fsync``: the runtime loads the new file;
5. the journal is removed and the directory ``fsync``-ed (a removal refused is an error
   saying the file is complete; a journal whose writes are all in the file already is
   not applied again).

Reading one is :mod:`ptestore.journal_read`'s (a journal another user wrote, or one
writable by others, is refused there: never applied nor removed); what is checked before
it is applied, :mod:`ptestore.journal_check`'s (its plan, its payload) and
:mod:`ptestore.journal_binding`'s (its file: the apply checks it again, on the descriptor
it writes through, right before marking it).
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Any, NoReturn

from . import journal_binding, journal_check
from ._io import pread_all, pwrite_all
from .errors import ConfigurationError, ObjectNotFound, StorageError
from .journal_check import CHANGING, IDENT_RANGE
from .journal_read import (
    COMMIT,
    COMMIT_RECORD,
    COMMIT_V2,
    FOOTER,
    MAGIC,
    check_journal,
    find_journal,
    journal_path,
    journal_paths,
    read_plan,
    target_of,
)
from .storage.atomic import sync_directory, sync_file
from .storage.types import StorageURL

__all__ = [
    "COMMIT",
    "COMMIT_RECORD",
    "COMMIT_V2",
    "FOOTER",
    "MAGIC",
    "CHANGING",
    "IDENT_RANGE",
    "ApplyFailed",
    "apply_journal",
    "check_journal",
    "find_journal",
    "journal_path",
    "journal_paths",
    "punch_hole",
    "read_plan",
    "recover",
    "recover_if_local",
    "remove_journal",
    "reserve_tail",
    "target_of",
]

_CHUNK = 8 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


#: The journal is a data file written in place (never a temporary file renamed), so it
#: is made durable with the storage layer's primitives themselves.
fsync_dir = sync_directory


def _fallocate(fd: int, mode: int, offset: int, size: int) -> bool:
    """``fallocate(2)``; False where the file system cannot (EOPNOTSUPP, ENOSYS, EINVAL)."""
    from ._libc import fallocate  # ctypes: only when a journal is applied

    return fallocate(fd, mode, offset, size)


def punch_hole(fd: int, offset: int, size: int) -> bool:
    """Release ``[offset, offset + size)`` of the file (its size unchanged); False where
    the file system cannot (the bytes then stay, unreferenced)."""
    return _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, size)


def reserve_tail(fd: int, offset: int, size: int) -> bool:
    """Allocate ``[offset, offset + size)`` without changing the file's size
    (``fallocate(KEEP_SIZE)``); False where the file system cannot (nothing reserved)."""
    return _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, size)


def _write_zeros(fd: int, offset: int, size: int) -> None:
    """Zeros over ``[offset, offset + size)`` (where punching a hole is not supported:
    the released range reads as zeros either way, as the record's digest says)."""
    zeros = bytes(min(_CHUNK, size))
    done = 0
    while done < size:
        k = min(len(zeros), size - done)
        pwrite_all(fd, memoryview(zeros)[:k], offset + done)
        done += k


def _copy_range(src_fd: int, src: int, dst_fd: int, dst: int, n: int, journal: str) -> None:
    done = 0
    while done < n:
        try:
            k = os.copy_file_range(src_fd, dst_fd, n - done, src + done, dst + done)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            k = 0
        if k == 0:  # not supported here (or a short journal): through Python
            data = pread_all(src_fd, min(_CHUNK, n - done), src + done)
            if not data:
                raise StorageError(f"{journal}: short read at {src + done}")
            pwrite_all(dst_fd, memoryview(data), dst + done)
            k = len(data)
        done += k


class ApplyFailed(StorageError):
    """Applying a committed journal failed part-way (a full disk, an I/O error): the
    journal is kept, and :func:`recover` completes the file once the cause is gone.
    ``target`` and ``journal``: the file and its journal; ``marked``: whether the file was
    marked :data:`CHANGING` already; ``errno``: the cause's."""

    def __init__(self, target: str, journal: str, exc: OSError, marked: bool) -> None:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        then = "free space on its file system, then " if full else ""
        state = (
            f"the file is marked as being changed ({CHANGING.decode()}: the ExecuTorch "
            "runtime refuses it) until the journal is applied"
            if marked
            else "the file is not changed yet, but the journal is committed and kept"
        )
        super().__init__(
            f"{target}: applying its committed in-place journal {journal} failed: "
            f"{exc.strerror}; {state}: {then}run ptestore.recover() on it (or `ptestore "
            "inspect` it, or the next ensure) to complete the change",
            errno=exc.errno,
        )
        self.target = target
        self.journal = journal
        self.marked = marked

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross processes (a pool pickles a worker's): rebuilt from the message
        # it was made with (``str(self)`` is redacted: rebuilt from it, ``args`` would
        # change, and a second round trip would redact a redaction).
        return (
            _rebuild_apply_failed,
            (str(self.args[0]), self.errno, self.target, self.journal, self.marked),
        )


def _rebuild_apply_failed(
    message: str, code: int | None, target: str, journal: str, marked: bool
) -> ApplyFailed:
    """Unpickle an :class:`ApplyFailed` (its constructor takes the cause, not a message)."""
    failed = ApplyFailed.__new__(ApplyFailed)
    StorageError.__init__(failed, message, errno=code)
    failed.target = target
    failed.journal = journal
    failed.marked = marked
    return failed


def apply_journal(target: str, journal: str, plan: dict[str, Any]) -> None:
    """Apply a committed journal to ``target`` (idempotent; see the module docstring)."""
    lo, hi = IDENT_RANGE
    ident = bytes.fromhex(plan["ident"])
    fd = journal_binding.open_target(target, journal, os.O_RDWR)
    try:
        journal_binding.check_bound(fd, target, journal, plan)  # every write through fd
    except BaseException:
        os.close(fd)
        raise
    marked = False
    try:
        jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, CHANGING, lo)  # 1. refused by the runtime from here
            marked = True
            sync_file(fd)
            for off, n in plan["punch"]:  # 2. zeros, whether or not the fs can punch
                if not punch_hole(fd, off, n):
                    _write_zeros(fd, off, n)
            for dst, src, n in plan["writes"]:  # 3.
                if dst >= hi or dst + n <= lo:  # in the kernel
                    _copy_range(jfd, src, fd, dst, n, journal)
                    continue
                done = 0
                while done < n:
                    k = min(_CHUNK, n - done)
                    data = bytearray(pread_all(jfd, k, src + done))
                    if len(data) != k:
                        raise StorageError(f"{journal}: short read at {src + done}")
                    start = dst + done
                    if start < hi and start + k > lo:  # keep the identifier changed
                        for i in range(max(lo, start), min(hi, start + k)):
                            data[i - start] = CHANGING[i - lo]
                    pwrite_all(fd, memoryview(data), start)
                    done += k
            os.ftruncate(fd, plan["size"])
            sync_file(fd)
            os.pwrite(fd, ident, lo)  # 4. loadable again, with the new content
            sync_file(fd)
        finally:
            os.close(jfd)
    except StorageError:
        raise
    except OSError as exc:
        raise ApplyFailed(target, journal, exc, marked) from exc
    finally:
        os.close(fd)
    remove_journal(journal, target, applied=True)  # 5.


def remove_journal(journal: str, target: str, applied: bool) -> None:
    """Remove ``journal`` and ``fsync`` its directory; a removal refused (another
    user's directory) is an error saying what became of the file (``applied``: it is
    complete; else it was never touched) and to remove the journal by hand."""
    from ._oserror import local_error

    try:
        os.unlink(journal)
    except FileNotFoundError:
        pass
    except OSError as exc:
        state = (
            "the change is complete (its in-place journal was applied)"
            if applied
            else "not changed (its in-place journal was never committed)"
        )
        raise local_error(
            exc,
            f"{target}: {state}, but the journal {journal} cannot be removed: "
            f"{exc.strerror}; remove it by hand (as its owner, or the directory's)",
        ) from exc
    fsync_dir(os.path.dirname(os.path.abspath(journal)))


def recover_if_local(url: str | os.PathLike[str] | StorageURL) -> None:
    """:func:`ptestore.recover` for a local path with a journal beside it; nothing for a
    URL of another scheme or a file without one (two ``lstat``: either name)."""
    u = StorageURL.of(url)
    if not u.local:
        return
    target = os.path.realpath(u.path)
    if any(os.path.lexists(j) for j in journal_paths(target)):
        recover(target)


PathLike = str | os.PathLike[str]


def local_path(path: PathLike, what: str) -> str:
    u = StorageURL.of(path, "path")
    if not u.local:
        raise ConfigurationError(f"{u.text}: {what} works on local files only")
    return os.path.realpath(u.path)


class FileLock:
    """``flock`` on the file itself: one in-place run or recovery at a time. The file
    must be a regular file: opened without blocking (a FIFO would wait for a writer),
    anything else refused: a :class:`~ptestore.errors.ConfigurationError` for an
    in-place run, a :class:`~ptestore.errors.StorageError` naming the ``journal`` to
    apply for a recovery."""

    def __init__(self, path: str, journal: str | None = None) -> None:
        import stat

        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{path}: no such file") from exc
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: a socket, a device without its driver
                raise StorageError(f"{path}: cannot open: {exc.strerror}") from exc
            self._refuse(path, journal, "not a regular file")
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            self._refuse(path, journal, f"not a regular file ({stat.filemode(st.st_mode)})")
        self.stat = st
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    @staticmethod
    def _refuse(path: str, journal: str | None, what: str) -> NoReturn:
        if journal is not None:
            raise StorageError(f"{path}: cannot apply its journal {journal}: {what}")
        raise ConfigurationError(
            f"{path}: {what}; in-place specialization works on a regular file only"
        )

    def close(self) -> None:
        os.close(self.fd)


def _is_marked(path: str) -> bool:
    """Whether the file carries :data:`CHANGING` as its identifier (torn by a run)."""
    lo, hi = IDENT_RANGE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return pread_all(fd, hi - lo, lo) == CHANGING
    except OSError:
        return False
    finally:
        os.close(fd)


def recover_locked(path: str) -> str | None:
    journal = find_journal(path)
    if journal is None:
        return None
    plan, why = check_journal(journal)
    applied = False
    if plan is not None:
        # another file: refused, whatever its journal
        applied = journal_binding.check_target(path, journal, plan)
        why = "" if applied else journal_check.check_payload(path, journal, plan)
        if why:
            plan = None
    if plan is None:
        if _is_marked(path):  # torn by a run whose journal is now damaged
            raise StorageError(
                f"{path}: damaged: the file is marked as being changed in place "
                f"({CHANGING.decode()} in place of its identifier; the ExecuTorch runtime "
                f"refuses it) and its journal {journal} is invalid ({why}), so it cannot "
                "be completed. Restore the model from its portable source (a new copy of "
                f"the original .pte) and remove {journal}"
            )
        remove_journal(journal, path, applied=False)  # never committed: not touched
        return "discarded"
    if applied:  # every write is in the file: only the journal's removal was left
        remove_journal(journal, path, applied=True)
    else:
        apply_journal(path, journal, plan)
    return "rolled forward"


def recover(path: PathLike) -> str | None:
    """Finish or undo an interrupted in-place specialization of ``path``.

    A committed journal is applied (rolled forward: the file gets the new content); an
    uncommitted one is removed (the file was never touched). Returns ``"rolled forward"``,
    ``"discarded"``, or None when there was no journal. Two ``lstat`` when there is none,
    which is what :func:`ptestore.specialize`, ``describe``, ``verify`` and ``ensure``
    pay for calling it on every local path."""
    target = local_path(path, "recover")
    journal = find_journal(target)
    if journal is None:
        return None
    try:
        lock = FileLock(target, journal)
    except ObjectNotFound as exc:
        raise ObjectNotFound(
            f"{target}: no such file, but its in-place journal {journal} is there: the "
            "file was removed after a run was interrupted; remove the journal if the "
            "file is gone for good"
        ) from exc
    try:
        return recover_locked(target)
    finally:
        lock.close()
