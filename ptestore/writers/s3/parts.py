"""The part grid: byte ``o`` belongs to part ``o // part_size`` (S3 number ``+ 1``).

Each :class:`Part` is in one explicit :class:`PartState`; its transitions are methods,
so "is it uploaded?" is a question about the state, never about which attribute is
``None``.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
from dataclasses import dataclass, field

__all__ = ["Part", "PartState", "UploadedPart"]


class PartState(enum.Enum):
    """Where a part's bytes are."""

    #: Nothing written yet (at publish: uploaded as zeros).
    EMPTY = "empty"
    #: In a memory buffer: partly written, or brought back to be rewritten.
    BUFFERED = "buffered"
    #: An upload is in flight (:attr:`Part.future`).
    UPLOADING = "uploading"
    #: Stored in the pending upload (:attr:`Part.uploaded`).
    UPLOADED = "uploaded"


@dataclass(frozen=True)
class UploadedPart:
    """What S3 stored for a part: its ETag, CRC-32 and length."""

    etag: str
    crc: int
    length: int


@dataclass
class Part:
    """One part of the grid and its state."""

    index: int
    state: PartState = PartState.EMPTY
    #: The bytes (``BUFFERED`` only), ``part_size`` long until publish trims it.
    buf: bytearray | None = None
    #: Written ranges relative to the part start: sorted, disjoint, merged.
    ranges: list[tuple[int, int]] = field(default_factory=list)
    #: The upload in flight (``UPLOADING`` only).
    future: cf.Future[UploadedPart] | None = None
    #: The stored copy (``UPLOADED`` only).
    uploaded: UploadedPart | None = None

    @property
    def in_storage(self) -> bool:
        """Uploaded or being uploaded: rewriting it needs the spool."""
        return self.state in (PartState.UPLOADING, PartState.UPLOADED)

    def buffer(self, part_size: int) -> bytearray:
        """The memory buffer, allocated (zeros) on the first write."""
        if self.state is PartState.EMPTY:
            self.buf = bytearray(part_size)
            self.state = PartState.BUFFERED
        if self.state is not PartState.BUFFERED or self.buf is None:
            raise RuntimeError(f"part {self.index + 1} is {self.state.value}, not buffered")
        return self.buf

    def add_range(self, start: int, end: int) -> None:
        out: list[tuple[int, int]] = []
        for s, e in self.ranges:
            if e < start or s > end:
                out.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        out.append((start, end))
        out.sort()
        self.ranges = out

    def covered(self) -> int:
        """Bytes of the part written so far."""
        return sum(e - s for s, e in self.ranges)

    def start_upload(self, future: cf.Future[UploadedPart]) -> None:
        self.buf = None
        self.uploaded = None
        self.future = future
        self.state = PartState.UPLOADING

    def finish_upload(self, result: UploadedPart) -> None:
        self.future = None
        self.uploaded = result
        self.state = PartState.UPLOADED

    def upload_failed(self) -> None:
        self.future = None
        self.state = PartState.EMPTY

    def reload(self, data: bytes, part_size: int) -> None:
        """Back into memory (from the spool) to be rewritten."""
        self.buf = bytearray(part_size)
        self.buf[: len(data)] = data
        self.ranges = [(0, len(data))]
        self.uploaded = None
        self.state = PartState.BUFFERED
