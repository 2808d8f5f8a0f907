"""The writer of an in-place run: every write goes to the journal, as a planned write."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

from .._oserror import local_error
from ..errors import ConfigurationError, StorageError, WriterStateError
from ..journal import COMMIT_RECORD, COMMIT_V2, FOOTER, MAGIC
from ..journal_read import SUFFIX
from ..storage.atomic import sync_directory, sync_file
from ..storage.types import Buffer, strerror
from ..writers.base import DataWriter, PublishMode, PublishResult, WriterState
from .spool import Spool

__all__ = ["JournalSpool", "JournalWriter", "commit_journal"]


class JournalWriter(DataWriter):
    """Collects the writes of an in-place run in its journal (:mod:`.journal`):
    ``write(data, offset)`` appends ``data`` to the journal and plans it for
    ``offset`` of the file; :meth:`place` plans bytes already in the journal (spooled
    replacements). The journal is committed and applied by the in-place run, not by
    :meth:`publish`, which refuses."""

    def __init__(self, target: str, spool: JournalSpool) -> None:
        super().__init__(target)
        self.spool = spool
        #: ``(file offset, journal offset, size)`` of every planned write.
        self.ops: list[tuple[int, int, int]] = []

    def _write(self, data: memoryview, offset: int) -> None:
        at = self.spool.add(data)
        self.ops.append((offset, at, data.nbytes))

    def place(self, offset: int, journal_offset: int, size: int) -> None:
        self.ops.append((offset, journal_offset, size))

    def mark_published(self) -> None:
        self._state = WriterState.PUBLISHED

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        raise WriterStateError(
            f"{self.url}: an in-place run's writes are applied through its journal"
        )


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
            raise _create_error(path, exc) from exc
        self._file = os.fdopen(fd, "r+b")  # read and written with pread/pwrite only
        self._size = 0
        self.name = f"<journal {path}>"
        self._lock = threading.Lock()

    def add(self, data: Buffer) -> int:
        try:
            return super().add(data)
        except StorageError as exc:
            raise StorageError(f"{self.path}: {exc}") from exc.__cause__

    def start_writeback(self) -> None:
        """Start writing what the backends put here to disk now (a hint, no wait): it
        overlaps with the digest the commit waits for, so the commit's ``fsync`` has
        little left to do."""
        from .._libc import start_writeback

        start_writeback(self._file.fileno(), 0, self._size)

    def remove(self) -> None:
        """Close and remove the journal (a run that failed before its commit)."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _create_error(path: str, exc: OSError) -> StorageError | ConfigurationError:
    """The error for a journal that cannot be created: as any local file's
    (:func:`~ptestore._oserror.local_error`: a name too long is bad input, exit 2), and
    when the journal's name is over NAME_MAX, the model's own limit in place."""
    import errno

    error = local_error(exc, f"{path}: cannot create the journal: {strerror(exc)}")
    if exc.errno != errno.ENAMETOOLONG:
        return error
    directory, name = os.path.split(path)
    extra = len(os.fsencode(name)) - len(os.fsencode(name[1 : -len(SUFFIX)]))
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return error
    if len(os.fsencode(name)) > name_max > extra:  # the name, not the whole path
        return ConfigurationError(
            f"{error}; in place, the model's name is at most {name_max - extra} bytes (its "
            f"journal's, .NAME{SUFFIX}, is {extra} bytes longer): rename it, or specialize "
            "it to another file"
        )
    return error


def commit_journal(spool: JournalSpool, plan: dict[str, Any]) -> None:
    """Append the plan and the commit record and make the journal durable."""
    text = json.dumps(plan, sort_keys=True).encode()
    fd = spool.fileno()
    try:
        at = spool.add(text)
        footer = FOOTER.pack(MAGIC, at, len(text))
        spool.add(footer)
        # One fsync for all of it: the commit record carries the SHA-256 of the plan
        # and the footer, and the plan the digests of what the payload leaves in the
        # file (``plan["check"]``), so a journal torn by a power loss before this fsync
        # returned reads as uncommitted or damaged (and the file is touched only after
        # it returned).
        spool.add(COMMIT_RECORD.pack(COMMIT_V2, hashlib.sha256(text + footer).digest()))
        sync_file(fd)
        sync_directory(os.path.dirname(spool.path))
    except OSError as exc:
        raise StorageError(
            f"{spool.path}: cannot make the journal durable: {exc.strerror}; the model was "
            "not changed"
        ) from exc
