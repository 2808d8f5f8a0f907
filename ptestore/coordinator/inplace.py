"""Specialize a local ``.pte`` in place, crash-safe, at about 1x disk; recover after a
crash. See :mod:`.journal` for the journal and the order of its steps.

Unchanged segments stay where they are. A replacement of the same size (whose
alignment its offset satisfies) is written over its segment; any other goes after the
last segment, and its old range is released (``fallocate(PUNCH_HOLE)`` where the file
system supports it). Only segment offsets/sizes in the FlatBuffer and the header sizes
change, as for every specialization; a program whose patched metadata would not fit
before its first segment cannot be changed in place (:class:`NotSupported`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._io import pread_all
from ..errors import (
    AlreadySpecialized,
    ConfigurationError,
    NotSupported,
)
from ..journal import (
    IDENT_RANGE,
    FileLock,
    PathLike,
    fsync_dir,
    journal_path,
    local_path,
    recover_locked,
)
from ..journal_binding import OtherFile, file_binding, file_stamps
from .inplace_commit import (
    Reservation,
    apply_uninterrupted,
    check_rewritable,
    check_size_limit,
    interrupted_message,
    modified_error,
    replaced_error,
)

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from .report import SpecializationReport

__all__ = [
    "apply_uninterrupted",
    "check_in_place_args",
    "specialize_in_place",
    "specialize_or_adopt",
]


def check_in_place_args(src: str, dst: str, ptd: object, mode: str, options: object) -> None:
    """What ``specialize(..., in_place=True)`` refuses, before any work."""
    target = local_path(src, "in-place specialization")
    if local_path(dst, "in-place specialization") != target:
        raise ConfigurationError(
            f"in_place=True rewrites the source itself: the destination must be the source "
            f"({src}), got {dst}"
        )
    if ptd is not None:
        raise ConfigurationError(
            f"{src}: in_place=True rewrites a .pte alone; a .pte/.ptd pair is specialized "
            "to new files"
        )
    if mode != "overwrite":
        raise ConfigurationError(
            f"{src}: in_place=True replaces the file: mode must be 'overwrite'"
        )
    if options:
        raise ConfigurationError(f"{src}: in_place=True takes no storage options (local files)")


def _final_digest(
    original: Any,
    journal: Any,
    size_before: int,
    content: int,
    punch: list[list[int]],
    writes: list[tuple[int, int, int]],
    recorded: Any = None,
) -> Any:
    """SHA-256/CRC-32 of ``[0, content)`` of the file once the journal is applied: the
    original's bytes (zeros past its end), the punched ranges zeroed (apply writes zeros
    where the file system cannot punch), then the journal's writes in order. Chunks the
    file keeps where they were take their digests from ``recorded`` (the chunk digests
    of its own trailer, or of its description: :func:`~ptestore.provenance.known.known_chunks`);
    those whose CRCs are known too are not read."""
    from ..journal_check import painted
    from ..provenance.chunks import reusable
    from ..provenance.digest import ContentHasher

    pieces = painted(size_before, content, punch, [list(w) for w in writes])
    # the original's own bytes where they were (neither zeros nor the journal's)
    kept = [(a, b) for a, b, src, o in pieces if src == "original"]
    known = {} if recorded is None else reusable(recorded.chunks, content, kept)
    rows = {} if recorded is None else recorded.crcs
    known_crcs = {i: rows[i] for i in known if i in rows}
    h = ContentHasher(content, known, known_crcs=known_crcs)
    sources = {"zeros": None, "original": original, "journal": journal}
    # ``o``: where the piece's first byte is in its source
    h.feed_pieces([(sources[src], o, b - a) for a, b, src, o in pieces])
    return h.digest()


def _payload_check(
    original: Any, journal: Any, plan: dict[str, Any], content: int, digest: Any
) -> dict[str, Any]:
    """``plan["check"]`` (:func:`~ptestore.journal_check.check_payload`): the chunk
    digests of ``[0, content)`` the writes touch, from the record's ``digest`` where
    the run made one (the same chunks), else read and hashed as ``recover`` will, and
    the SHA-256 of each write past the content (the trailer):
    :func:`~ptestore.journal_check.payload_digests`."""
    from ..journal_check import payload_check, payload_digests
    from ..provenance.chunks import chunk_size_for

    cs = chunk_size_for(content)
    names = {"original": original.name, "journal": journal.name}
    known = None if digest is None or digest.chunks is None else digest.chunks.digests
    fds = (original.fileno(), journal.fileno())
    return payload_check(content, cs, *payload_digests(*fds, plan, content, cs, names, known))


def _subtract(ranges: list[tuple[int, int]], live: list[tuple[int, int]]) -> list[list[int]]:
    """``[start, end)`` ranges minus the union of ``live`` ones, as ``[offset, size]``."""
    out: list[list[int]] = []
    for start, end in ranges:
        pieces = [(start, end)]
        for a, b in live:
            nxt = []
            for s, e in pieces:
                if b <= s or a >= e:
                    nxt.append((s, e))
                    continue
                if s < a:
                    nxt.append((s, a))
                if b < e:
                    nxt.append((b, e))
            pieces = nxt
        out += [[s, e - s] for s, e in pieces if e > s]
    return out


def specialize_in_place(
    path: PathLike,
    *,
    backends: Iterable[Any] | None = None,
    device: DeviceProfile | None = None,
    provenance: Any = True,
    event_tracer: Any = None,
    strict: bool = True,
) -> SpecializationReport:
    """Specialize the local ``.pte`` at ``path`` by rewriting it in place (see the
    module docstring); returns the :class:`~ptestore.coordinator.SpecializationReport`.
    As for every specialization, a run that specializes nothing raises
    :class:`~ptestore.errors.NothingSpecialized` unless ``strict=False``.

    The replacements and the new metadata go to a journal beside the file first (peak
    extra disk: about the replaced bytes plus the new metadata); the file is changed
    only after the journal is durable, and every failure before that leaves it as it
    was. A crash while it is changed leaves a file the ExecuTorch runtime refuses until
    :func:`recover` (or any later ``ensure``/``specialize``/``inspect``/``verify`` of the
    path) rolls the journal forward.

    A file that is already a specialized output (its provenance trailer records a run
    that changed it) is refused with :class:`~ptestore.errors.AlreadySpecialized`,
    unchanged: specializing it again would apply the backends to their own output."""
    report = specialize_or_adopt(
        path,
        None,
        backends=backends,
        device=device,
        provenance=provenance,
        event_tracer=event_tracer,
        strict=strict,
    )
    assert report is not None  # nothing is adopted without ``adoptable``
    return report


def specialize_or_adopt(
    path: PathLike,
    adoptable: Callable[[AlreadySpecialized], bool] | None,
    *,
    backends: Iterable[Any] | None = None,
    device: DeviceProfile | None = None,
    provenance: Any = True,
    event_tracer: Any = None,
    strict: bool = True,
) -> SpecializationReport | None:
    """:func:`specialize_in_place`, except that a file found already specialized once
    its lock is held (another call rewrote it while this one waited for the lock) is
    passed to ``adoptable`` (the refusal, its record in ``provenance``), asked while the
    lock is held: True, and None is returned (the file is adopted as it is, nothing
    run); False (or no ``adoptable``), and the refusal is raised. ``ensure(in_place=True)``
    adopts what a concurrent call with another cache made."""
    target = local_path(path, "in-place specialization")
    lock = FileLock(target)
    try:
        recover_locked(target)
        check_rewritable(target, os.fstat(lock.fd))
        try:
            return _run(target, backends, device, provenance, event_tracer, strict)
        except AlreadySpecialized as exc:  # raised before any work: the file unchanged
            if adoptable is None or not adoptable(exc):
                raise
            return None
    finally:
        lock.close()


def _run(
    target: str,
    backends: Iterable[Any] | None,
    device: DeviceProfile | None,
    provenance: Any,
    event_tracer: Any,
    strict: bool,
) -> SpecializationReport:
    from .._align import align_up
    from .._signals import signals_held
    from ..format.model import inferred_alignment
    from ..format.patch import patch_metadata
    from ..storage.loaders import LocalFileLoader
    from .aliases import check_aliases
    from .calls import run_backends
    from .journal_writer import JournalSpool, JournalWriter, commit_journal
    from .report import Event, FileReport
    from .respecialize import refuse_specialized_output
    from .rules import refuse_nothing_specialized, start_provenance
    from .run import Run, read_sources

    started = time.perf_counter()
    loader = LocalFileLoader(target)
    try:
        refuse_specialized_output(loader, target)
    except BaseException:
        loader.close()
        raise
    spool = JournalSpool(journal_path(target))
    committed = False
    stamper = None
    reservation: Reservation | None = None
    try:
        stamper = start_provenance(provenance, backends, device, [("pte", loader)])
        if stamper is not None:
            backends = stamper.backends
        writer = JournalWriter(target, spool)
        files = read_sources(loader, writer, None, None)
        f = files[0]
        c = f.container
        run = Run(files, spool, event_tracer)
        run.emit(Event("parsed", url=target))
        summary = run_backends(run, backends, device, stamper)
        if strict:
            refuse_nothing_specialized(summary)
        check_aliases(run)
        spool.start_writeback()
        base = c.segment_base_offset
        end = c.file_size  # the content end (a trailer, if any, is hidden)
        placements: list[tuple[int, int]] = []
        moved_old: list[tuple[int, int]] = []
        writes: list[tuple[int, int, int]] = []  # (absolute dst, journal offset, size)
        replaced = moved = replaced_bytes = 0
        cursor = end
        for seg in c.segments:
            reps = run.replacements.get(("pte", seg.index))
            if not reps:
                placements.append((seg.offset, seg.size))
                continue
            rep = reps[0]
            align = max(r.alignment for r in reps)
            old_abs = c.absolute(seg)
            replaced += 1 if rep.size else 0
            replaced_bytes += rep.size
            if rep.size == seg.size and old_abs % align == 0:
                placements.append((seg.offset, seg.size))
                absolute = old_abs
            else:
                align = max(align, inferred_alignment(old_abs) if base else 1)
                absolute = align_up(cursor, align)
                cursor = absolute + rep.size
                placements.append((absolute - base, rep.size))
                moved += 1
                moved_old.append((old_abs, old_abs + seg.size))
            if rep.size:
                writes.append((absolute, rep.spool_offset, rep.size))
        try:
            patched = patch_metadata(c, f.parsed.metadata, placements, segment_base_offset=base)
        except ConfigurationError as exc:
            raise NotSupported(
                f"{target}: cannot be specialized in place: the patched metadata does not "
                f"fit before the first segment at {base} ({exc}); specialize it to another "
                "file instead"
            ) from exc
        if not run.replacements:  # nothing to change: no rewrite, not even a trailer
            report = FileReport(
                "pte",
                target,
                target,
                c.file_size,
                c.file_size,
                len(c.segments),
                0,
                0,
                0,
                0,
                0,
                status="unchanged",
            )
            summary.files = [report]
            summary.seconds = time.perf_counter() - started
            return summary
        content = patched.file_size
        head = pread_all(loader.fileno(), len(patched.metadata), 0)
        if head != patched.metadata:  # the same offsets and sizes: the same bytes, kept
            writer.write(patched.metadata, 0)
        size = content
        for dst, jofs, n in writes:
            writer.place(dst, jofs, n)
        live = [(0, len(patched.metadata))] + [
            (base + off, base + off + n) for off, n in placements if n
        ]
        punch = _subtract(moved_old, live)
        size_before = os.fstat(loader.fileno()).st_size
        digest = None
        if stamper is not None:
            # The record names the bytes it follows, as for a staged output: those the
            # journal will leave in [0, content).
            from ..provenance.known import known_chunks

            stamper.wait_sources()  # the file's chunk digests, where it had to be read
            digest = _final_digest(
                loader, spool, size_before, content, punch, writer.ops, known_chunks(f.loader)
            )
            stamper.seal("pte", digest)
            trailer = stamper.trailer("pte")
            writer.write(trailer, content)
            size = content + len(trailer)
        plan: dict[str, Any] = {
            "target": target,
            "size_before": size_before,
            "size": size,
            "ident": bytes(patched.metadata[IDENT_RANGE[0] : IDENT_RANGE[1]]).hex(),
            "writes": [list(w) for w in writer.ops],
            "punch": punch,
            # The file it is for (recover refuses another): see journal_binding.check_target.
            "file": file_binding(loader.fileno(), size_before, head),
        }
        # What the payload must be (recover checks it): the chunks the writes touch, as
        # the record has them where there is one, and the trailer's SHA-256.
        plan["check"] = _payload_check(loader, spool, plan, content, digest)
        end = max([size, *(dst + n for dst, _, n in writer.ops)])
        text = len(json.dumps(plan, sort_keys=True)) + 512  # the stamps, footer, commit
        check_size_limit(target, spool.path, end, spool.size() + text)
        # Opened for writing first: a file made read-only meanwhile is refused as such (a
        # chmod moves its change time too, which the check would call a rewrite).
        reservation = Reservation(target, loader.fileno())
        loader.check_unchanged()  # size and times (change time included), up to here
        old = plan["size_before"]
        allocated = reservation.reserve(writer.ops, old, size, loader.check_unchanged)
        # What the apply checks the file against before marking it (a rewrite since,
        # the same inode, is refused): its times after the run's last change to it
        plan["file"].update(file_stamps(loader.fileno()))
        if allocated:
            reservation.check_size()  # its times moved: its size at least is the same
        else:
            loader.check_unchanged()  # its times too: not changed before the stamps
        # From the commit, the change is made to the end: Ctrl-C, SIGTERM, SIGHUP held
        with signals_held(interrupted_message(target)):
            commit_journal(spool, plan)
            committed = True
            reservation.close()
            spool.close()
            writer.mark_published()
            try:
                apply_uninterrupted(target, spool.path, plan)
            except OtherFile as exc:  # renamed over or rewritten: nothing applied
                spool.remove()
                fsync_dir(os.path.dirname(spool.path))
                ours = os.fstat(loader.fileno())
                if exc.rewritten:
                    was = plan["file"]
                    bound = (
                        f"{was['size_before']} bytes, modified {was['mtime_ns']} ns, "
                        f"changed {was['ctime_ns']} ns"
                    )
                    raise modified_error(target, bound, exc.now, "its journal removed") from exc
                raise replaced_error(target, ours, exc.now, "its journal removed") from exc
        from ..provenance.known import forget

        forget(loader)  # its bytes changed (within one tick of its modification time, maybe)
        # Once applied: a progress callback that raises cannot stop the change half-way
        run.emit(Event("write", nbytes=sum(w[2] for w in writer.ops), url=target))
        run.emit(Event("publish", url=target, seconds=time.perf_counter() - started))
        summary.files = [
            FileReport(
                role="pte",
                source=target,
                destination=target,
                size_before=plan["size_before"],
                size_after=content,
                segments=len(c.segments),
                segments_replaced=replaced,
                segments_moved=moved,
                redirected_tables=len(patched.redirected),
                bytes_copied=0,
                bytes_replaced=replaced_bytes,
                published_size=size,
                content_digest=None if digest is None else digest.sha256,
            )
        ]
        summary.seconds = time.perf_counter() - started
        return summary
    finally:
        if stamper is not None:
            stamper.close()  # a source description still running: stop it first
        loader.close()
        if not committed:
            if reservation is not None:
                reservation.release()  # the space allocated for the writes given back
            spool.remove()
