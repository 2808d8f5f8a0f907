"""The URL front end: open loaders and writers for URLs, then run the pipeline."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..backends.registry import BackendLike
from ..errors import AlreadyExists, ConfigurationError, ObjectNotFound
from ..loaders import DataLoader, loader_options, open_loader, split_url
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
            return {}
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
) -> SpecializationReport:
    """Specialize the model at ``src_url`` and publish it at ``dst_url``.

    URLs are local paths or fsspec URLs (``file://``, ``memory://``, ``s3://``, ...).
    ``dst_url`` may equal ``src_url``: the original is then replaced atomically.
    ``ptd=(src_ptd_url, dst_ptd_url)`` rewrites the model's external weights too (the
    two files cannot be replaced in place together: a crash between the two publishes
    would leave a mismatched pair, so in-place is refused for pairs, and so is any
    destination that is the other file's source or the other destination: paths are
    compared with symlinks resolved, URLs normalized, all before any work).
    ``storage_options`` apply to every remote URL that accepts them (writer options
    such as ``part_size`` to the destinations only); ``src_``/``dst_storage_options``
    apply to the sources or the destinations and override them.

    See :func:`~ptestore.coordinator.pipeline.initialize_and_save_backend_data` for
    ``backends``, ``mode``, ``strict``, what is returned and what is raised.
    """
    src, dst = os.fspath(src_url), os.fspath(dst_url)
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
            pairs, options, loaders, writers, backends, event_tracer, mode, spool_dir, strict
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
        )
    finally:
        for w in writers:
            try:
                w.discard()  # no-op after publish; never publishes
            except Exception:
                pass
        for loader in loaders:
            loader.close()
