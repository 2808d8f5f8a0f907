"""``ensure(index, model=..., device=...)``'s steps (:mod:`.indexed` holds the pieces):
select, then serve the entry while it is current, else fetch it (taking the chunks the
cache holds of the model), else specialize the portable source the index names (first
recording that answer in the entry fetched for the device: :mod:`.superseded`); the
index's last answer is served offline when the index or the download cannot be had (the
entry fetched before, or the portable source the index answered since).
The fetched files are the entry's only once its manifest is published: a manifest that
cannot be (a full disk) takes them with it (:func:`.manifest.unpublish`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._dataclass import replace
from ..errors import (
    ConfigurationError,
    IntegrityError,
    LockTimeout,
    ModelRetired,
    PermissionDenied,
    StorageError,
)
from ..storage.types import StorageURL
from .artifact import Artifact, artifact_of, hit_or_make, lookup
from .entryfiles import clean_entry_locked
from .layout import CacheLayout
from .manifest import PTD_NAME, PTE_NAME, unpublish

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..coordinator.report import Event
    from ..fleet.select import Choice
    from ..provenance.record import Provenance, SourceInfo

__all__ = ["check_index_args", "ensure_from_index"]

PathOrUrl = str | os.PathLike[str]


def check_index_args(
    src: str, model: str | None, ptd: str | None, in_place: bool, provenance: bool
) -> None:
    """The arguments of ``ensure(index, ...)`` that apply to an index: ``model``, and
    none of ``ptd``, ``in_place``, ``provenance=False``; else a
    :class:`~ptestore.errors.ConfigurationError`."""
    if model is None:
        raise ConfigurationError(
            f"{src}: a job index needs model= (CLI: --model NAME) and device= (--device NAME)"
        )
    if not src.endswith(".json"):
        raise ConfigurationError(
            f"{src}: model={model!r} names a model of a job index (a .json such as "
            "ptestore-index.json); this source is not one"
        )
    if ptd is not None:
        raise ConfigurationError(f"{src}: ptd= does not apply to an index (it names the .ptd)")
    if in_place:
        raise ConfigurationError(f"{src}: in_place=True does not apply to an index")
    if not provenance:
        raise ConfigurationError(
            f"{src}: provenance=False does not apply to an index: its artifacts carry the "
            "trailers the index names (and the download is checked against them)"
        )


def ensure_from_index(
    index: str,
    cache_dir: PathOrUrl,
    model: str,
    device: DeviceProfile | str | None,
    backends: list[BackendLike] | None,
    max_bytes: int | None,
    opts: dict[str, Any],
    progress: Callable[[Event], None] | None = None,
    portable: str | None = None,
    *,
    ensure: Callable[..., Artifact],
    trusted_origins: Sequence[str] | None = None,
) -> Artifact:
    """``ensure(index, model=...)`` (see :mod:`ptestore.device.indexed`): the artifact the
    index selects, fetched into the entry keyed on the index, the model and the device,
    current while the index still selects the same files (taking the chunks the cache or
    ``portable`` already holds from there); else the portable source, specialized
    here by ``ensure`` (the copy path of :func:`.ensuring.ensure`, passed in: no import
    loop), read with ``opts`` (the storage options given for the index)."""
    from ..backends.snapshot import using
    from .indexed import choose, fetch_entry, index_fingerprint, index_key

    def source(choice: Choice, profile: DeviceProfile) -> Artifact:
        from ..storage.redirects import index_redirects

        # the portable source is named by the index: its redirects held to its rule
        with index_redirects(index, trusted_origins):
            return _from_source(
                index, choice, profile, cache_dir, backends, max_bytes, opts, progress, ensure
            )

    layout = CacheLayout(cache_dir)
    try:
        # The backends installed here (select asks them to rate builds made for other
        # profiles) through the cache's snapshot of the installed metadata: a hit from a
        # fresh process whose installation is unchanged does not read it again.
        with using(layout.snapshot):
            choice = choose(index, model, device, opts, trusted_origins)
    except StorageError as exc:  # unreachable, gone, refused: the entry fetched before
        served = None if device is None else _offline(layout, index, model, device, exc, source)
        if served is None:
            raise
        return served
    except ModelRetired:  # for every device: the entry fetched before is never served
        if device is not None and os.path.isdir(
            layout.entry_dir(key := index_key(index, model, device))
        ):
            from .superseded import retired_answer, supersede

            layout.create()
            supersede(layout, key, index, retired_answer(model, device))
        raise
    assert device is not None  # choose refuses None
    if isinstance(device, str):  # a name: the options select rated the builds for
        from ..backends.compat import DeviceProfile

        device = DeviceProfile(device, choice.device_options)
    # A local index is read: the files it names (the artifact, or the portable source),
    # before any of them is read.
    from ..fleet.index_store import check_named_options

    check_named_options(opts, index, _named(choice))
    key = index_key(index, model, device)
    if choice.kind == "source":
        from .superseded import answer_of, supersede

        # The entry fetched for this device before is not what the index selects now:
        # its answer is recorded there first, so that offline it is this answer that is
        # served, never that entry (.superseded).
        if os.path.isdir(layout.entry_dir(key)):
            layout.create()
            supersede(layout, key, index, answer_of(choice, device))
        return source(choice, device)
    layout.create()
    fingerprint = index_fingerprint(index, model, device, choice)

    def fetched() -> Artifact:
        layout.make_entry_dir(key)
        had = os.path.lexists(layout.manifest(key))  # an earlier entry, its files replaced
        manifest = fetch_entry(
            layout,
            key,
            index,
            model,
            device,
            opts,
            (PTE_NAME, PTD_NAME),
            progress,
            portable,
            trusted_origins,
        )
        try:
            manifest.publish(layout, index, replaced=had)
        except BaseException:  # a full disk: the fetched files go, no half entry stays
            unpublish(layout, key, (PTE_NAME, PTD_NAME), had)
            raise
        # The previous files' leftovers; their packed-weight files stay until the new
        # artifact's is delivered (with_packed_weights): the chunks it shares with them
        # are taken from them, not downloaded.
        clean_entry_locked(layout.entry_dir(key), manifest.to_dict(), keep_packed=True)
        return artifact_of(layout, manifest, True)

    try:
        got = hit_or_make(layout, key, max_bytes, lambda: lookup(layout, key, fingerprint), fetched)
        # What select chose now (a hit's manifest keeps the choice it was fetched for:
        # the same files, but the index may list a packed-weight file since), with what
        # the manifest adds to it (what the fetch moved).
        return replace(got, choice={**(got.choice or {}), **choice.to_dict()})
    except (IntegrityError, PermissionDenied):
        raise
    except StorageError as exc:  # the newer artifact cannot be downloaded now
        served = _offline(layout, index, model, device, exc, source)
        if served is None:
            raise
        return served


def _named(choice: Choice) -> list[str]:
    """The URLs of the files ``choice`` names (the artifact, or the portable source)."""
    return [str(f["url"]) for f in (choice.pte, choice.ptd) if f is not None]


def _from_source(
    index: str,
    choice: Choice,
    device: DeviceProfile,
    cache_dir: PathOrUrl,
    backends: list[BackendLike] | None,
    max_bytes: int | None,
    opts: dict[str, Any],
    progress: Callable[[Event], None] | None,
    ensure: Callable[..., Artifact],
) -> Artifact:
    """The portable source ``choice`` names, specialized for ``device`` by ``ensure``
    (an entry of its own, keyed on the source) and checked against what the index
    records (:func:`.indexed.check_source`)."""
    from ..fleet.index_bounds import names_shown
    from .indexed import check_source

    named = _named(choice)
    # Read with the index's options, as routed to each of its URLs (its store's
    # endpoint and credentials; none to a local file): its identity, the hit, the run.
    # A source that is not the index's is refused before its entry is published
    # (nothing kept, nothing evicted for it), and on a hit.
    with names_shown(named):  # an error names the index's URLs as a report does
        made = ensure(
            named[0],
            cache_dir=cache_dir,
            backends=backends,
            device=device,
            ptd=None if choice.ptd is None else named[1],
            max_bytes=max_bytes,
            progress=progress,
            storage_options=opts,
            accept=lambda prov: check_source(index, choice, prov),
            named_by=StorageURL.of(index).location,
            fresh=lambda prov: named_alike(choice, prov),
        )
        check_source(index, choice, made.provenance)
    return replace(made, choice=choice.to_dict())


def named_alike(choice: Choice, prov: Provenance | None) -> bool:
    """Whether the record ``prov`` names ``choice``'s sources by the kind of digest the
    index records for them: an entry made before record version 3 names a source by its
    whole SHA-256 (``sha256:``), which the chunks' root a current index records
    (``sha256-tree:``) cannot be compared with without reading the source; such a hit is
    made again, once (it was refused, every time, as another version of the source)."""
    if prov is None:
        return True
    pairs: list[tuple[dict[str, Any], SourceInfo | None]] = [(choice.pte, prov.source)]
    if choice.ptd is not None:
        pairs.append((choice.ptd, prov.ptd_source))
    for want, got in pairs:
        wanted, have = want.get("sha256"), None if got is None else got.sha256
        # only this way round: an entry made now against an index an older runner wrote
        # (sha256: against sha256-tree:) would be made again and refused on every call
        if str(have).startswith("sha256:") and str(wanted).startswith("sha256-tree:"):
            return False
    return True


def _offline(
    layout: CacheLayout,
    index: str,
    model: str,
    device: DeviceProfile | str,
    exc: StorageError,
    source: Callable[[Choice, DeviceProfile], Artifact],
) -> Artifact | None:
    """What is served while ``index`` (or the artifact it names now) cannot be read
    (``exc``): the index's last answer for ``device``. The entry fetched for it before
    (:func:`.indexed.offline_entry`), unless the index answered since that no artifact
    fits the device (:mod:`.superseded`): then the portable source it named, by
    ``source`` (a hit on its entry while it is unchanged; a source that cannot be read
    either serves nothing, its error logged). None: nothing to serve (the caller raises
    ``exc``)."""
    from .._log import get_logger
    from .indexed import index_key, offline_entry
    from .superseded import last_answer

    recorded, choice, profile = last_answer(layout, index_key(index, model, device), device)
    if not recorded:
        return offline_entry(layout, index, model, device, exc)
    if choice is None or profile is None:  # a record not of the form it is written in
        return None
    log = get_logger(__name__)
    try:
        made = source(choice, profile if isinstance(device, str) else device)
    except (IntegrityError, PermissionDenied, LockTimeout):
        raise
    except StorageError as err:  # unreachable too: the index's error, as without entry
        log.warning(
            "%s: cannot be read, and the portable source its last answer named cannot either: %s",
            index,
            err,
        )
        return None
    reason = (
        f"served offline: {exc}; the index's last answer for {profile.name!r} was the "
        "model's portable source, not the artifact fetched before: the source is served, "
        "as then"
    )
    log.warning("%s: %s", index, reason)
    return replace(made, choice={**(made.choice or {}), "offline": reason})
