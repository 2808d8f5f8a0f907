"""The in-place journal: what an in-place specialization will change, made durable
before any byte of the file changes, and applied from the journal alone.

The journal is ``.<name>.ptestore-journal`` beside the file. Its layout::

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
5. the journal is removed and the directory ``fsync``-ed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from typing import Any

from . import journal_binding, journal_check
from ._io import pread_all, pwrite_all
from .errors import ConfigurationError, ObjectNotFound, StorageError
from .journal_check import CHANGING, IDENT_RANGE
from .storage.atomic import sync_directory, sync_file
from .storage.types import StorageURL

__all__ = [
    "CHANGING",
    "IDENT_RANGE",
    "apply_journal",
    "check_journal",
    "journal_path",
    "punch_hole",
    "read_plan",
    "recover",
    "recover_if_local",
    "reserve_tail",
]

MAGIC = b"PTESTORE-JRNL-v1"
#: The commit record of older journals (``PTESTORE-COMMIT!``): the SHA-256 of all before it.
COMMIT = b"PTESTORE-COMMIT!"
#: The commit record: the SHA-256 of the plan and the footer (the plan checks the rest).
COMMIT_V2 = b"PTESTORE-COMMIT2"
FOOTER = struct.Struct("<16sQQ")
COMMIT_RECORD = struct.Struct("<16s32s")
_CHUNK = 8 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


#: The journal is a data file written in place (never a temporary file renamed), so it
#: is made durable with the storage layer's primitives themselves.
fsync_dir = sync_directory


def read_plan(path: str) -> dict[str, Any] | None:
    """The plan of a committed journal; None when the journal is incomplete (its commit
    record missing or not matching: the file was never touched)."""
    return check_journal(path)[0]


def _commit_digest_ok(fd: int, start: int, body: int, digest: bytes) -> bool:
    """Whether the SHA-256 of the journal's bytes ``[start, body)`` is ``digest``."""
    import hashlib  # only when a journal exists: every run of a local path asks

    h = hashlib.sha256()
    done = start
    while done < body:
        n = min(_CHUNK, body - done)
        h.update(pread_all(fd, n, done))
        done += n
    return h.digest() == digest


def check_journal(path: str) -> tuple[dict[str, Any] | None, str]:
    """``(plan, "")`` for a committed journal, else ``(None, why)``: what is wrong with
    it (no commit record, a commit digest that does not match, a bad footer). The
    payload of a journal committed by :data:`COMMIT_V2` is checked against its plan by
    :func:`check_payload` (it needs the file)."""
    import json

    fd = _open_journal(path)
    try:
        size = os.fstat(fd).st_size
        if size < FOOTER.size + COMMIT_RECORD.size:
            return None, f"{size} bytes, shorter than a commit record"
        record = pread_all(fd, COMMIT_RECORD.size, size - COMMIT_RECORD.size)
        tag, digest = COMMIT_RECORD.unpack(record)
        if tag not in (COMMIT, COMMIT_V2):
            return None, "no commit record at its end"
        body = size - COMMIT_RECORD.size
        magic, at, n = FOOTER.unpack(pread_all(fd, FOOTER.size, body - FOOTER.size))
        footer_ok = magic == MAGIC and at + n == body - FOOTER.size
        if tag == COMMIT:  # an older journal: the digest covers the payload too
            if not _commit_digest_ok(fd, 0, body, digest):
                return (
                    None,
                    f"the SHA-256 of its first {body} bytes does not match its commit record",
                )
        elif not footer_ok or not _commit_digest_ok(fd, at, body, digest):
            return None, (
                f"the SHA-256 of its plan and footer (bytes {at if footer_ok else '?'}.."
                f"{body}) does not match its commit record"
            )
        if not footer_ok:
            return None, "its footer is not a journal's"
        try:
            plan = json.loads(pread_all(fd, n, at))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return None, f"its plan is not JSON ({exc})"
        if tag == COMMIT and isinstance(plan, dict):
            plan.pop("check", None)  # its commit record covers the payload already
        elif not isinstance(plan, dict) or not isinstance(plan.get("check"), dict):
            return None, "its plan does not say what its payload must be"
        problem = journal_check.plan_problem(plan, at)
        if problem:
            return None, f"its plan {problem}"
        return plan, ""
    finally:
        os.close(fd)


