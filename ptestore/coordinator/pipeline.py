"""The one-time step: read, run backends, check, lay out, write, publish."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._background import Background
from .._dataclass import dataclass
from .._log import get_logger
from ..errors import ConfigurationError
from ..storage.types import DataLoader, loader_url
from ..writers.base import DataWriter, PublishMode, discard_all
from ..writers.local import LocalFileWriter
from .aliases import check_aliases
from .calls import run_backends
from .output import (
    ContentStore,
    FileLayout,
    is_unchanged,
    lay_out,
    publish_in_order,
    publish_shared,
    stored_report,
    write_outputs,
)
from .report import (
    Event,
    EventTracer,
    FileReport,
    SpecializationReport,
)
from .rules import (
    check_run_arguments,
    refuse_nothing_specialized,
    refuse_unchanged,
    start_provenance,
)
from .run import Run, read_sources
from .spool import Spool
from .targets import check_pair_targets

if TYPE_CHECKING:
    import threading

    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..provenance.record import ContentDigest
    from ..provenance.stamp import ProvenanceRequest, Stamper
    from .named import SourceFile

__all__ = [
    "RunOptions",
    "initialize_and_save_backend_data",
    "refuse_nothing_specialized",
    "refuse_unchanged",
    "start_provenance",
]

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

    On any failure every writer is discarded and the exception propagates. The keyword
    arguments are one :class:`RunOptions` record inside (checked when made).
    """
    if (ptd_loader is None) != (ptd_writer is None):
        raise ConfigurationError("ptd_loader and ptd_writer must be given together")
    options = RunOptions(
        backends=backends,
        event_tracer=event_tracer,
        mode=mode,
        spool_dir=spool_dir,
        strict=strict,
        device=device,
        provenance=provenance,
        allow_unchanged=allow_unchanged,
        ptd_store=ptd_store,
    )
    return _Pipeline(pte_loader, pte_writer, ptd_loader, ptd_writer, options).run()


@dataclass(frozen=True)
class RunOptions:
    """The options of one run (the keyword arguments of
    :func:`initialize_and_save_backend_data`, which documents each), checked when made:
    ``mode`` is ``"overwrite"`` or ``"create"``, ``strict`` and ``allow_unchanged`` agree
    (:func:`refuse_unchanged`)."""

    backends: Iterable[BackendLike] | None = None
    event_tracer: EventTracer | None = None
    mode: PublishMode = "overwrite"
    spool_dir: str | None = None
    strict: bool | None = None
    device: DeviceProfile | None = None
    provenance: ProvenanceRequest | bool = True
    allow_unchanged: bool = False
    ptd_store: ContentStore | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("overwrite", "create"):
            raise ConfigurationError(f"mode must be 'overwrite' or 'create', got {self.mode!r}")
        refuse_unchanged(self.strict, self.allow_unchanged)
        from .._args import backends_argument

        backends_argument(self.backends)
        check_run_arguments(self.device, self.provenance, self.event_tracer)

    @property
    def refuses_unchanged(self) -> bool:
        """A run that specialized nothing raises ``NothingSpecialized``."""
        return refuse_unchanged(self.strict, self.allow_unchanged)


def _digest_after_sources(
    stamper: Stamper, run: Run, f: SourceFile, layout: FileLayout, cancelled: threading.Event
) -> ContentDigest:
    """The output's digest once its sources are described: the chunks it keeps from
    them are then known (:mod:`ptestore.provenance.known`), not read twice."""
    from .digest import planned_digest

    stamper.wait_sources()
    return planned_digest(run, f, layout, cancelled)


