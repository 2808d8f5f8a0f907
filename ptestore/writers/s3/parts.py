"""The part grid: byte ``o`` belongs to part ``o // part_size`` (S3 number ``+ 1``).

Each :class:`Part` is in one explicit :class:`PartState`; its transitions are methods,
so "is it uploaded?" is a question about the state, never about which attribute is
``None``. A part's bytes are *written* (held in memory: a few small runs, or a
part-sized buffer) or *referenced* (:class:`Ref`: a range of an S3 object that the
service can copy); when the part is complete, :meth:`Part.content` hands both to the
task that stores it.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
from typing import TYPE_CHECKING

from ..._dataclass import dataclass, field

if TYPE_CHECKING:
    from ...storage._s3source import S3Source

__all__ = ["SPARSE_LIMIT", "Part", "PartContent", "PartState", "Ref", "UploadedPart"]

#: Written bytes a part keeps as separate runs before it allocates a part-sized buffer
#: (the zero padding between segments, metadata patches).
SPARSE_LIMIT = 64 << 10


class PartState(enum.Enum):
    """Where a part's bytes are."""

    #: Nothing written yet (at publish: uploaded as zeros).
    EMPTY = "empty"
    #: Source references and/or small written runs: no part-sized buffer.
    SPARSE = "sparse"
    #: In a memory buffer (plus any references): partly written, or brought back.
    BUFFERED = "buffered"
    #: An upload or server-side copy is in flight (:attr:`Part.future`).
    UPLOADING = "uploading"
    #: Stored in the pending upload (:attr:`Part.uploaded`).
    UPLOADED = "uploaded"


@dataclass(frozen=True)
class Ref:
    """Bytes ``[start, end)`` of a part are bytes ``[src_offset, src_offset + end -
    start)`` of ``source``."""

    start: int
    end: int
    source: S3Source
    src_offset: int

    @property
    def delta(self) -> int:
        """Source offset minus part offset: equal for ranges of one contiguous run."""
        return self.src_offset - self.start

    def outside(self, start: int, end: int) -> list[Ref]:
        """What remains of this reference outside ``[start, end)``."""
        out: list[Ref] = []
        if self.start < start:
            out.append(Ref(self.start, min(self.end, start), self.source, self.src_offset))
        if self.end > end:
            s = max(self.start, end)
            out.append(Ref(s, self.end, self.source, self.src_offset + s - self.start))
        return out


@dataclass(frozen=True)
class UploadedPart:
    """What S3 stored for a part: its ETag, checksum (of the writer's algorithm; None
    when a server-side copy came back without one) and length, and the source range when
    the service copied it."""

    etag: str
    crc: int | None
    length: int
    copied: Ref | None = None


@dataclass(frozen=True)
class PartContent:
    """A complete part as its storing task sees it (``length`` bytes)."""

    index: int
    length: int
    #: The part-sized buffer (``BUFFERED``), else None.
    buf: bytearray | None
    #: Small written runs (``SPARSE``): ``(start, bytes)``.
    runs: tuple[tuple[int, bytes], ...]
    #: Written ranges (in ``buf`` or ``runs``), clipped to ``length``.
    written: tuple[tuple[int, int], ...]
    refs: tuple[Ref, ...]

    def one_run(self) -> tuple[S3Source, int] | None:
        """``(source, delta)`` when every reference is one contiguous range of one
        source (the part is that range, except for the written bytes), else None."""
        if not self.refs or self.covered() < self.length:  # holes are zeros: not a copy
            return None
        first = self.refs[0]
        for r in self.refs[1:]:
            if r.source != first.source or r.delta != first.delta:
                return None
        src_start = first.delta
        if src_start < 0 or src_start + self.length > first.source.size:
            return None
        return first.source, first.delta

    def covered(self) -> int:
        """Bytes written or referenced (the rest are zeros)."""
        return self.written_bytes() + sum(r.end - r.start for r in self.refs)

    def written_bytes(self) -> int:
        return sum(e - s for s, e in self.written)

    def pieces(self) -> list[tuple[int, bytes]]:
        """The written bytes as ``(start, bytes)`` pieces (copies: keep them small)."""
        if self.buf is not None:
            return [(s, bytes(self.buf[s:e])) for s, e in self.written]
        return [(s, d[: max(0, self.length - s)]) for s, d in self.runs if s < self.length]

    def assemble(self) -> bytearray:
        """The part's bytes with the written ones in place (references not yet read)."""
        if self.buf is not None:
            buf = self.buf
            del buf[self.length :]
            return buf
        buf = bytearray(self.length)
        for start, data in self.runs:
            n = max(0, min(len(data), self.length - start))
            buf[start : start + n] = data[:n]
        return buf