def _open_journal(path: str) -> int:
    """The journal opened for reading: a regular file, never through a link, never
    blocking (a FIFO planted there would hang every open of the model); anything else
    a :class:`StorageError` naming it."""
    from .storage.regular import NotRegular, open_regular

    advice = "the file beside it is left as it is (remove the journal if no in-place run left it)"
    try:
        fd, _ = open_regular(path)
    except NotRegular as exc:
        if exc.link:
            raise StorageError(
                f"{path}: cannot read this in-place journal: a symbolic link; {advice}"
            ) from exc
        raise StorageError(
            f"{path}: this in-place journal is not a regular file ({exc.kind}); {advice}"
        ) from exc
    except OSError as exc:
        raise StorageError(
            f"{path}: cannot read this in-place journal: {exc.strerror}; {advice}"
        ) from exc
    return fd


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
    try:
        jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, CHANGING, lo)  # 1. refused by the runtime from here
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
    except OSError as exc:
        raise StorageError(
            f"{target}: applying the journal {journal} failed: {exc.strerror}; the file is "
            "refused by the runtime until ptestore.recover() completes it"
        ) from exc
    finally:
        os.close(fd)
    os.unlink(journal)  # 5.
    fsync_dir(os.path.dirname(os.path.abspath(journal)))


def journal_path(path: str) -> str:
    """The journal of the file at ``path``: ``.<name>.ptestore-journal`` beside it."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}.ptestore-journal")


def recover_if_local(url: str | os.PathLike[str]) -> None:
    """:func:`ptestore.recover` for a local path with a journal beside it; nothing for a
    URL of another scheme or a file without one (one ``lstat``)."""
    u = StorageURL.of(url)
    if not u.local:
        return
    target = os.path.realpath(u.path)
    if os.path.lexists(journal_path(target)):
        recover(target)


PathLike = str | os.PathLike[str]


def local_path(path: PathLike, what: str) -> str:
    u = StorageURL.of(path)
    if not u.local:
        raise ConfigurationError(f"{u.text}: {what} works on local files only")
    return os.path.realpath(u.path)


class FileLock:
    """``flock`` on the file itself: one in-place run or recovery at a time."""

    def __init__(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{path}: no such file") from exc
        except OSError as exc:
            raise StorageError(f"{path}: cannot open: {exc.strerror}") from exc
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def close(self) -> None:
        os.close(self.fd)


def _is_marked(path: str) -> bool:
    """Whether the file carries :data:`CHANGING` as its identifier (torn by a run)."""
    lo, hi = IDENT_RANGE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return pread_all(fd, hi - lo, lo) == CHANGING
    finally:
        os.close(fd)


def recover_locked(path: str) -> str | None:
    journal = journal_path(path)
    if not os.path.lexists(journal):
        return None
    plan, why = check_journal(journal)
    if plan is not None:
        # another file: refused, whatever its journal
        journal_binding.check_target(path, journal, plan)
        why = journal_check.check_payload(path, journal, plan)
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
        os.unlink(journal)  # never committed: the file was not touched
        return "discarded"
    apply_journal(path, journal, plan)
    return "rolled forward"


def recover(path: PathLike) -> str | None:
    """Finish or undo an interrupted in-place specialization of ``path``.

    A committed journal is applied (rolled forward: the file gets the new content); an
    uncommitted one is removed (the file was never touched). Returns ``"rolled forward"``,
    ``"discarded"``, or None when there was no journal. One ``stat`` when there is none,
    which is what :func:`ptestore.specialize`, ``describe``, ``verify`` and ``ensure``
    pay for calling it on every local path."""
    target = local_path(path, "recover")
    journal = journal_path(target)
    if not os.path.lexists(journal):
        return None
    try:
        lock = FileLock(target)
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
