"""The writer of an in-place run: every write goes to the journal, as a planned write."""

from __future__ import annotations

from ..errors import WriterStateError
from ..writers.base import DataWriter, PublishMode, PublishResult, WriterState
from .journal import JournalSpool

__all__ = ["JournalWriter"]


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
