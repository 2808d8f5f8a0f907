"""The URL front end: open loaders and writers for URLs, then run the pipeline."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..backends.compat import DeviceProfile
from ..backends.registry import BackendLike
from ..errors import AlreadyExists, ConfigurationError, ObjectNotFound
from ..loaders import DataLoader, loader_options, open_loader, split_url
from ..provenance.stamp import ProvenanceRequest
from ..writers import open_writer, writer_options
from ..writers.base import DataWriter, PublishMode, WriterState
from .pipeline import initialize_and_save_backend_data
from .report import EventTracer, SpecializationReport
from .targets import check_targets

__all__ = ["specialize"]

PathOrUrl = str | os.PathLike[str]


class _Options:
    """Storage options for each side of a run.

    ``common`` options go to every remote URL that accepts them (a writer-only option
    such as ``part_size`` reaches writers, not loaders); an option that neither side
    of any URL accepts is refused. ``src``/``dst`` options go to their side as given
    and are checked there. Local paths take no options.
    """

    def __init__(
        self,
        common: dict[str, Any] | None,
        src: dict[str, Any] | None,
        dst: dict[str, Any] | None,
    ) -> None:
        self.common = dict(common or {})
        self.src = dict(src or {})
        self.dst = dict(dst or {})

    def check(self, pairs: list[tuple[str, str]]) -> None:
        remote = [u for pair in pairs for u in pair if split_url(u)[0] != "file"]
        if not self.common or not remote:
            return
        accepted: set[str] = set()
        for s, d in pairs:
            accepted |= loader_options(s) | loader_options(d) | writer_options(d)
        unknown = sorted(set(self.common) - accepted)
        if unknown:
            raise ConfigurationError(
                f"storage options {unknown} apply to none of {', '.join(remote)} "
                f"(accepted: {sorted(accepted)})"
            )

    def _pick(self, url: str, accepted: frozenset[str], own: dict[str, Any]) -> dict[str, Any]:
        if split_url(url)[0] == "file":
            return dict(own)  # local files take none: open_loader/open_writer refuse these
        return {**{k: v for k, v in self.common.items() if k in accepted}, **own}

    def loader(self, url: str, side: str) -> dict[str, Any]:
        return self._pick(url, loader_options(url), self.src if side == "src" else self.dst)

    def writer(self, url: str) -> dict[str, Any]:
        return self._pick(url, writer_options(url), self.dst)


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
    strict: bool = False,
    device: DeviceProfile | None = None,
    provenance: ProvenanceRequest | bool | None = None,
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
        strict: raise :class:`~ptestore.errors.NothingSpecialized` when nothing was
            specialized, before anything is written (the CLI's default).
        device: the device profile (``DeviceProfile``) handed to every backend as
            ``context.device`` (CLI: ``--device``).
        provenance: True or a :class:`~ptestore.provenance.ProvenanceRequest`: each
            output ends with a provenance trailer (see :mod:`ptestore.provenance`); a
            source's own trailer is never copied, so re-specializing an artifact
            replaces its trailer.
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
        NothingSpecialized: with ``strict=True``, when no backend specialized anything.
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
    src, dst = os.fspath(src_url), os.fspath(dst_url)
    from ..device.paths import recover_if_local

    recover_if_local(src)  # an interrupted in-place run of the source: finish it first
    if in_place:
        from ..device.inplace import check_in_place_args, specialize_in_place

        check_in_place_args(src, dst, ptd, mode, storage_options or src_storage_options)
        return specialize_in_place(
            src,
            backends=backends,
            device=device,
            provenance=provenance,
            event_tracer=event_tracer,
            strict=strict,
        )
    options = _Options(storage_options, src_storage_options, dst_storage_options)

    pairs = [(src, dst)]
    if ptd is not None:
        pairs.append((os.fspath(ptd[0]), os.fspath(ptd[1])))
    # Before any work, and before the create-mode probes: no destination may be a
    # source or the other destination.
    check_targets(pairs[0], pairs[1] if ptd is not None else None)
    options.check(pairs)
    if mode == "create":
        # Fail before any work (and before a .ptd is published) when a destination
        # exists; the writers' no-clobber publish still guards against races.
        for _, d in pairs:
            try:
                probe = open_loader(d, **options.loader(d, "dst"))
            except ObjectNotFound:
                continue
            probe.close()
            raise AlreadyExists(f"{d}: already exists (create mode refuses to replace it)")
    loaders: list[DataLoader] = []
    writers: list[DataWriter] = []
    try:
        return _run(
            pairs,
            options,
            loaders,
            writers,
            backends,
            event_tracer,
            mode,
            spool_dir,
            strict,
            device,
            provenance,
        )
    except KeyboardInterrupt as exc:
        # Ctrl-C after a publish took effect must not read as "nothing was published".
        done = [w.url for w in writers if w.state is WriterState.PUBLISHED]
        if done and not exc.args:
            raise KeyboardInterrupt(f"after {' and '.join(done)} was published") from exc
        raise


def _run(
    pairs: list[tuple[str, str]],
    options: _Options,
    loaders: list[DataLoader],
    writers: list[DataWriter],
    backends: Iterable[BackendLike] | None,
    event_tracer: EventTracer | None,
    mode: PublishMode,
    spool_dir: str | None,
    strict: bool,
    device: DeviceProfile | None,
    provenance: ProvenanceRequest | bool | None,
) -> SpecializationReport:
    ptd = pairs[1] if len(pairs) > 1 else None
    try:
        for s, d in pairs:
            loaders.append(open_loader(s, **options.loader(s, "src")))
            writers.append(open_writer(d, **options.writer(d)))
        return initialize_and_save_backend_data(
            loaders[0],
            writers[0],
            ptd_loader=loaders[1] if ptd is not None else None,
            ptd_writer=writers[1] if ptd is not None else None,
            backends=backends,
            event_tracer=event_tracer,
            mode=mode,
            spool_dir=spool_dir,
            strict=strict,
            device=device,
            provenance=provenance,
        )
    finally:
        for w in writers:
            try:
                w.discard()  # no-op after publish; never publishes
            except Exception:
                pass
        for loader in loaders:
            loader.close()
