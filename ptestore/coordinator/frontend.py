"""The URL front end: check the targets and options of a run, then hand it to the pair
runner (:func:`~ptestore.coordinator.pair.specialize_pair`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._args import backends_argument, flag_argument, pair_argument, path_argument
from ..errors import AlreadyExists, ObjectNotFound
from ..storage.loaders import open_loader
from ..storage.routing import StorageOptions
from .report import EventTracer, SpecializationReport
from .rules import check_run_arguments, refuse_unchanged

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..provenance.stamp import ProvenanceRequest
    from ..writers.base import PublishMode

__all__ = ["specialize"]

PathOrUrl = str | os.PathLike[str]


def specialize(
    src_url: PathOrUrl,
    dst_url: PathOrUrl,
    *,
    ptd: tuple[PathOrUrl, PathOrUrl] | None = None,
    backends: Iterable[BackendLike] | None = None,
    mode: PublishMode = "overwrite",
    event_tracer: EventTracer | None = None,
    storage_options: dict[str, Any] | None = None,
    src_storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    spool_dir: str | None = None,
    strict: bool | None = None,
    device: DeviceProfile | None = None,
    provenance: ProvenanceRequest | bool = True,
    allow_unchanged: bool = False,
    in_place: bool = False,
) -> SpecializationReport:
    """Specialize the model at ``src_url`` and publish it at ``dst_url``.

    Args:
        src_url: the source ``.pte``: a local path or fsspec URL (``file://``,
            ``memory://``, ``s3://``, ...).
        dst_url: where to publish the result, atomically. It may equal ``src_url``: the
            original is then replaced.
        ptd: ``(src_ptd_url, dst_ptd_url)`` rewrites the model's external weights too.
            In-place is refused for pairs (a crash between the two publishes would
            leave a mismatched pair), and so is any destination that is the other
            file's source or the other destination (paths compared with symlinks
            resolved, URLs normalized), all before any work.
        backends: the implementations to run, each an instance, a class or a SPEC
            string ``REF[@BACKEND_ID][=ARGUMENT]`` where REF is a registered or
            entry-point name (``ptestore backends`` lists them) or
            ``package.module:attr``. ``None``: every installed backend whose ``name``
            is a backend id of the program.
        mode: ``"overwrite"`` replaces an existing destination; ``"create"`` refuses
            to (checked before any work, and again by the no-clobber publish).
        event_tracer: called with an :class:`~ptestore.coordinator.report.Event` per
            step (backend inputs and replacements, bytes written, publish).
        storage_options: options for every remote URL that accepts them (writer
            options such as ``part_size`` reach the destinations only); an option no
            URL accepts is refused.
        src_storage_options: options for the sources only (override
            ``storage_options``).
        dst_storage_options: options for the destinations only (override
            ``storage_options``).
        spool_dir: where replacement bytes wait until the layout is known (default:
            the system temporary directory).
        strict: the older spelling of ``allow_unchanged``: ``strict=False`` is
            ``allow_unchanged=True``.
        allow_unchanged: when nothing was specialized, publish an unchanged copy and
            report why (``report.specialized`` False) instead of raising
            :class:`~ptestore.errors.NothingSpecialized` before anything is written
            (the default, as in the CLI; ``--allow-unchanged`` there).
        device: the device profile (``DeviceProfile``) handed to every backend as
            ``context.device`` (CLI: ``--device``).
        provenance: True (the default) or a
            :class:`~ptestore.provenance.ProvenanceRequest`: each output ends with a
            provenance trailer (see :mod:`ptestore.provenance`), what lets ``verify``,
            the fleet and ``ensure`` tell it current or stale; False writes none (CLI:
            ``--no-provenance``). A source's own trailer is never copied, so
            re-specializing an artifact replaces its trailer; a pass-through that changes
            nothing (the destination is the source) still writes nothing.
        in_place: rewrite the local file ``src_url`` (= ``dst_url``) itself, through a
            journal beside it, at about 1x disk (see docs/device.md and
            :func:`ptestore.recover`); no ``.ptd``, no storage options.

    Returns:
        A :class:`~ptestore.coordinator.report.SpecializationReport`: one entry per
        backend id (status, implementation spec, keys replaced, bytes, seconds), one
        per file (sizes, segments replaced and moved, and what the publish returned:
        size, ETag, version id, checksum), and when nothing was specialized
        ``specialized == False`` with ``unchanged_reason`` and ``hint``.

    Raises:
        NothingSpecialized: no backend specialized anything (unless
            ``allow_unchanged=True``).
        ConfigurationError: bad arguments: an unknown backend or URL scheme, an option
            that applies to no URL, colliding destinations.
        FormatError: a malformed source.
        ObjectNotFound: a missing source.
        AlreadyExists: ``mode="create"`` and a destination exists.
        PermissionDenied: credentials or access refused.
        BackendError: a backend failed or broke the rules (``InvalidReplacement``),
            naming the backend, method and key; its own exception is the ``__cause__``.
        StorageError: I/O failed after retries; ``PublishUncertain`` when a publish may
            or may not have taken effect, ``IntegrityError`` when the stored object does
            not match, ``PartialPublish`` when the ``.ptd`` was published and the
            ``.pte`` was not.

    Nothing is published unless the whole run succeeds (``PartialPublish`` aside).
    """
    strict = refuse_unchanged(strict, allow_unchanged)
    src_url = path_argument(src_url, "src_url")
    dst_url = path_argument(dst_url, "dst_url")
    backends_argument(backends)
    if ptd is not None:
        src_ptd, dst_ptd = pair_argument(ptd, "ptd", "(src_ptd, dst_ptd)")
        ptd = (path_argument(src_ptd, "ptd[0]"), path_argument(dst_ptd, "ptd[1]"))
    flag_argument(in_place, "in_place")
    check_run_arguments(device, provenance, event_tracer)
    from ..journal import recover_if_local

    recover_if_local(os.fspath(src_url))  # an interrupted in-place run: finish it first
    if in_place:
        from .inplace import check_in_place_args, specialize_in_place

        src = os.fspath(src_url)
        given = storage_options or src_storage_options or dst_storage_options
        check_in_place_args(src, os.fspath(dst_url), ptd, mode, given)
        return specialize_in_place(
            src,
            backends=backends,
            device=device,
            provenance=provenance,
            event_tracer=event_tracer,
            strict=strict,
        )
    from .pair import specialize_pair, split_pairs  # here: in place needs neither
    from .targets import check_targets

    options = StorageOptions(storage_options, src=src_storage_options, dst=dst_storage_options)
    pairs = split_pairs(src_url, dst_url, ptd)
    # Before any work, and before the create-mode probes: no destination may be a
    # source or the other destination.
    check_targets(pairs[0], pairs[1] if ptd is not None else None)
    options.check([s for s, _ in pairs], [d for _, d in pairs])
    _check_dst_options(options, [d for _, d in pairs])
    if mode == "create":
        # Fail before any work (and before a .ptd is published) when a destination
        # exists; the writers' no-clobber publish still guards against races.
        for _, d in pairs:
            try:
                probe = open_loader(d, **options.for_loader(d, "dst"))
            except ObjectNotFound:
                continue
            probe.close()
            raise AlreadyExists(f"{d.text}: already exists (create mode refuses to replace it)")
    return specialize_pair(
        pairs[0][0],
        pairs[0][1],
        ptd=pairs[1] if ptd is not None else None,
        options=options,
        backends=backends,
        mode=mode,
        event_tracer=event_tracer,
        spool_dir=spool_dir,
        strict=strict,
        device=device,
        provenance=provenance,
    )


def _check_dst_options(options: StorageOptions, dsts: Iterable[Any]) -> None:
    """Refuse a destination's own option that neither its writer nor its reader takes,
    naming what the writer accepts (as the writer refuses it), before any work: with
    ``mode="create"`` the destination is read first, and that read refused it naming
    the reader's options (``accepted: []`` for a local file)."""
    if not options.dst:
        return
    from ..storage._options import check_options
    from ..storage.schemes import loader_options, scheme_of, writer_options

    for url in dsts:
        row = scheme_of(url)
        own = {k: v for k, v in options.dst.items() if k not in loader_options(url)}
        what = row.writer_applies_to or row.applies_to
        check_options(row.target(url), own, writer_options(url), what)
