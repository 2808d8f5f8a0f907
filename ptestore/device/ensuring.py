"""``ensure(source, cache_dir=...)``: the one call an app makes on the device.

The first call specializes the model into the cache; later calls return the cached
artifact after a few ``stat`` calls and one small read (the entry's manifest), without
reading the source. See docs/device.md.

An entry's key and fingerprint are :mod:`.keys`' (the source's location and identity,
the backends and their versions, the device); its manifest is :mod:`.manifest`'s; a hit
or a make under the key's locks is :func:`.artifact.hit_or_make`. This module holds the
entry point and the two ways a copy is made: specialized here, or fetched from a fleet
job's index (:mod:`.indexed`); in place is :mod:`.in_place`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._args import backends_argument, device_argument, path_argument
from ..backends.compat import DeviceProfile
from ..errors import ConfigurationError, PteStoreError, StorageError
from ..storage.types import file_path
from .artifact import (
    Artifact,
    HeldProgress,
    artifact_of,
    hit_or_make,
    lookup,
    said_unchanged,
    warn_unchanged,
)
from .entryfiles import free_stale_locked, freed_remake_failed, remove_foreign
from .keys import backend_fingerprint, device_fingerprint, entry_key, location, source_identity

# spec_text, PTE_NAME, PTD_NAME, disk_full_error and write_manifest (below) are still
# found here, where they were before the split.
from .keys import spec_text as spec_text
from .layout import CacheLayout
from .lock import with_lock_timeout
from .manifest import (
    PTD_NAME,
    PTE_NAME,
    Manifest,
    disk_full_error,
    file_records,
    is_disk_full,
    unpublish,
)
from .packed import check_packed_args

if TYPE_CHECKING:
    from ..backends.registry import BackendLike
    from ..coordinator.report import Event
    from ..provenance import Provenance

__all__ = ["Artifact", "ensure", "entry_key", "source_identity"]

PathOrUrl = str | os.PathLike[str]


def _check_args(
    max_bytes: int | None, device: DeviceProfile | str | None, from_index: bool
) -> None:
    if max_bytes is not None and (
        not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0
    ):
        raise ConfigurationError(f"max_bytes must be an integer >= 0 or None, got {max_bytes!r}")
    if isinstance(device, str) and from_index:
        return  # a name: the options the index records for it, as select takes them
    device_argument(device, DeviceProfile, " (a name alone only with an index, model=)")


@with_lock_timeout
def ensure(
    source: PathOrUrl,
    *,
    cache_dir: PathOrUrl,
    backends: Iterable[BackendLike] | None = None,
    device: DeviceProfile | str | None = None,
    ptd: PathOrUrl | None = None,
    max_bytes: int | None = None,
    in_place: bool = False,
    provenance: bool = True,
    model: str | None = None,
    storage_options: dict[str, Any] | None = None,
    portable: PathOrUrl | None = None,
    lock_timeout: float | None = None,
    progress: Callable[[Event], None] | None = None,
    xnnpack_cache: bool = False,
    xnnpack_retry: bool = False,
    xnnpack_timeout: float | None = None,
    trusted_origins: Sequence[str] | None = None,
) -> Artifact:
    """The specialized model for ``source`` on this device, made once and cached.

    Args:
        source: the ``.pte``: a local path or a URL; or, with ``model``, a fleet job's
            index (``ptestore-index.json``, a path or URL): then the artifact
            :func:`ptestore.select` picks for ``device`` is downloaded (verified, as
            :func:`ptestore.fetch` does) and cached while the index names it; when none
            fits, the model's portable source is specialized here with ``backends``
            (see docs/device.md).
        cache_dir: a local directory for the cache (created if missing).
        backends: as for :func:`ptestore.specialize` (None: every installed backend
            whose name is a backend id of the program); a list, never one string. With
            an index, only for the portable source when no artifact fits (the index's
            artifacts are rated by the installed backends).
        device: the device profile handed to the backends; with an index, also a
            device's name alone: then, as :func:`ptestore.select` takes it, with the
            options the index records for that name.
        ptd: the model's external weights (``.ptd``), if any.
        max_bytes: after making an entry, evict least-recently-used entries until the
            cache holds at most this many bytes (never the entry returned, never one
            another process holds).
        in_place: rewrite ``source`` itself instead of making a copy in the cache (local
            files only; the cache then keeps only the manifest).
        provenance: end the artifact with a provenance trailer (the default), what
            lets ``ptestore verify`` and the fleet tell it current or stale; False
            writes none (CLI: ``--no-provenance``; such an entry has a key of its own).
            A source that nothing changes, rewritten in place, is still left as it was.
        model: the model's name in the index ``source`` (only with an index).
        storage_options: fsspec/s3fs options for the index and the files it names
            (only with an index): the artifact, or the portable source (and its
            ``.ptd``) specialized when nothing fits; one that applies to none of them is a
            :class:`~ptestore.errors.ConfigurationError`, before the index is read (a
            local index's once it is read, against the files it names).
        trusted_origins: with an index read over http(s), as for :func:`ptestore.select`
            (CLI: ``--trust-origin``): hosts it may name files on, sent these options too.
        portable: with ``in_place=True``, the portable source (the original ``.pte``)
            to specialize into ``source`` when ``source`` is already a specialized
            output that is not current (a backend upgraded, another device; CLI:
            ``--portable PATH``). Without it such a file is refused
            (:class:`~ptestore.errors.AlreadySpecialized`): in place never specializes
            an output again. With an index (``model=``): a local copy of the model's
            portable source (its ``.ptd`` beside it) that the download takes the chunks
            it holds from, after what the cache holds of the model (every chunk verified
            against the artifact's record; see docs/device.md).
        lock_timeout: seconds to wait at most for the entry's locks (all of this
            call's waits together) while another process makes or uses it (None,
            the default: wait as long as it takes); then
            :class:`~ptestore.errors.LockTimeout` names the lock file and the holder's
            pid when the system tells it (CLI: ``--lock-timeout``).
        progress: called with each :class:`~ptestore.coordinator.report.Event` of the
            specialization when this call makes the entry (the events
            :func:`ptestore.specialize` reports); a hit calls nothing. An exception it
            raises propagates: before the change is made it stops the run (nothing
            recorded); at ``publish`` (in place also ``write``) once the entry is
            recorded; inside a backend's call as that backend's ``BackendError``.
        xnnpack_cache: also make (once, under the entry's lock) XNNPACK's packed-weight
            file beside the entry and return its path as ``Artifact.xnnpack_cache``
            (needs the ``[xnnpack]`` extra; see docs/device.md). Refused by the runtime:
            the artifact is still returned, the reason in ``Artifact.xnnpack_refused``
            (CLI: ``--xnnpack-cache``); ``xnnpack_retry``: make it again although
            refused before (``--xnnpack-retry``); ``xnnpack_timeout``: seconds for each
            run of the runtime (None: 3600 s; ``--xnnpack-timeout``).

    Returns:
        An :class:`Artifact`: paths of the ``.pte`` and ``.ptd``, the provenance,
        whether this call made it (and with an index, what was chosen and why).

    Raises:
        StorageError: the cache's file system is full (the cache and the source are left
            as they were) or another I/O failure.
        LockTimeout: the entry's locks were not free within ``lock_timeout`` (a
            ``StorageError``; nothing was changed).
        PermissionDenied: the cache directory, an entry or its manifest is not this
            user's alone (owned by another user, or writable by group or others), or the
            storage refused the access.
        AlreadySpecialized: with ``in_place=True``, ``source`` is already a specialized
            output that is not this call's (another backend version or device) and no
            ``portable`` was given (a ``ConfigurationError``; the file is unchanged).
        PreconditionFailed: the source was modified or replaced while it was read (a
            ``StorageError``; nothing was recorded).
        IntegrityError: with an index, a download that does not match it (the cache
            is left as it was).
        ConfigurationError, ObjectNotFound, FormatError, BackendError: as for
            :func:`ptestore.specialize` (a ``BackendError`` also for a backend's own
            full disk: only ptestore's own writes make the cache's full disk).
    """
    src = path_argument(source, "source")
    path_argument(cache_dir, "cache_dir")
    ptd = None if ptd is None else path_argument(ptd, "ptd")
    portable = None if portable is None else path_argument(portable, "portable")
    backends_argument(backends)
    from_index = model is not None or src.endswith(".json")
    _check_args(max_bytes, device, from_index)
    if not isinstance(provenance, bool):
        raise ConfigurationError(f"provenance must be True or False, got {provenance!r}")
    check_packed_args(source, in_place, xnnpack_cache, xnnpack_retry, xnnpack_timeout)
    if xnnpack_cache:
        from .cache import evict
        from .packed import with_packed_weights

        plain = ensure(  # within this call's lock deadline (lock_timeout not passed again)
            source,
            cache_dir=cache_dir,
            backends=backends,
            device=device,
            ptd=ptd,
            max_bytes=max_bytes,
            in_place=in_place,
            provenance=provenance,
            model=model,
            storage_options=storage_options,
            portable=portable,
            progress=progress,
            trusted_origins=trusted_origins,
        )
        layout = CacheLayout(cache_dir)
        served = with_packed_weights(layout, plain, storage_options, xnnpack_retry, xnnpack_timeout)
        if max_bytes is not None:  # the packed file counts in the entry's bytes
            evict(layout.root, max_bytes, keep=served.key)
        return served
    ptd_src = None if ptd is None else os.fspath(ptd)
    blist = None if backends is None else list(backends)
    if portable is not None and not in_place and not from_index:
        raise ConfigurationError(
            f"{src}: portable= is the source an in-place entry is made from; it applies "
            "with in_place=True only (CLI: --in-place --portable PATH), or with an index "
            "(model=): a local copy of the model's portable source to fetch from"
        )
    if from_index:
        from .from_index import check_index_args, ensure_from_index

        check_index_args(src, model, ptd_src, in_place, provenance)
        assert model is not None
        local = None if portable is None else file_path(portable)
        if portable is not None and (local is None or not os.path.isfile(local)):
            raise ConfigurationError(
                f"{os.fspath(portable)}: no such file (portable=, CLI --portable: a local "
                "copy of the model's portable source for the download to take chunks from)"
            )
        from ..fleet.index_store import check_index_options

        # Before the index is read; a local one's options reach the files it names
        # (checked once it is read: ensure_from_index).
        given = [os.fspath(cache_dir), *([] if local is None else [local])]
        check_index_options(storage_options, src, given=given, local_ok=True)
        return ensure_from_index(
            src,
            cache_dir,
            model,
            device,
            blist,
            max_bytes,
            dict(storage_options or {}),
            progress,
            local,
            ensure=_ensure_copy,
            trusted_origins=trusted_origins,
        )
    if storage_options:
        raise ConfigurationError(
            f"{src}: storage_options apply to a job index (with model=), not to a .pte"
        )
    assert not isinstance(device, str)  # _check_args: a name only with an index
    if in_place:
        from .in_place import ensure_in_place

        artifact = ensure_in_place(
            CacheLayout(cache_dir),
            src,
            ptd_src,
            blist,
            device,
            max_bytes,
            provenance,
            None if portable is None else os.fspath(portable),
            progress,
        )
        if not artifact.created and not artifact.specialized:
            said_unchanged(src, artifact.key)
        return artifact
    return _ensure_copy(
        src,
        cache_dir=cache_dir,
        backends=blist,
        device=device,
        ptd=ptd_src,
        max_bytes=max_bytes,
        provenance=provenance,
        progress=progress,
    )


def _ensure_copy(
    src: str,
    *,
    cache_dir: PathOrUrl,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    ptd: str | None,
    max_bytes: int | None,
    provenance: bool = True,
    progress: Callable[[Event], None] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    accept: Callable[[Provenance | None], None] | None = None,
    named_by: str | None = None,
    fresh: Callable[[Provenance | None], bool] | None = None,
) -> Artifact:
    """``ensure(src)`` once its arguments are checked: the copy of ``src`` (and ``ptd``)
    specialized into the cache, or the entry made before. ``storage_options`` are those
    of ``ensure(index, ...)`` whose portable source this is (:mod:`.from_index`): they
    reach the source and its .ptd wherever they are read (their identity, the run), as
    routed to each (:func:`~ptestore.storage.routing.options_for_loader`: none to a
    local file); the public ``ensure`` of a source takes none. ``accept(provenance)``
    raises to refuse what a make made, before its entry is published (the entry is
    removed, no other evicted). ``named_by``: the location of the index that named the
    source, recorded in the manifest of an entry made (``cache prune --stale``'s
    options reach such a source). A hit whose record ``fresh`` refuses is made again."""
    from ..journal import recover_if_local

    recover_if_local(src)  # an interrupted in-place run of the source: finish it first
    routed: dict[str, dict[str, Any]] = {src: {}, **({} if ptd is None else {ptd: {}})}
    if storage_options:
        from ..storage.routing import options_for_loader

        routed = {url: options_for_loader(url, storage_options) for url in routed}
    layout = CacheLayout(cache_dir)
    layout.create()
    key = entry_key(src, ptd, backends, device, False, provenance)
    fingerprint = {
        "source": source_identity(src, routed[src]),
        "ptd": None if ptd is None else source_identity(ptd, routed[ptd]),
        "backends": backend_fingerprint(backends, layout),
        "device": device_fingerprint(device),
    }
    # The options of the remote sources, as common ones: the run routes them to those
    # (never to a local file, nor to the cache's local destinations).
    common = {k: v for opts in routed.values() for k, v in opts.items()}
    # The callback's exception at "publish" waits for the manifest: no half entry.
    relay = None if progress is None else HeldProgress(progress, frozenset({"publish"}))
    made = (src, ptd, backends, device, provenance, relay, common, accept, named_by)

    def hit() -> Artifact | None:
        found = lookup(layout, key, fingerprint)
        return found if found is None or fresh is None or fresh(found.provenance) else None

    artifact = hit_or_make(
        layout, key, max_bytes, hit, lambda: _make(layout, key, fingerprint, *made)
    )
    if relay is not None:
        relay.raise_held()
    if not artifact.created and not artifact.specialized:
        said_unchanged(src, artifact.key)
    return artifact


def _make(
    layout: CacheLayout,
    key: str,
    fingerprint: dict[str, Any],
    src: str,
    ptd_src: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    provenance: bool = True,
    progress: Callable[[Event], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    accept: Callable[[Provenance | None], None] | None = None,
    named_by: str | None = None,
) -> Artifact:
    from ..coordinator import specialize
    from ..coordinator.report import ENSURE_PTD, ptd_spelling
    from ..provenance.stamp import ProvenanceRequest

    try:
        directory = layout.make_entry_dir(key)  # its failures classified (exit 2 or 1)
    except StorageError as exc:
        if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full_error(layout.root, src, 0, exc, stage="entry") from exc
        raise
    # The earlier entry (its lookup missed: never served again) freed before the new copy
    # is made: room for one copy, not two (a process that opened the old files keeps them).
    had = free_stale_locked(layout.entry_dir(key))
    remove_foreign(layout.entry_dir(key), (PTE_NAME, PTD_NAME))  # made ours, not replaced
    pte = os.path.join(directory, PTE_NAME)
    ptd_dst = None if ptd_src is None else os.path.join(directory, PTD_NAME)
    try:
        with ptd_spelling(ENSURE_PTD):  # the run's .ptd hint in ensure's flags
            report = specialize(
                src,
                pte,
                ptd=None if ptd_src is None or ptd_dst is None else (ptd_src, ptd_dst),
                backends=backends,
                device=device,
                provenance=ProvenanceRequest() if provenance else False,
                strict=False,
                event_tracer=progress,
                storage_options=storage_options or None,
            )
    except BaseException as exc:
        if had:  # the earlier entry is gone: no empty entry of it stays
            freed_remake_failed(directory)
        if isinstance(exc, (PteStoreError, OSError)) and is_disk_full(exc):  # a spool too
            need = fingerprint["source"].get("size", 0) + (
                fingerprint["ptd"].get("size", 0) if fingerprint["ptd"] else 0
            )
            raise disk_full_error(layout.root, src, need, exc, freed=had) from exc
        raise
    from ..provenance import read_provenance
    from ..storage.loaders import LocalFileLoader

    loader = LocalFileLoader(pte)
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    if accept is not None:
        try:
            accept(prov)
        except BaseException:  # refused: no entry of it (nor the stale one it replaced)
            from .cache import remove_entry_locked

            remove_entry_locked(layout, key)
            raise
    names = {"pte": PTE_NAME} if ptd_dst is None else {"pte": PTE_NAME, "ptd": PTD_NAME}
    manifest = Manifest.of(
        key=key,
        source=location(src),
        ptd_source=None if ptd_src is None else location(ptd_src),
        fingerprint=fingerprint,
        files=file_records(directory, names),
        specialized=report.specialized,
        provenance=prov,
        named_by=named_by,
    )
    try:
        manifest.publish(layout, src, freed=had)
    except BaseException:
        unpublish(layout, key, names.values(), had)
        raise
    warn_unchanged(report, key)  # once it is kept: served unchanged, said
    return artifact_of(layout, manifest, True)


def write_manifest(layout: CacheLayout, key: str, manifest: dict[str, Any], src: str) -> None:
    """Publish the manifest dict of entry ``key`` atomically (the name this module had
    before :meth:`.manifest.Manifest.publish`, which it calls)."""
    fields = {k: v for k, v in manifest.items() if k not in ("format", "version")}
    Manifest(**{**fields, "key": key}).publish(layout, src)
