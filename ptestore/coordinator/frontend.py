"""The URL front end: open loaders and writers for URLs, then run the pipeline."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..backends.compat import DeviceProfile
from ..backends.registry import BackendLike
from ..errors import AlreadyExists, ConfigurationError, ObjectNotFound
from ..loaders import DataLoader, open_loader, split_url
from ..provenance.stamp import ProvenanceRequest
from ..writers import open_writer
from ..writers.base import DataWriter, PublishMode
from .pipeline import initialize_and_save_backend_data
from .report import EventTracer, SpecializationReport

__all__ = ["specialize"]

PathOrUrl = str | os.PathLike[str]


def _same_target(a: str, b: str) -> bool:
    pa, pb = split_url(a), split_url(b)
    if pa[0] == pb[0] == "file":
        return os.path.realpath(pa[1]) == os.path.realpath(pb[1])
    return pa == pb


def _options_for(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """Storage options apply to remote URLs only; local paths take none."""
    return {} if split_url(url)[0] == "file" else dict(options)


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
    device: DeviceProfile | None = None,
    provenance: ProvenanceRequest | bool | None = None,
) -> SpecializationReport:
    """Specialize the model at ``src_url`` and publish it at ``dst_url``.

    URLs are local paths or fsspec URLs (``file://``, ``memory://``, ``s3://``, ...).
    ``dst_url`` may equal ``src_url``: the original is then replaced atomically.
    ``ptd=(src_ptd_url, dst_ptd_url)`` rewrites the model's external weights too (the
    two files cannot be replaced in place together: a crash between the two publishes
    would leave a mismatched pair, so in-place is refused for pairs).
    ``storage_options`` apply to every remote URL; ``src_``/``dst_storage_options``
    override them for the sources or the destinations.

    See :func:`~ptestore.coordinator.pipeline.initialize_and_save_backend_data` for
    ``backends``, ``mode``, ``device``, ``provenance``, what is returned and what is
    raised.
    """
    src, dst = os.fspath(src_url), os.fspath(dst_url)
    common = dict(storage_options or {})
    src_opts = {**common, **(src_storage_options or {})}
    dst_opts = {**common, **(dst_storage_options or {})}

    pairs = [(src, dst)]
    if ptd is not None:
        pairs.append((os.fspath(ptd[0]), os.fspath(ptd[1])))
        for s, d in pairs:
            if _same_target(s, d):
                raise ConfigurationError(
                    f"in-place specialization of a .pte/.ptd pair is refused ({s} -> {d}): "
                    "the two files cannot be published in one atomic step; write the pair "
                    "to new names"
                )
    if mode == "create":
        # Fail before any work (and before a .ptd is published) when a destination
        # exists; the writers' no-clobber publish still guards against races.
        for _, d in pairs:
            try:
                probe = open_loader(d, **_options_for(d, dst_opts))
            except ObjectNotFound:
                continue
            probe.close()
            raise AlreadyExists(f"{d}: already exists (create mode refuses to replace it)")
    loaders: list[DataLoader] = []
    writers: list[DataWriter] = []
    try:
        for s, d in pairs:
            loaders.append(open_loader(s, **_options_for(s, src_opts)))
            writer_opts = _options_for(d, dst_opts)
            if split_url(d)[0] == "s3":  # TODO(merge): the S3 writer's own default
                writer_opts.setdefault("spool", False)
            writers.append(open_writer(d, **writer_opts))
        return initialize_and_save_backend_data(
            loaders[0],
            writers[0],
            ptd_loader=loaders[1] if ptd is not None else None,
            ptd_writer=writers[1] if ptd is not None else None,
            backends=backends,
            event_tracer=event_tracer,
            mode=mode,
            spool_dir=spool_dir,
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
