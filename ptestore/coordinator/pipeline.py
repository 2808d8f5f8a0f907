"""The one-time step: read, run backends, check, lay out, write, publish."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .._background import Background
from .._log import get_logger
from ..backends.api import BackendDataInitContext, BackendDataWriter, BackendInterface
from ..backends.passthrough import PassthroughBackend
from ..backends.registry import BackendLike, installed_backends
from ..errors import (
    BackendError,
    ConfigurationError,
    NothingSpecialized,
    NotSupported,
    describe_exception,
)
from ..format.layout import layout_file
from ..format.reader import read_container
from ..provenance.trailer import without_trailer
from ..storage.types import DataLoader
from ..writers.base import DataWriter, PublishMode, discard_all
from ..writers.local import LocalFileWriter
from .aliases import check_aliases
from .named import SourceFile
from .output import (
    ContentStore,
    FileLayout,
    is_identity,
    publish_in_order,
    publish_shared,
    stored_report,
    unchanged_report,
    write_file,
    write_shared,
)
from .report import (
    BackendReport,
    Event,
    EventTracer,
    FileReport,
    SpecializationReport,
    nothing_specialized_message,
)
from .selection import resolve_backends, why_unchanged
from .session import Run, Session
from .spool import Spool
from .targets import check_pair_targets, same_target

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..provenance.record import ContentDigest
    from ..provenance.stamp import ProvenanceRequest, Stamper

__all__ = ["initialize_and_save_backend_data"]

log = get_logger("ptestore.coordinator")


def initialize_and_save_backend_data(
    pte_loader: DataLoader,
    pte_writer: DataWriter,
    *,
    ptd_loader: DataLoader | None = None,
    ptd_writer: DataWriter | None = None,
    backends: Iterable[BackendLike] | None = None,
    event_tracer: EventTracer | None = None,
    mode: PublishMode = "overwrite",
    spool_dir: str | None = None,
    strict: bool | None = None,
    device: DeviceProfile | None = None,
    provenance: ProvenanceRequest | bool = True,
    allow_unchanged: bool = False,
    ptd_store: ContentStore | None = None,
) -> SpecializationReport:
    """Specialize a model once and publish the result through the given writers.

    1. **read** the .pte (and .ptd) metadata through their loaders (ranged reads only);
    2. **run backends**: every backend id of the program that has an implementation is
       called exactly once; replacements are validated as they arrive and spooled;
    3. **check** that every shared segment was replaced consistently;
    4. **lay out** each file again (:mod:`ptestore.format.layout`);
    5. **write** every byte once at its final location;
    6. check that the sources did not change, then **publish** the .ptd, then the .pte.

    Args:
        pte_loader: reads the source ``.pte`` (:func:`~ptestore.open_loader`).
        pte_writer: publishes the new ``.pte`` (:func:`~ptestore.open_writer`).
        ptd_loader: reads the source ``.ptd``; given together with ``ptd_writer``.
        ptd_writer: publishes the new ``.ptd``.
        backends: implementations (instances, classes or SPEC strings, see
            :mod:`ptestore.backends.registry`); None uses every installed backend
            (registered or entry point) whose ``name`` is a backend id in the program,
            whatever its registration is called.
        event_tracer: called with an :class:`Event` per step.
        mode: ``"overwrite"`` or ``"create"`` (refuse to replace an existing
            destination).
        spool_dir: where replacement bytes wait until layout.
        strict: the older spelling of ``allow_unchanged``: ``strict=False`` is
            ``allow_unchanged=True``; None (default) or True: the rule below.
        allow_unchanged: when nothing was specialized (no backend serves an id of the
            program, or every backend declined), publish an unchanged copy and report
            why (``report.specialized`` False) instead of raising
            :class:`~ptestore.errors.NothingSpecialized` before anything is written
            (the default, as the CLI without ``--allow-unchanged``). Naming
            ``passthrough`` explicitly asks for a copy and counts as done.
        device: the device profile (``DeviceProfile``) handed to every backend as
            ``context.device`` (CLI: ``--device``).
        provenance: True (the default) or a
            :class:`~ptestore.provenance.ProvenanceRequest`: each output ends with a
            provenance trailer (see :mod:`ptestore.provenance`); False writes none. A
            source's own trailer is never copied, so re-specializing an artifact
            replaces its trailer; an unchanged file whose destination is its source is
            not written at all, trailer or not.
        ptd_store: store the .ptd once, under the address of its bytes
            (:class:`~ptestore.coordinator.output.ContentStore`), instead of through
            ``ptd_writer`` (which is then discarded): when an object with its bytes is
            already there, nothing is written; else it is written there without a
            trailer (an output that reproduces its source as one copy of the source)
            and published with ``mode="create"``. The .pte's record names it by its
            SHA-256 (``ptd_output``).

    Returns:
        A :class:`SpecializationReport`; when no backend specialized anything,
        ``report.specialized`` is False and ``report.unchanged_reason``/``report.hint``
        say why.

    Raises:
        NothingSpecialized: nothing was specialized and ``allow_unchanged`` is False,
            before writing or publishing anything.
        BackendError: a backend failed, naming the backend, method and key (its own
            exception is the ``__cause__``); ``InvalidReplacement`` for a replacement
            that breaks the rules.
        StorageError: storage failures after retries; ``PartialPublish`` when the
            second publish fails after the first took effect.
        ConfigurationError: bad arguments, writers that are one destination, or a
            writer onto the other file's source.
        FormatError: a malformed source.

    On any failure every writer is discarded and the exception propagates.
    """
    if (ptd_loader is None) != (ptd_writer is None):
        raise ConfigurationError("ptd_loader and ptd_writer must be given together")
    if mode not in ("overwrite", "create"):
        raise ConfigurationError(f"mode must be 'overwrite' or 'create', got {mode!r}")
    strict = refuse_unchanged(strict, allow_unchanged)
    writers = [w for w in (pte_writer, ptd_writer) if w is not None]
    started = time.perf_counter()
    spool: Spool | None = None
    stamper: Stamper | None = None
    digests: dict[str, Background[ContentDigest]] = {}
    try:
        if ptd_loader is not None and ptd_writer is not None:
            check_pair_targets(pte_loader.name, pte_writer, ptd_loader.name, ptd_writer)
        if provenance:
            from ..provenance.stamp import ProvenanceRequest, Stamper

            request = provenance if isinstance(provenance, ProvenanceRequest) else None
            stamper = Stamper(request or ProvenanceRequest(), backends, device)
            backends = stamper.backends
            sources = [("pte", pte_loader)] + ([("ptd", ptd_loader)] if ptd_loader else [])
            stamper.describe_sources(sources)
        files = _read(pte_loader, pte_writer, ptd_loader, ptd_writer)
        log.info("read metadata in %.3f s", time.perf_counter() - started)
        spool = Spool(spool_dir if spool_dir is not None else _spool_home(pte_writer))
        run = Run(files, spool, event_tracer)
        run.emit(Event("parsed", url=pte_loader.name))
        summary = _run_backends(run, backends, device, stamper)
        if strict:
            refuse_nothing_specialized(summary)
        check_aliases(run)
        layouts = [_lay_out(run, f) for f in files]
        for f, lay in zip(files, layouts, strict=True):
            placements, patched = lay.placements, lay.patched
            moved = sum(
                1
                for seg, p in zip(f.container.segments, placements, strict=True)
                if (seg.offset, seg.size) != tuple(p)
            )
            log.info(
                "%s: layout: segment base %d (was %d), %d of %d segments moved, %d bytes",
                f.writer.url,
                patched.segment_base_offset,
                f.container.segment_base_offset,
                moved,
                len(placements),
                patched.file_size,
            )
        # A pass-through that changes nothing stays a no-op, provenance or not: an
        # unchanged file is neither rewritten nor given a trailer.
        unchanged = [_unchanged(run, f, lay, mode) for f, lay in zip(files, layouts, strict=True)]
        if stamper is not None:
            from ..provenance.stamp import object_metadata
            from .digest import planned_digest

            # The trailers name the bytes they follow (the .ptd first, the .pte's record
            # names it). A writer that keeps object metadata (S3) needs them before its
            # first write; otherwise each output is digested from its sources and the
            # spool while it is being written.
            ordered = sorted(zip(files, layouts, strict=True), key=lambda fl: fl[0].role != "ptd")
            if ptd_store is None and not any(f.writer.keeps_object_metadata for f in files):
                for f, lay in ordered:
                    work = functools.partial(planned_digest, run, f, lay)
                    digests[f.role] = Background("ptestore-digest-output", work)
            else:
                for f, lay in ordered:
                    sealed = stamper.seal(f.role, planned_digest(run, f, lay))
                    metadata = {**object_metadata(stamper.key(), device), **sealed}
                    f.writer.add_object_metadata(metadata)
        shared: tuple[ContentDigest, FileReport | None] | None = None
        if ptd_store is not None and len(files) > 1 and not unchanged[1]:
            from .digest import planned_digest

            content = (
                stamper.contents["ptd"]
                if stamper is not None
                else planned_digest(run, files[1], layouts[1])
            )
            found = ptd_store.find(content)
            files[1].writer.discard()
            if found is not None:
                shared = (content, stored_report(files[1], found, content))
            else:
                files[1].writer = ptd_store.writer(content)
                writers.append(files[1].writer)
                shared = (content, None)
        t_write = time.perf_counter()
        file_reports = _write(run, layouts, unchanged, shared)
        log.info(
            "wrote %d bytes in %.3f s",
            sum(r.size_after for r in file_reports),
            time.perf_counter() - t_write,
        )
        if stamper is not None:
            for role in ("ptd", "pte"):  # digested while written: seal in that order
                if role in digests:  # (left in digests until done: Ctrl-C cancels it)
                    stamper.seal(role, digests[role].result())
                    del digests[role]
            ends = [lay.patched.file_size for lay in layouts]
            stamper.write_trailers(
                [
                    (f.role, f.writer, end)
                    for f, end, same in zip(files, ends, unchanged, strict=True)
                    if not same and not (shared is not None and f.role == "ptd")
                ]
            )
        # A source replaced while we read it would mix two versions: check first.
        for f in files:
            f.loader.check_unchanged()
        t_publish = time.perf_counter()
        if ptd_store is not None and shared is not None and shared[1] is None:
            publish_shared(ptd_store, files[1], shared[0], file_reports[1])
        publish_in_order(run, files, mode, file_reports)
        log.info("published in %.3f s", time.perf_counter() - t_publish)
        summary.files = file_reports
        summary.seconds = time.perf_counter() - started
        return summary
    except BaseException:
        discard_all(writers)
        raise
    finally:
        for pending in digests.values():  # a run that failed: stop its digests
            pending.cancel()
        if stamper is not None:
            stamper.close()  # a source description still running (a run that failed)
        if spool is not None:
            spool.close()


def refuse_nothing_specialized(summary: SpecializationReport) -> None:
    """Raise :class:`~ptestore.errors.NothingSpecialized` when no backend specialized
    anything (before anything is written)."""
    if not summary.specialized:
        raise NothingSpecialized(
            nothing_specialized_message(summary) or "nothing was specialized",
            backend_ids=tuple(b.backend_id for b in summary.backends),
            installed=tuple(summary.installed_backends),
            hint=summary.hint,
        )


def refuse_unchanged(strict: bool | None, allow_unchanged: bool) -> bool:
    """Whether a run that specialized nothing raises ``NothingSpecialized`` (one rule
    for Python and the CLI: yes, unless ``allow_unchanged=True`` or ``strict=False``)."""
    if not isinstance(allow_unchanged, bool):
        raise ConfigurationError(f"allow_unchanged must be True or False, got {allow_unchanged!r}")
    if strict is not None and not isinstance(strict, bool):
        raise ConfigurationError(f"strict must be True, False or None, got {strict!r}")
    if strict and allow_unchanged:
        raise ConfigurationError(
            "strict=True and allow_unchanged=True contradict each other: pass one of them"
        )
    return not allow_unchanged and strict is not False


def _spool_home(writer: DataWriter) -> str | None:
    """Where the spool goes by default: the local destination's directory (its file
    system, so replacements reach the output in the kernel), else the temp dir."""
    return writer.directory if isinstance(writer, LocalFileWriter) else None


def _read(
    pte_loader: DataLoader,
    pte_writer: DataWriter,
    ptd_loader: DataLoader | None,
    ptd_writer: DataWriter | None,
) -> list[SourceFile]:
    # A trailer a source may end with is not part of its container: hide it.
    pte_loader = without_trailer(pte_loader)
    files = [SourceFile("pte", pte_loader, pte_writer, read_container(pte_loader))]
    if files[0].container.kind != "pte":
        raise ConfigurationError(f"{pte_loader.name}: expected a .pte, found a .ptd")
    if ptd_loader is not None and ptd_writer is not None:
        ptd_loader = without_trailer(ptd_loader)
        files.append(SourceFile("ptd", ptd_loader, ptd_writer, read_container(ptd_loader)))
        if files[1].container.kind != "ptd":
            raise ConfigurationError(f"{ptd_loader.name}: expected a .ptd, found a .pte")
    return files


def _run_backends(
    run: Run,
    backends: Iterable[BackendLike] | None,
    device: DeviceProfile | None,
    stamper: Stamper | None,
) -> SpecializationReport:
    """Run every backend; the report so far (no files yet), with why nothing was
    specialized if nothing was."""
    c = run.pte.container
    ids = list(dict.fromkeys(d.id for d in c.delegates))
    log.debug("backend ids in %s: %s", run.pte.loader.name, ids)
    sel = resolve_backends(backends, ids)
    reports: list[BackendReport] = []
    for bid in ids:
        impl = sel.impls.get(bid)
        report = BackendReport(bid, sel.labels.get(bid), "no_implementation")
        reports.append(report)
        if impl is not None:
            _run_backend(run, impl, bid, report, device, stamper)
    reason, hint = why_unchanged(
        sel, reports, has_ptd=len(run.files) > 1, pte_has_named_data=bool(c.named_data)
    )
    summary = SpecializationReport(
        reports, [], 0.0, unused_backends=sel.unused, source=run.pte.loader.name
    )
    if reason is not None:
        log.info("nothing specialized: %s", reason)
        summary.unchanged_reason, summary.hint = reason, hint
        summary.installed_backends = [i.describe() for i in installed_backends()]
    return summary


def _run_backend(
    run: Run,
    impl: BackendInterface,
    bid: str,
    report: BackendReport,
    device: DeviceProfile | None,
    stamper: Stamper | None,
) -> None:
    session = Session(run, bid, report)
    run.emit(Event("backend_start", backend=bid))
    t0 = time.perf_counter()
    context = BackendDataInitContext(session, device)
    try:
        try:
            # Typed to return None, but a generator function or an async def returns
            # an object whose body never ran: look at what really came back.
            call: Callable[..., object] = impl.initialize_backend_data
            try:
                result = call(context, BackendDataWriter(session))
            except NotSupported:
                _note(stamper, bid, impl, context)
                raise
            _note(stamper, bid, impl, context)
        finally:
            session.close()  # the context and writer are valid only during the call
        _check_returned(result, bid, report.implementation)
    except NotSupported as exc:
        report.status = "not_supported"
        report.reason = str(exc) or "NotSupported raised with no message"
    except (BackendError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # backend code is user code
        # SystemExit, GeneratorExit or a custom BaseException from a backend must not
        # end the program silently: it is a backend failure like any other.
        raise BackendError(
            f"initialize_backend_data failed: {describe_exception(exc)}",
            backend=bid,
            method=session.last_method,
            key=session.last_key,
            spec=report.implementation,
        ) from exc
    else:
        session.commit()
        if session.keys or session.blobs or isinstance(impl, PassthroughBackend):
            report.status = "specialized"
        else:  # writing nothing is declining (passthrough's whole job is to write nothing)
            report.status = "not_supported"
            report.reason = (
                f"returned without writing anything ({report.inputs_seen} delegate inputs "
                "seen); raise NotSupported('why') to say why"
            )
    finally:
        report.seconds = time.perf_counter() - t0
    log.info(
        "backend %s (%s): %s in %.3f s, %d inputs, %d keys and %d blobs replaced",
        bid,
        report.implementation,
        report.status,
        report.seconds,
        report.inputs_seen,
        len(report.keys_replaced),
        report.blobs_replaced,
    )
    run.emit(Event("backend_end", backend=bid, seconds=report.seconds, status=report.status))


def _note(
    stamper: Stamper | None, bid: str, impl: BackendInterface, context: BackendDataInitContext
) -> None:
    """Stamp the backend into the provenance while its context is still valid."""
    if stamper is not None:
        stamper.note(bid, impl, context)


def _check_returned(result: object, bid: str, spec: str | None) -> None:
    """``initialize_backend_data`` does its work during the call: a generator, coroutine
    or other awaitable returned instead means its body never ran."""
    kind = None
    if inspect.isgenerator(result):
        kind = "a generator (is initialize_backend_data a generator function?)"
    elif inspect.isasyncgen(result):
        kind = "an async generator"
    elif inspect.isawaitable(result):
        kind = "a coroutine or awaitable (is initialize_backend_data an async def?)"
    if kind is None:
        if result is None:
            return
        try:
            text = repr(result)
        except Exception:  # a hostile __repr__: the type says enough
            text = "(unprintable)"
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise BackendError(
            f"initialize_backend_data returned {type(result).__name__} {shown}, not None: "
            "a return value is ignored, so nothing it holds would reach the output; "
            "submit replacements with output.write_named_data(key, BackendData(...)) "
            "and output.write_processed_data(BackendData(...)), then return None",
            backend=bid,
            spec=spec,
        )
    if inspect.isgenerator(result) or inspect.iscoroutine(result):
        result.close()  # no "never awaited" warning; the body still never ran
    raise BackendError(
        f"initialize_backend_data returned {kind}, so its body never ran: it must do its "
        "work during the call and return None",
        backend=bid,
        spec=spec,
    )


def _lay_out(run: Run, f: SourceFile) -> FileLayout:
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


def _unchanged(run: Run, f: SourceFile, layout: FileLayout, mode: PublishMode) -> bool:
    """Nothing to do, nothing written: no replacement in ``f``, the same layout, and
    the destination is the source (``mode="create"`` still refuses it at publish)."""
    return (
        mode == "overwrite"
        and not any(role == f.role for role, _ in run.replacements)
        and same_target(f.loader.name, f.writer.url)
        and is_identity(f, layout)
    )


def _write(
    run: Run,
    layouts: list[FileLayout],
    unchanged: list[bool],
    shared: tuple[ContentDigest, FileReport | None] | None,
) -> list[FileReport]:
    """Write every output. With ``shared``, the .ptd goes to its content address:
    ``(content, report)`` of one already stored there (nothing to write), or
    ``(content, None)``: its writer is the content address's
    (:func:`~.output.write_shared`)."""
    total = sum(
        lay.patched.file_size for lay, same in zip(layouts, unchanged, strict=True) if not same
    )
    done = 0

    def note(url: str, nbytes: int) -> None:
        nonlocal done
        done += nbytes
        run.emit(Event("write", nbytes=nbytes, done=done, total=total, url=url))

    out = []
    for f, lay, same in zip(run.files, layouts, unchanged, strict=True):
        if same:
            out.append(unchanged_report(f))
        elif f.role == "ptd" and shared is not None and shared[1] is not None:
            out.append(shared[1])
        elif f.role == "ptd" and shared is not None:
            out.append(write_shared(run, f, lay, note))
        else:
            out.append(write_file(run, f, lay, note))
    return out
