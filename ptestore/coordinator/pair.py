"""The pair runner: open the loaders and writers of one pair of URLs, run the pipeline,
discard every writer on any failure, close.

:func:`specialize_pair` is what the URL front end (:func:`~ptestore.specialize`), the
fleet (:mod:`ptestore.fleet.work`) and anything else that specializes one model from URL
to URL call; the storage options reach each side through :mod:`ptestore.storage.routing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..storage.loaders import open_loader
from ..storage.routing import StorageOptions
from ..storage.types import DataLoader, StorageURL, URLLike
from ..writers import open_writer
from ..writers.base import DataWriter, PublishMode, WriterState, discard_all
from .pipeline import initialize_and_save_backend_data
from .report import EventTracer, SpecializationReport

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..provenance.stamp import ProvenanceRequest
    from .output import ContentStore

__all__ = ["specialize_pair", "split_pairs"]


def split_pairs(
    source: URLLike, destination: URLLike, ptd: tuple[URLLike, URLLike] | None
) -> list[tuple[StorageURL, StorageURL]]:
    """``[(source, destination)]``, then the ``ptd`` pair if given: every URL split once."""
    pairs = [(StorageURL.of(source), StorageURL.of(destination))]
    if ptd is not None:
        from .._args import pair_argument

        src_ptd, dst_ptd = pair_argument(ptd, "ptd", "(src_ptd, dst_ptd)")
        pairs.append((StorageURL.of(src_ptd, "ptd[0]"), StorageURL.of(dst_ptd, "ptd[1]")))  # type: ignore[arg-type]
    return pairs


def specialize_pair(
    source: URLLike,
    destination: URLLike,
    *,
    ptd: tuple[URLLike, URLLike] | None = None,
    options: StorageOptions | None = None,
    backends: Iterable[BackendLike] | None = None,
    mode: PublishMode = "overwrite",
    event_tracer: EventTracer | None = None,
    spool_dir: str | None = None,
    strict: bool | None = None,
    device: DeviceProfile | None = None,
    provenance: ProvenanceRequest | bool = True,
    allow_unchanged: bool = False,
    loader_hook: Callable[[DataLoader], DataLoader] | None = None,
    ptd_store: ContentStore | None = None,
) -> SpecializationReport:
    """Specialize ``source`` into ``destination`` (and the ``ptd`` pair
    ``(src_ptd, dst_ptd)``): open a loader per source and a writer per destination,
    run :func:`~ptestore.coordinator.initialize_and_save_backend_data`, and whatever
    happens, discard every writer that was not published and close every loader.

    Args:
        source, destination, ptd, backends, mode, event_tracer, spool_dir, strict,
            device, provenance, allow_unchanged: as for :func:`~ptestore.specialize`.
        options: the run's storage options (:class:`~ptestore.storage.routing.StorageOptions`:
            common ones and each side's own); checked here before anything is opened.
        loader_hook: called with each loader as it is opened; the loader it returns
            is read instead (the fleet counts the bytes it reads this way). It is closed
            in place of the original.
        ptd_store: store the .ptd once under the address of its bytes instead of at
            the ``ptd`` destination (see
            :func:`~ptestore.coordinator.initialize_and_save_backend_data`).

    Returns:
        The run's :class:`~ptestore.coordinator.report.SpecializationReport`.

    Raises:
        What :func:`~ptestore.specialize` raises, except the checks it makes before
        calling this (colliding destinations, ``mode="create"`` probes). A
        ``KeyboardInterrupt`` after a publish took effect says which file was
        published.
    """
    pairs = split_pairs(source, destination, ptd)
    opts = options if options is not None else StorageOptions()
    # a fleet's pair: the job's options are for its remote pairs (the job was checked)
    opts.check([s for s, _ in pairs], [d for _, d in pairs], local_ok=True)
    from ..journal import recover_if_local

    # As the front end does: a local source an in-place run was interrupted on is
    # completed from its journal before it is read (a fleet's job calls this directly).
    recover_if_local(pairs[0][0])
    loaders: list[DataLoader] = []
    writers: list[DataWriter] = []
    try:
        for s, d in pairs:
            loader = open_loader(s, **opts.for_loader(s, "src"))
            loaders.append(loader if loader_hook is None else loader_hook(loader))
            writers.append(open_writer(d, **opts.for_writer(d)))
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
            allow_unchanged=allow_unchanged,
            ptd_store=ptd_store,
        )
    except KeyboardInterrupt as exc:
        # Ctrl-C after a publish took effect must not read as "nothing was published".
        done = [w.url for w in writers if w.state is WriterState.PUBLISHED]
        if done and not exc.args:
            raise KeyboardInterrupt(f"after {' and '.join(done)} was published") from exc
        raise
    finally:
        discard_all(writers)  # a no-op after publish; never publishes
        for loader in loaders:
            loader.close()