class _Pipeline:
    """One run: its state, and a method per step; :meth:`run` lists them in order and
    discards every writer on any failure."""

    def __init__(
        self,
        pte_loader: DataLoader,
        pte_writer: DataWriter,
        ptd_loader: DataLoader | None,
        ptd_writer: DataWriter | None,
        options: RunOptions,
    ) -> None:
        self.options = options
        self.sources = [("pte", pte_loader, pte_writer)]
        if ptd_loader is not None and ptd_writer is not None:
            self.sources.append(("ptd", ptd_loader, ptd_writer))
        self.writers = [w for _, _, w in self.sources]
        self.backends = options.backends
        self.started = time.perf_counter()
        self.spool: Spool | None = None
        self.stamper: Stamper | None = None
        #: outputs digested while they are written (left here until done: a failed run
        #: cancels them)
        self.digests: dict[str, Background[ContentDigest]] = {}
        #: with a ``ptd_store``: the .ptd's content, and the report of the object already
        #: stored under its address (None: it is written there)
        self.shared: tuple[ContentDigest, FileReport | None] | None = None

    def run(self) -> SpecializationReport:
        try:
            self.check_targets()
            self.start_provenance()
            run = self.read()
            summary = run_backends(run, self.backends, self.options.device, self.stamper)
            if self.options.refuses_unchanged:
                refuse_nothing_specialized(summary)
            check_aliases(run)
            layouts = self.lay_out(run)
            # A pass-through that changes nothing stays a no-op, provenance or not: an
            # unchanged file is neither rewritten nor given a trailer.
            mode = self.options.mode
            unchanged = [
                is_unchanged(run, f, lay, mode) for f, lay in zip(run.files, layouts, strict=True)
            ]
            self.plan_digests(run, layouts)
            self.find_shared_ptd(run, layouts, unchanged)
            reports = self.write(run, layouts, unchanged)
            self.write_trailers(run, layouts, unchanged)
            self.publish(run, reports)
            summary.files = reports
            summary.seconds = time.perf_counter() - self.started
            return summary
        except BaseException:
            discard_all(self.writers)
            raise
        finally:
            # A run that failed: its digests told to stop first (none starts hashing once
            # its sources are described), then the source descriptions stopped (a digest
            # waits for them: joined first, it waited for the whole source to be read),
            # then the digests joined.
            for pending in self.digests.values():
                pending.cancelled.set()
            if self.stamper is not None:
                self.stamper.close()  # a source description still running (a failed run)
            for pending in self.digests.values():
                pending.cancel()
            if self.spool is not None:
                self.spool.close()

    def check_targets(self) -> None:
        """No destination is a source or the other destination."""
        if len(self.sources) > 1:
            (_, pte_loader, pte_writer), (_, ptd_loader, ptd_writer) = self.sources
            # compared by the URLs read, not the names shown (credentials redacted)
            pte_url, ptd_url = loader_url(pte_loader), loader_url(ptd_loader)
            check_pair_targets(pte_url, pte_writer, ptd_url, ptd_writer)

    def start_provenance(self) -> None:
        sources = [(role, loader) for role, loader, _ in self.sources]
        o = self.options
        self.stamper = start_provenance(o.provenance, self.backends, o.device, sources)
        if self.stamper is not None:
            self.backends = self.stamper.backends

    def read(self) -> Run:
        """Read the sources' metadata; the run's spool and state."""
        (_, pte_loader, pte_writer), *ptd = self.sources
        ptd_loader, ptd_writer = (ptd[0][1], ptd[0][2]) if ptd else (None, None)
        files = read_sources(pte_loader, pte_writer, ptd_loader, ptd_writer)
        log.info("read metadata in %.3f s", time.perf_counter() - self.started)
        spool_dir = self.options.spool_dir
        self.spool = Spool(spool_dir if spool_dir is not None else _spool_home(pte_writer))
        run = Run(files, self.spool, self.options.event_tracer)
        run.emit(Event("parsed", url=pte_loader.name))
        return run

    def lay_out(self, run: Run) -> list[FileLayout]:
        layouts = [lay_out(run, f) for f in run.files]
        for f, lay in zip(run.files, layouts, strict=True):
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
        return layouts

    def plan_digests(self, run: Run, layouts: list[FileLayout]) -> None:
        """The trailers name the bytes they follow (the .ptd first, the .pte's record
        names it). A writer that keeps object metadata (S3) needs them before its first
        write; otherwise each output is digested from its sources and the spool while it
        is being written."""
        stamper = self.stamper
        if stamper is None:
            return
        from ..provenance.stamp import object_metadata
        from .digest import planned_digest

        files = run.files
        ordered = sorted(zip(files, layouts, strict=True), key=lambda fl: fl[0].role != "ptd")
        if self.options.ptd_store is None and not any(
            f.writer.keeps_object_metadata for f in files
        ):
            for f, lay in ordered:
                work = functools.partial(_digest_after_sources, stamper, run, f, lay)
                self.digests[f.role] = Background("ptestore-digest-output", work)
        else:
            stamper.wait_sources()
            for f, lay in ordered:
                sealed = stamper.seal(f.role, planned_digest(run, f, lay))
                metadata = {**object_metadata(stamper.key(), self.options.device), **sealed}
                f.writer.add_object_metadata(metadata)

    def find_shared_ptd(self, run: Run, layouts: list[FileLayout], unchanged: list[bool]) -> None:
        """With a ``ptd_store``: is the .ptd's content already stored? Its own writer is
        discarded either way; the content address's writer takes its place if not."""
        store, files = self.options.ptd_store, run.files
        if store is None or len(files) < 2 or unchanged[1]:
            return
        from .digest import planned_digest

        content = (
            self.stamper.contents["ptd"]
            if self.stamper is not None
            else planned_digest(run, files[1], layouts[1])
        )
        found = store.find(content)
        files[1].writer.discard()
        if found is not None:
            self.shared = (content, stored_report(files[1], found, content))
        else:
            files[1].writer = store.writer(content)
            self.writers.append(files[1].writer)
            self.shared = (content, None)

    def write(self, run: Run, layouts: list[FileLayout], unchanged: list[bool]) -> list[FileReport]:
        t_write = time.perf_counter()
        reports = write_outputs(run, layouts, unchanged, self.shared, self.stamper)
        log.info(
            "wrote %d bytes in %.3f s",
            sum(r.size_after for r in reports),
            time.perf_counter() - t_write,
        )
        return reports

    def write_trailers(self, run: Run, layouts: list[FileLayout], unchanged: list[bool]) -> None:
        stamper = self.stamper
        if stamper is None:
            return
        for role in ("ptd", "pte"):  # digested while written: seal in that order
            if role in self.digests:  # (left in digests until done: Ctrl-C cancels it)
                stamper.seal(role, self.digests[role].result())
                del self.digests[role]
        ends = [lay.patched.file_size for lay in layouts]
        stamper.write_trailers(
            [
                (f.role, f.writer, end)
                for f, end, same in zip(run.files, ends, unchanged, strict=True)
                if not same and not (self.shared is not None and f.role == "ptd")
            ]
        )

    def publish(self, run: Run, reports: list[FileReport]) -> None:
        """Check that the sources did not change, then publish the .ptd, then the .pte."""
        # A source replaced while we read it would mix two versions: check first.
        for f in run.files:
            f.loader.check_unchanged()
        t_publish = time.perf_counter()
        store, shared = self.options.ptd_store, self.shared
        if store is not None and shared is not None and shared[1] is None:
            publish_shared(store, run.files[1], shared[0], reports[1])
        publish_in_order(run, run.files, self.options.mode, reports)
        log.info("published in %.3f s", time.perf_counter() - t_publish)
        if self.stamper is not None:
            for report in reports:
                content = self.stamper.contents.get(report.role)
                if content is not None and report.status != "unchanged":
                    report.content_digest = content.sha256


def _spool_home(writer: DataWriter) -> str | None:
    """Where the spool goes by default: the local destination's directory (its file
    system, so replacements reach the output in the kernel), else the temp dir."""
    return writer.directory if isinstance(writer, LocalFileWriter) else None