def _cut(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in ranges:
        if s < start:
            out.append((s, min(e, start)))
        if e > end:
            out.append((max(s, end), e))
    return out


@dataclass
class Part:
    """One part of the grid and its state."""

    index: int
    state: PartState = PartState.EMPTY
    #: The bytes (``BUFFERED`` only), ``part_size`` long until publish trims it.
    buf: bytearray | None = None
    #: Small written runs (``SPARSE`` only): ``(start, bytes)``, disjoint.
    runs: list[tuple[int, bytes]] = field(default_factory=list)
    #: Written ranges relative to the part start: sorted, disjoint, merged.
    ranges: list[tuple[int, int]] = field(default_factory=list)
    #: Referenced source ranges, disjoint from ``ranges`` and from each other.
    refs: list[Ref] = field(default_factory=list)
    #: The upload in flight (``UPLOADING`` only).
    future: cf.Future[UploadedPart] | None = None
    #: The stored copy (``UPLOADED`` only).
    uploaded: UploadedPart | None = None

    @property
    def in_storage(self) -> bool:
        """Uploaded or being uploaded: rewriting it needs the spool."""
        return self.state in (PartState.UPLOADING, PartState.UPLOADED)

    @property
    def held(self) -> bool:
        """Waiting in memory (written bytes and/or references) for its upload."""
        return self.state in (PartState.SPARSE, PartState.BUFFERED)

    def buffer(self, part_size: int) -> bytearray:
        """The memory buffer, allocated (zeros, small runs copied in) on first use."""
        if self.state in (PartState.EMPTY, PartState.SPARSE):
            self.buf = bytearray(part_size)
            for start, data in self.runs:
                self.buf[start : start + len(data)] = data
            self.runs = []
            self.state = PartState.BUFFERED
        if self.state is not PartState.BUFFERED or self.buf is None:
            raise RuntimeError(f"part {self.index + 1} is {self.state.value}, not buffered")
        return self.buf

    def write(self, rel: int, data: memoryview, part_size: int) -> None:
        """Store written bytes at ``rel`` (they replace any reference there)."""
        end = rel + data.nbytes
        self.refs = [piece for r in self.refs for piece in r.outside(rel, end)]
        small = sum(len(d) for _, d in self.runs) + data.nbytes <= SPARSE_LIMIT
        overlaps = any(s < end and rel < e for s, e in self.ranges)
        if self.state in (PartState.EMPTY, PartState.SPARSE) and small and not overlaps:
            self.runs.append((rel, bytes(data)))
            self.state = PartState.SPARSE
        else:
            self.buffer(part_size)[rel:end] = data
        self.add_range(rel, end)

    def reference(self, ref: Ref) -> None:
        """Record that ``[ref.start, ref.end)`` is a source range (replacing what was
        written or referenced there)."""
        if self.state is PartState.EMPTY:
            self.state = PartState.SPARSE
        if not self.held:
            raise RuntimeError(f"part {self.index + 1} is {self.state.value}, not held")
        self.ranges = _cut(self.ranges, ref.start, ref.end)
        if self.runs:
            self.runs = self._trim_runs()
        self.refs = [piece for r in self.refs for piece in r.outside(ref.start, ref.end)]
        self.refs.append(ref)
        self.refs.sort(key=lambda r: r.start)

    def _trim_runs(self) -> list[tuple[int, bytes]]:
        """The runs clipped to the written ranges (a run keeps only written bytes)."""
        out: list[tuple[int, bytes]] = []
        for s, d in self.runs:
            for rs, re_ in self.ranges:
                a, b = max(s, rs), min(s + len(d), re_)
                if a < b:
                    out.append((a, d[a - s : b - s]))
        return out

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
        """Bytes of the part written or referenced so far."""
        return sum(e - s for s, e in self.ranges) + sum(r.end - r.start for r in self.refs)

    def content(self, length: int) -> PartContent:
        """The part as its storing task needs it (the first ``length`` bytes)."""
        written = tuple((s, min(e, length)) for s, e in self.ranges if s < length)
        refs = tuple(
            Ref(r.start, min(r.end, length), r.source, r.src_offset)
            for r in self.refs
            if r.start < length
        )
        return PartContent(self.index, length, self.buf, tuple(self.runs), written, refs)

    def start_upload(self, future: cf.Future[UploadedPart]) -> None:
        self.buf = None
        self.runs = []
        self.refs = []
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
        self.runs = []
        self.refs = []
        self.uploaded = None
        self.state = PartState.BUFFERED

    def rereference(self, ref: Ref) -> None:
        """Back to referencing the source range it was copied from, to be rewritten."""
        self.buf = None
        self.runs = []
        self.ranges = []
        self.refs = [ref]
        self.uploaded = None
        self.state = PartState.SPARSE
