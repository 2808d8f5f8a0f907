"""Writing and publishing: every byte of each output once, then the publishes in order."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from .._dataclass import dataclass
from ..errors import AlreadyExists, IntegrityError, PartialPublish
from ..format.layout import layout_file
from ..storage.types import DataLoader, loader_url
from ..writers.base import DataWriter, PublishMode, PublishResult
from .named import SourceFile
from .report import Event, FileReport
from .run import Run
from .targets import same_target

if TYPE_CHECKING:
    from ..format.layout import Placement
    from ..format.patch import PatchResult
    from ..provenance.record import ContentDigest
    from ..provenance.stamp import Stamper

    Role = Literal["pte", "ptd"]

__all__ = [
    "ContentStore",
    "Copy",
    "FileLayout",
    "is_identity",
    "is_unchanged",
    "lay_out",
    "planned_copies",
    "publish_in_order",
    "publish_shared",
    "stored_report",
    "trailer_bound",
    "unchanged_report",
    "write_file",
    "write_outputs",
    "write_shared",
]


class ContentStore(Protocol):
    """Where an output is stored once, under the address of its bytes (the fleet's
    shared .ptd files, :mod:`ptestore.fleet.shared`): such an output has no trailer
    of its own, the .pte's record names it by its SHA-256 (``ptd_output``)."""

    def find(self, content: ContentDigest) -> str | None:
        """The URL of a stored object whose bytes are ``content`` (checked, never
        trusted by name), or None when there is none."""
        ...

    def writer(self, content: ContentDigest) -> DataWriter:
        """A writer for ``content``'s address."""
        ...

    def publish_mode(self, content: ContentDigest) -> PublishMode:
        """How that writer publishes: ``"create"``, or ``"overwrite"`` over an object
        :meth:`find` found damaged."""
        ...


_ZEROS_CHUNK = 1 << 20


def _write_zeros(writer: DataWriter, offset: int, size: int) -> None:
    zeros = memoryview(bytes(min(size, _ZEROS_CHUNK)))
    done = 0
    while done < size:
        n = min(zeros.nbytes, size - done)
        writer.write(zeros[:n], offset + done)
        done += n


@dataclass(frozen=True)
class FileLayout:
    """Where everything of one output goes (see :func:`ptestore.format.layout.layout_file`)."""

    placements: list[Placement]
    patched: PatchResult
    #: The writer's clone granularity the layout kept unchanged segments congruent to.
    clone_block_size: int | None = None
    #: Bytes the congruence added to the file.
    clone_padding: int = 0


def is_identity(f: SourceFile, layout: FileLayout) -> bool:
    """Whether ``layout`` reproduces ``f``'s source exactly: same metadata, every
    segment where it was, same size."""
    c, patched = f.container, layout.patched
    return (
        patched.segment_base_offset == c.segment_base_offset
        and patched.file_size == c.file_size
        and all(layout.placements[s.index] == (s.offset, s.size) for s in c.segments)
        and bytes(patched.metadata) == bytes(f.parsed.metadata)
    )


def lay_out(run: Run, f: SourceFile) -> FileLayout:
    """The new layout of ``f``; unchanged segments kept congruent to the source modulo
    the writer's clone block size when it can clone from the source."""
    new_sizes = {
        index: (reps[0].size, max(r.alignment for r in reps))
        for (role, index), reps in run.replacements.items()
        if role == f.role
    }
    block = f.writer.clone_block_size(f.loader)
    placements, patched = layout_file(f.container, f.parsed.metadata, new_sizes, block_size=block)
    padding = 0
    if block is not None and new_sizes:
        compact = layout_file(f.container, f.parsed.metadata, new_sizes)[1]
        padding = max(0, patched.file_size - compact.file_size)
    return FileLayout(placements, patched, block, padding)


def is_unchanged(run: Run, f: SourceFile, layout: FileLayout, mode: PublishMode) -> bool:
    """Nothing to do, nothing written: no replacement in ``f``, the same layout, and
    the destination is the source (``mode="create"`` still refuses it at publish)."""
    return (
        mode == "overwrite"
        and not any(role == f.role for role, _ in run.replacements)
        and same_target(loader_url(f.loader), f.writer.url)  # the real URL, not the shown
        and is_identity(f, layout)
    )


@dataclass
class Copy:
    """``size`` bytes of ``source`` at ``src`` go to ``dst``."""

    dst: int
    size: int
    src: int
    source: DataLoader


def planned_copies(run: Run, f: SourceFile, layout: FileLayout) -> list[Copy]:
    """Every copy into the output, in destination order. Unchanged segments that lie
    as far apart in the output as in the source are one copy (the source's bytes
    between them included), so a passthrough is one copy (a clone where the writer
    can) of nearly the whole file."""
    c, base = f.container, layout.patched.segment_base_offset
    out: list[Copy] = []
    merging = False  # whether out[-1] is a run of unchanged segments
    order = sorted(c.segments, key=lambda s: (layout.placements[s.index][0], s.index))
    for seg in order:
        new_off, size = layout.placements[seg.index]
        dst = base + new_off
        reps = run.replacements.get((f.role, seg.index))
        if reps:
            merging = False
            if size:
                out.append(Copy(dst, size, reps[0].spool_offset, run.spool))
            continue
        if size == 0:
            continue
        src = c.absolute(seg)
        last = out[-1] if merging else None
        if last is not None and 0 <= src - (last.src + last.size) == dst - (last.dst + last.size):
            last.size = src + size - last.src
        else:
            out.append(Copy(dst, size, src, f.loader))
            merging = True
    return out


