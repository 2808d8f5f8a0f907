"""Writing and publishing: every byte of each output once, then the publishes in order."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..errors import PartialPublish
from ..format.layout import Placement
from ..format.patch import PatchResult
from ..writers.base import DataWriter, PublishMode, PublishResult
from .named import SourceFile
from .report import Event, FileReport
from .session import Run

__all__ = ["publish_in_order", "write_file"]

_ZEROS_CHUNK = 1 << 20


def _write_zeros(writer: DataWriter, offset: int, size: int) -> None:
    zeros = memoryview(bytes(min(size, _ZEROS_CHUNK)))
    done = 0
    while done < size:
        n = min(zeros.nbytes, size - done)
        writer.write(zeros[:n], offset + done)
        done += n


def write_file(
    run: Run,
    f: SourceFile,
    layout: tuple[list[Placement], PatchResult],
    note: Callable[[str, int], None],
) -> FileReport:
    """Write ``f``'s new container through its writer; ``note(url, nbytes)`` is called
    as bytes are written. Unchanged segments are copied from the source, replaced ones
    from the spool, padding is zeros, and the patched metadata goes last."""
    c = f.container
    placements, patched = layout
    base = patched.segment_base_offset
    url = f.writer.url
    copied = replaced_bytes = moved = replaced_count = 0

    # Padding is written as zeros too, so every byte of the output is written exactly
    # once (a writer that uploads fixed parts can then ship each part as soon as it is
    # complete, instead of holding parts with unwritten gaps until publish).
    spans = sorted(
        [(0, len(patched.metadata))]
        + [(base + off, base + off + size) for off, size in placements if size]
    )
    cursor = 0
    for start, end in [*spans, (patched.file_size, patched.file_size)]:
        if start > cursor:
            _write_zeros(f.writer, cursor, start - cursor)
            note(url, start - cursor)
        cursor = max(cursor, end)

    for seg in c.segments:
        new_off, size = placements[seg.index]
        if new_off != seg.offset or size != seg.size:
            moved += 1
        if size == 0:
            continue
        reps = run.replacements.get((f.role, seg.index))
        if reps:
            rep = reps[0]
            f.writer.copy_from(run.spool, rep.spool_offset, rep.size, base + new_off)
            replaced_bytes += rep.size
            replaced_count += 1
        else:
            f.writer.copy_from(f.loader, c.absolute(seg), size, base + new_off)
            copied += size
        note(url, size)
    f.writer.write(patched.metadata, 0)
    note(url, len(patched.metadata))
    return FileReport(
        role=f.role,
        source=f.loader.name,
        destination=url,
        size_before=c.file_size,
        size_after=patched.file_size,
        segments=len(c.segments),
        segments_replaced=replaced_count,
        segments_moved=moved,
        redirected_tables=len(patched.redirected),
        bytes_copied=copied,
        bytes_replaced=replaced_bytes,
    )


def publish_in_order(
    run: Run, files: Sequence[SourceFile], mode: PublishMode, reports: Sequence[FileReport]
) -> None:
    """Publish the .ptd (if any) first, then the .pte, recording in each file's report
    what its publish returned (size, ETag, version id, checksum).

    A crash between the two publishes leaves the old .pte, which a rerun from the
    original sources replaces (see docs/concepts.md); a failure of the second publish
    after the first took effect raises :class:`PartialPublish`.
    """
    published: list[str] = []
    by_role = {r.role: r for r in reports}
    for f in sorted(files, key=lambda f: 0 if f.role == "ptd" else 1):
        t0 = time.perf_counter()
        try:
            result = f.writer.publish(mode)
        except BaseException as exc:  # an interrupt too: the first file is published
            if published:
                raise PartialPublish(
                    f"{', '.join(published)} was published, but publishing "
                    f"{f.writer.url} failed: {exc}; rerun from the original sources",
                    published=tuple(published),
                ) from exc
            raise
        published.append(f.writer.url)
        report = by_role.get(f.role)
        if report is not None and isinstance(result, PublishResult):
            report.published_size = result.size
            report.etag = result.etag
            report.version_id = result.version_id
            report.checksum = result.checksum
        run.emit(Event("publish", url=f.writer.url, seconds=time.perf_counter() - t0))
