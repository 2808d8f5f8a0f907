"""The in-place journal: what an in-place specialization will change, made durable
before any byte of the file changes, and applied from the journal alone.

The journal is ``.<name>.ptestore-journal`` beside the file. Its layout::

    [payload: replacement bytes, new metadata, new trailer]   (the run's spool)
    [plan: JSON]                                              (what to do)
    [footer: MAGIC, plan offset u64, plan size u64]
    [commit: COMMIT, sha256 of everything before it]

Writing it: payload, plan and the commit record (the SHA-256 of everything before it),
one ``fsync``, then the directory's ``fsync``. Only then is the file touched. A journal
without a valid commit record was never started on the file: it is discarded. A
committed one is applied, step by step, each step reading only the journal, so applying
again after a crash at any point gives the same file:

1. the FlatBuffer file identifier (bytes 4..8) is replaced by :data:`CHANGING`, and the
   file ``fsync``-ed: from here the ExecuTorch runtime refuses the file;
2. the old ranges of moved segments are released (``fallocate(PUNCH_HOLE)`` where the
   file system has it; elsewhere they stay allocated, unreferenced);
3. every write of the plan (replacements, metadata, trailer; the metadata still with
   :data:`CHANGING` in place of the identifier) and the new size (``ftruncate``), then
   ``fsync``;
4. the real identifier, ``fsync``: the runtime loads the new file;
5. the journal is removed and the directory ``fsync``-ed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import struct
import threading
from typing import Any

from .._io import pread_all, pwrite_all
from ..coordinator.spool import Buffer, Spool
from ..errors import StorageError
from .paths import journal_path

__all__ = [
    "CHANGING",
    "IDENT_RANGE",
    "JournalSpool",
    "apply_journal",
    "commit_journal",
    "journal_path",
    "read_plan",
]

MAGIC = b"PTESTORE-JRNL-v1"
COMMIT = b"PTESTORE-COMMIT!"
_FOOTER = struct.Struct("<16sQQ")
_COMMIT = struct.Struct("<16s32s")
#: Where the FlatBuffer file identifier of a .pte is ("ET12" in ExecuTorch 1.x).
IDENT_RANGE = (4, 8)
#: The identifier the file carries while it is being changed (the runtime refuses it).
CHANGING = b"PTJ~"
_CHUNK = 8 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


class JournalSpool(Spool):
    """The run's replacement spool, kept in the journal file itself, so that the
    replaced bytes are on disk once (peak extra disk: the replacements plus the new
    metadata, not a copy of the model)."""

    def __init__(self, path: str) -> None:  # replaces Spool's temporary file
        self.path = path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError as exc:
            raise StorageError(
                f"{path}: a journal exists already (another in-place run, or one to "
                "recover: ptestore.recover)"
            ) from exc
        except OSError as exc:
            raise StorageError(f"{path}: cannot create the journal: {exc.strerror}") from exc
        self._file = os.fdopen(fd, "r+b")  # read and written with pread/pwrite only
        self._size = 0
        self.name = f"<journal {path}>"
        self._lock = threading.Lock()
        #: SHA-256 of everything appended so far (appends are sequential).
        self.sha256 = hashlib.sha256()

    def add(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        try:
            at = super().add(view)
        except StorageError as exc:
            raise StorageError(f"{self.path}: {exc}") from exc.__cause__
        self.sha256.update(view)
        return at

    def remove(self) -> None:
        """Close and remove the journal (a run that failed before its commit)."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def commit_journal(spool: JournalSpool, plan: dict[str, Any]) -> None:
    """Append the plan and the commit record and make the journal durable."""
    text = json.dumps(plan, sort_keys=True).encode()
    fd = spool.fileno()
    try:
        at = spool.add(text)
        spool.add(_FOOTER.pack(MAGIC, at, len(text)))
        # One fsync for all of it: the commit record carries the SHA-256 of everything
        # before it, so a journal torn by a power loss before this fsync returned reads
        # as uncommitted (and the file is touched only after it returned).
        spool.add(_COMMIT.pack(COMMIT, spool.sha256.digest()))
        os.fsync(fd)
        _fsync_dir(os.path.dirname(spool.path))
    except OSError as exc:
        raise StorageError(
            f"{spool.path}: cannot make the journal durable: {exc.strerror}; the model was "
            "not changed"
        ) from exc


def read_plan(path: str) -> dict[str, Any] | None:
    """The plan of a committed journal; None when the journal is incomplete (its commit
    record missing or not matching: the file was never touched)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < _FOOTER.size + _COMMIT.size:
            return None
        tag, digest = _COMMIT.unpack(pread_all(fd, _COMMIT.size, size - _COMMIT.size))
        if tag != COMMIT:
            return None
        body = size - _COMMIT.size
        h = hashlib.sha256()
        done = 0
        while done < body:
            n = min(_CHUNK, body - done)
            h.update(pread_all(fd, n, done))
            done += n
        if h.digest() != digest:
            return None
        magic, at, n = _FOOTER.unpack(pread_all(fd, _FOOTER.size, body - _FOOTER.size))
        if magic != MAGIC or at + n > body:
            return None
        plan: dict[str, Any] = json.loads(pread_all(fd, n, at))
        return plan
    finally:
        os.close(fd)


_libc: Any = None


def punch_hole(fd: int, offset: int, size: int) -> bool:
    """Release ``[offset, offset + size)`` of the file (its size unchanged); False where
    the file system cannot (the bytes then stay, unreferenced)."""
    global _libc
    if size <= 0:
        return True
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if _libc.fallocate(fd, mode, offset, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def reserve_tail(fd: int, offset: int, size: int) -> bool:
    """Allocate ``[offset, offset + size)`` without changing the file's size
    (``fallocate(KEEP_SIZE)``); False where the file system cannot (nothing reserved)."""
    global _libc
    if size <= 0:
        return True
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


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
    try:
        fd = os.open(target, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(
            f"{target}: cannot open to apply its journal {journal}: {exc.strerror}"
        ) from exc
    try:
        jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, CHANGING, lo)  # 1. refused by the runtime from here
            os.fsync(fd)
            for off, n in plan["punch"]:  # 2.
                punch_hole(fd, off, n)
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
            os.fsync(fd)
            os.pwrite(fd, ident, lo)  # 4. loadable again, with the new content
            os.fsync(fd)
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
    _fsync_dir(os.path.dirname(os.path.abspath(journal)))