def write_file(
    run: Run,
    f: SourceFile,
    layout: FileLayout,
    note: Callable[[str, int], None],
    trailer: int = 0,
) -> FileReport:
    """Write ``f``'s new container through its writer; ``note(url, nbytes)`` is called
    as bytes are written. Unchanged segments are copied from the source, replaced ones
    from the spool, padding is zeros, and the patched metadata goes last. ``trailer``:
    the bytes of the provenance trailer written after it (:func:`trailer_bound`), which
    the room asked for before the first byte counts."""
    c = f.container
    placements, patched = layout.placements, layout.patched
    url = f.writer.url
    copied = replaced_bytes = moved = replaced_count = 0
    copies = planned_copies(run, f, layout)
    # Fail before the first byte when the storage says the output cannot fit (local:
    # statvfs); bytes a copy-on-write clone will share take no new space.
    cloned = sum(x.size for x in copies) if layout.clone_block_size else 0
    end = patched.file_size + trailer  # (a file-size limit counts the cloned bytes too)
    f.writer.ensure_space(end - cloned, end=end)

    # Padding is written as zeros too, so every byte of the output is written exactly
    # once (a writer that uploads fixed parts can then ship each part as soon as it is
    # complete, instead of holding parts with unwritten gaps until publish).
    spans = sorted([(0, len(patched.metadata))] + [(x.dst, x.dst + x.size) for x in copies])
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
        if run.replacements.get((f.role, seg.index)):
            replaced_bytes += size
            replaced_count += 1 if size else 0
        else:
            copied += size
    cloned_before = f.writer.bytes_cloned
    for x in copies:
        f.writer.copy_from(x.source, x.src, x.size, x.dst)
        note(url, x.size)
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
        clone_block_size=layout.clone_block_size,
        bytes_cloned=f.writer.bytes_cloned - cloned_before,
        clone_padding=layout.clone_padding,
    )


def unchanged_report(f: SourceFile) -> FileReport:
    """The report of a file left as it is (nothing replaced, destination = source)."""
    c = f.container
    return FileReport(
        role=f.role,
        source=f.loader.name,
        destination=f.writer.url,
        size_before=c.file_size,
        size_after=c.file_size,
        segments=len(c.segments),
        segments_replaced=0,
        segments_moved=0,
        redirected_tables=0,
        bytes_copied=0,
        bytes_replaced=0,
        status="unchanged",
    )


def trailer_bound(stamper: Stamper | None, role: Role, sizes: dict[str, int]) -> int:
    """The bytes of ``role``'s provenance trailer at most, asked for before the output's
    first byte (``sizes``: each output's content size, by role): none without
    provenance; its size where it is sealed already (a writer that keeps object
    metadata); else, once the sources are described (a source under 32 MiB is described
    before the backends run), the record as it stands and a bound of the digests the
    writes are still making (:func:`_digest_bound`); else the payload's limit
    (:data:`MAX_PAYLOAD_SIZE`, 1 MiB) and the footer."""
    if stamper is None:
        return 0
    if role in stamper.contents:
        return len(stamper.trailer(role))
    import json

    from ..provenance.trailer import FOOTER_SIZE, MAX_PAYLOAD_SIZE

    if not stamper.described():  # a large source still described: the payload's limit
        return MAX_PAYLOAD_SIZE + FOOTER_SIZE
    record = stamper.provenance(role).to_dict()  # no wait: every source is described
    try:
        text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        known = len(text.encode())
    except UnicodeEncodeError:  # refused when the trailer is encoded
        return MAX_PAYLOAD_SIZE + FOOTER_SIZE
    to_come = [sizes[role]]
    if role == "pte" and "ptd" in sizes and "ptd" not in stamper.contents:
        to_come.append(sizes["ptd"])  # the .pte's record names the .ptd's digest too
    return min(MAX_PAYLOAD_SIZE, known + sum(map(_digest_bound, to_come))) + FOOTER_SIZE


def _digest_bound(length: int) -> int:
    """The JSON of a content digest of ``length`` bytes at most (``content``,
    ``ptd_output``): its SHA-256, CRCs and sizes in 1 KiB with their keys, and the
    base64 of each chunk's SHA-256 (32 bytes) and CRCs (CRC-32, CRC-32C: 4 bytes;
    CRC64NVME: 8)."""
    from ..provenance.chunks import chunk_size_for

    n = -(-length // chunk_size_for(length)) if length else 0
    return 1024 + sum(4 * -(-k * n // 3) for k in (32, 4, 4, 8))


def write_shared(
    run: Run, f: SourceFile, layout: FileLayout, note: Callable[[str, int], None]
) -> FileReport:
    """Write ``f`` to its content address (``f.writer``): an output that reproduces
    its source is one copy of the source's bytes (the service copies them where it
    can, nothing goes through the client), any other is written as usual."""
    if is_identity(f, layout) and not any(role == f.role for role, _ in run.replacements):
        size = f.container.file_size
        f.writer.ensure_space(size)
        f.writer.copy_from(f.loader, 0, size, 0)
        note(f.writer.url, size)
        report = unchanged_report(f)
        report.destination = f.writer.url
        report.bytes_copied = size
    else:
        report = write_file(run, f, layout, note)  # a content address: no trailer
    report.status = "shared"
    return report


def stored_report(f: SourceFile, url: str, content: ContentDigest) -> FileReport:
    """The report of an output found already stored at its content address ``url``."""
    report = unchanged_report(f)
    report.destination = url
    report.size_after = report.published_size = content.size
    report.status = "stored"
    return report


def publish_shared(
    store: ContentStore, f: SourceFile, content: ContentDigest, report: FileReport
) -> None:
    """Publish ``f`` at its content address (``mode="create"`` unless the store found
    it damaged); when another writer stored it first, the object there is accepted only
    once :meth:`ContentStore.find` has checked its bytes."""
    try:
        result = f.writer.publish(store.publish_mode(content))
    except AlreadyExists:
        if store.find(content) is None:
            raise IntegrityError(
                f"{f.writer.url}: another writer stored an object at this content address, "
                f"but its bytes are not {content.sha256} ({content.size} bytes)"
            ) from None
        report.status = "stored"
        return
    report.published_size = result.size
    report.etag = result.etag
    report.version_id = result.version_id
    report.checksum = result.checksum


def publish_in_order(
    run: Run, files: Sequence[SourceFile], mode: PublishMode, reports: Sequence[FileReport]
) -> None:
    """Publish the .ptd (if any) first, then the .pte, recording in each file's report
    what its publish returned (size, ETag, version id, checksum).

    A file whose report says ``"unchanged"`` is not published: its writer is
    discarded and the source stays as it was; nor is one stored at its content
    address (``"shared"``, published by :func:`publish_shared`, or ``"stored"``).

    A crash between the two publishes leaves the old .pte, which a rerun from the
    original sources replaces (see docs/concepts.md); a failure of the second publish
    after the first took effect raises :class:`PartialPublish`.
    """
    by_role = {r.role: r for r in reports}
    todo = []
    for f in sorted(files, key=lambda f: 0 if f.role == "ptd" else 1):
        report = by_role.get(f.role)
        if report is not None and report.status in ("unchanged", "shared", "stored"):
            f.writer.discard()  # the source stays as it is: nothing to publish
        else:
            todo.append(f)
    published: list[str] = []
    for f in todo:
        report = by_role.get(f.role)
        t0 = time.perf_counter()
        try:
            result = f.writer.publish(mode)
            published.append(f.writer.url)
            if report is not None and isinstance(result, PublishResult):
                report.published_size = result.size
                report.etag = result.etag
                report.version_id = result.version_id
                report.checksum = result.checksum
            run.emit(Event("publish", url=f.writer.url, seconds=time.perf_counter() - t0))
        except BaseException as exc:  # an interrupt too, or a failing event tracer
            if not published or len(published) == len(todo):
                raise  # nothing published yet, or the whole pair
            rest = ", ".join(g.writer.url for g in todo[len(published) :])
            what = (
                f"but publishing {rest} failed"
                if f.writer.url not in published
                else f"then the run failed before publishing {rest}"
            )
            raise PartialPublish(
                f"{', '.join(published)} was published, {what}: "
                f"{exc or type(exc).__name__}; rerun from the original sources",
                published=tuple(published),
            ) from exc


def write_outputs(
    run: Run,
    layouts: list[FileLayout],
    unchanged: list[bool],
    shared: tuple[ContentDigest, FileReport | None] | None,
    stamper: Stamper | None = None,
) -> list[FileReport]:
    """Write every output. With ``shared``, the .ptd goes to its content address:
    ``(content, report)`` of one already stored there (nothing to write), or
    ``(content, None)``: its writer is the content address's
    (:func:`write_shared`)."""
    total = sum(
        lay.patched.file_size for lay, same in zip(layouts, unchanged, strict=True) if not same
    )
    done = 0

    def note(url: str, nbytes: int) -> None:
        nonlocal done
        done += nbytes
        run.emit(Event("write", nbytes=nbytes, done=done, total=total, url=url))

    sizes: dict[str, int] = {
        f.role: lay.patched.file_size for f, lay in zip(run.files, layouts, strict=True)
    }
    out = []
    for f, lay, same in zip(run.files, layouts, unchanged, strict=True):
        if same:
            out.append(unchanged_report(f))
        elif f.role == "ptd" and shared is not None and shared[1] is not None:
            out.append(shared[1])
        elif f.role == "ptd" and shared is not None:
            out.append(write_shared(run, f, lay, note))
        else:
            out.append(write_file(run, f, lay, note, trailer_bound(stamper, f.role, sizes)))
    return out
