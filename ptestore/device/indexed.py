"""``ensure(index, model=..., device=...)``: the artifact a fleet's job index selects for
this device, downloaded once into the cache and kept while the index names it.

The entry's key is the index's location, the model and the device name. Its manifest
records the index entry it was fetched for (the selected files' URL, size, SHA-256 and
trailer checksum, and the device the artifact was made for): a call finds it current
when :func:`~ptestore.select` still picks exactly those files, without downloading
anything; when the index names another artifact (a newer run), the entry is stale and
fetched again, in its place. The download is :func:`~ptestore.fetch`'s: verified against
the index before it is published, resumable. A download that does not match the index
raises :class:`~ptestore.errors.IntegrityError` and leaves the entry as it was.

When no artifact of the index fits the device, :func:`~ptestore.select` answers with the
model's portable source: it is specialized here, as :func:`~ptestore.ensure` does for any
source (with the given backends; an entry of its own, keyed on the source), and used
only when its SHA-256 (and its .ptd's) is the one the index records
(:func:`check_source`).

**Offline.** When the index cannot be read (the store unreachable, the index gone, the
access refused), or it names a newer artifact that cannot be downloaded, the entry
fetched from that index for this model and device before is served
(:func:`offline_entry`), when its files are there as recorded and it was made for this
device's profile; ``choice["offline"]`` says why, and a warning is logged. Without such
an entry, the error is raised. Once the index answered that no artifact fits that
profile any more, the entry is not served: that answer, the portable source, is
(:mod:`.superseded`).

The fleet modules (select, fetch) are imported here, on first use: a local ``ensure``
never loads them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    PartialPublish,
    PteStoreError,
    StorageError,
)
from ..storage.types import StorageURL
from .entryfiles import check_entry_dir
from .keys import file_fp, index_identity, key_digest
from .layout import MANIFEST, CacheLayout, as_read, files_intact, read_manifest, touch
from .manifest import PTE_NAME, Manifest, as_json, file_records

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..backends.compat import DeviceProfile
    from ..coordinator.report import Event
    from ..fleet.chunked import FetchEvent
    from ..fleet.select import Choice
    from ..provenance import Provenance
    from ..xnnpack import CacheFile
    from .artifact import Artifact

__all__ = [
    "cached_bases",
    "check_source",
    "choose",
    "fetch_entry",
    "index_fingerprint",
    "index_key",
    "offline_entry",
    "packed_from_index",
]

#: The names the download is published under before it replaces the entry's files.
_INCOMING = "incoming.pte"


def _location(url: str) -> str:
    return StorageURL.of(url).location


def index_key(index: str, model: str, device: DeviceProfile | str) -> str:
    """The cache key of ``model`` for ``device`` (a profile or a name: only the name
    counts) from the index at ``index``."""
    name = device if isinstance(device, str) else device.name
    material = ["ptestore.ensure-index/1", index_identity(index), model, name]
    return key_digest(material)  # a name's bytes that are not UTF-8 as they are


def choose(
    index: str,
    model: str,
    device: DeviceProfile | str | None,
    opts: dict[str, Any],
    trusted: Sequence[str] | None = None,
) -> Choice:
    """What :func:`~ptestore.select` picks for ``model`` on ``device`` in ``index``
    (``opts`` checked by ``ensure`` before)."""
    from ..fleet.select import select_from

    if not isinstance(model, str) or not model:
        raise ConfigurationError(f"{index}: model must be a model name of the index, got {model!r}")
    if device is None:
        raise ConfigurationError(f"{index}: ensure from an index needs device= (CLI: --device)")
    return select_from(index, model, device, storage_options=opts, trusted_origins=trusted)


def index_fingerprint(
    index: str, model: str, device: DeviceProfile, choice: Choice
) -> dict[str, Any]:
    """What an entry fetched from an index is current for: the index entry's files (URL,
    size, SHA-256, trailer checksum), the device it was made for, this device's digest."""
    value = {
        "index": index_identity(index),
        "model": model,
        "device": [device.name, device.digest()],
        "made_for": choice.made_for,
        "pte": file_fp(choice.pte),
        "ptd": file_fp(choice.ptd),
    }
    out: dict[str, Any] = as_json(value)  # as the manifest stores it
    return out


def _discard(incoming: str) -> None:
    """Remove what a failed fetch published under the incoming names (not its partial
    downloads, from which the next attempt resumes)."""
    from ..fleet.job import ptd_beside

    for name in (incoming, ptd_beside(incoming)):
        try:
            os.unlink(name)
        except (FileNotFoundError, IsADirectoryError):  # not ours to remove
            pass


def _fetch_events(progress: Callable[[Event], None]) -> Callable[[FetchEvent], None]:
    """fetch's events as ``ensure``'s: ``Event("fetch")`` with the bytes of each piece
    put in place, ``done``/``total`` of that file, and in ``status`` where the piece came
    from (``"store"``, ``"base"``: a file the cache held, ``"part"``: a download resumed)."""
    from ..coordinator.report import Event

    def note(e: FetchEvent) -> None:
        progress(
            Event("fetch", nbytes=e.nbytes, done=e.done, total=e.total, url=e.url, status=e.origin)
        )

    return note


#: At most this many earlier artifacts of the model are offered to a fetch as bases
#: (their trailers' chunk records are read: a small read each).
MAX_BASES = 8


def cached_bases(
    layout: CacheLayout, key: str, model: str, device: DeviceProfile, portable: str | None
) -> list[str]:
    """The local files a fetch into entry ``key`` may take chunks from (each chunk is
    verified against the artifact's record, so none is trusted): the entry's own
    ``.pte`` (the earlier artifact this fetch replaces), the ``.pte`` of other entries of
    the same model fetched from an index (this device's first), then ``portable``."""
    own = os.path.join(layout.entry_dir(key), PTE_NAME)
    found = [own] if os.path.isfile(own) else []
    others: list[tuple[bool, str]] = []
    for other in layout.entry_keys():
        if other == key:
            continue
        try:
            manifest = read_manifest(layout.manifest(other), private=True)
        except (FormatError, StorageError, OSError):
            continue
        fp = None if manifest is None else manifest.get("fingerprint")
        files = None if manifest is None else manifest.get("files")
        if not isinstance(fp, dict) or fp.get("model") != model or not isinstance(files, dict):
            continue
        pte = files.get("pte")  # a malformed manifest: not a base, as an unreadable one
        name = pte.get("name") if isinstance(pte, dict) else None
        if isinstance(name, str) and os.sep not in name:
            same = isinstance(fp.get("device"), list) and fp["device"][:1] == [device.name]
            others.append((not same, os.path.join(layout.entry_dir(other), name)))
    found += [path for _, path in sorted(others)][: MAX_BASES - len(found)]
    if portable is not None:
        found.append(portable)
    return [p for p in found if os.path.isfile(p)]


def fetch_entry(
    layout: CacheLayout,
    key: str,
    index: str,
    model: str,
    device: DeviceProfile,
    opts: dict[str, Any],
    names: tuple[str, str],
    progress: Callable[[Event], None] | None = None,
    portable: str | None = None,
    trusted: Sequence[str] | None = None,
) -> Manifest:
    """Fetch what ``index`` selects into entry ``key`` (its lock held exclusively), under
    the ``names`` of its ``.pte`` and ``.ptd``, taking what the cache already holds of
    the model (and ``portable``) as bases (:func:`cached_bases`); returns the manifest to
    publish."""
    from ..fleet.fetch import fetch
    from ..fleet.job import ptd_beside
    from ..provenance import read_provenance
    from ..storage.atomic import rename
    from ..storage.loaders import LocalFileLoader

    pte_name, ptd_name = names

    directory = layout.make_entry_dir(key)
    incoming = os.path.join(directory, _INCOMING)
    bases = cached_bases(layout, key, model, device, portable)
    # Verified before anything is published under ``incoming``; a mismatch raises and the
    # entry's own files and manifest stay as they were. An interrupted download resumes.
    # (fetch checks every file before it publishes any; a failure while publishing the
    # .pte, after the .ptd, removes the .ptd.)
    try:
        result = fetch(
            index,
            incoming,
            model=model,
            device=device,
            storage_options=opts,
            base=bases,
            require_base=False,  # another process may evict an entry meanwhile
            events=None if progress is None else _fetch_events(progress),
            trusted_origins=trusted,
        )
    except PartialPublish as exc:
        # Published under the incoming names only, and removed: the entry is untouched.
        _discard(incoming)
        raise StorageError(
            f"{exc.__cause__ or exc}; nothing was published in the cache entry (the "
            "incoming files were removed)"
        ) from exc
    except ConfigurationError as exc:  # a directory at an incoming name: the cache's
        raise StorageError(f"{exc}; nothing was published in the cache entry") from exc
    except BaseException:
        _discard(incoming)
        raise
    choice = result.choice
    assert choice is not None  # fetched from an index
    if choice.kind != "artifact":  # the index changed since it was read: nothing fits now
        _discard(incoming)
        from .superseded import answer_of, supersede_locked

        supersede_locked(layout, key, index, answer_of(choice, device))  # its answer now
        raise StorageError(
            f"{index}: the index changed while {model!r} was fetched for {device.name!r} "
            "(no artifact fits any more); run again"
        )
    published = {"pte": pte_name}
    if choice.ptd is not None:
        rename(ptd_beside(incoming), os.path.join(directory, ptd_name), durable=False)
        published["ptd"] = ptd_name
    rename(incoming, os.path.join(directory, pte_name))  # one directory fsync for both
    loader = LocalFileLoader(os.path.join(directory, pte_name))
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    assert prov is not None  # fetch checked the trailer the index names
    return Manifest.of(
        key=key,
        source=choice.pte["url"],
        ptd_source=None if choice.ptd is None else choice.ptd["url"],
        index=_location(index),  # recorded redacted (Manifest.of)
        fingerprint=index_fingerprint(index, model, device, choice),
        files=file_records(directory, published),
        specialized=True,
        provenance=prov,
        choice={
            **choice.to_dict(),
            "fetched": {
                "received": result.received,
                "from_base": result.from_base,
                "bases": sorted({b for f in result.files for b in f.get("bases", {})}),
            },
        },
    )


def offline_entry(
    layout: CacheLayout,
    index: str,
    model: str,
    device: DeviceProfile | str,
    exc: BaseException,
) -> Artifact | None:
    """The entry fetched from ``index`` for ``model`` on ``device`` before, served while
    the index (or the artifact it now names) cannot be read (``exc`` says why); None when
    there is none, its files changed, it was made for another profile of the device
    (a device given by name alone: the profile the index recorded for that name then),
    or the index answered since that no artifact fits the device (:mod:`.superseded`:
    that answer is what is served offline, for the profile it was given for)."""
    from .._dataclass import replace
    from .._log import get_logger
    from .artifact import artifact_of
    from .superseded import SUPERSEDED

    key = index_key(index, model, device)
    if not os.path.isdir(layout.entry_dir(key)):
        return None
    layout.create()
    with layout.lock(key, shared=True):
        check_entry_dir(layout.entry_dir(key))  # a real directory, this user's alone
        try:
            manifest = read_manifest(layout.manifest(key), private=True)
        except FormatError:
            return None
        recorded_index = None if manifest is None else manifest.get("index")
        if (
            manifest is None
            or not isinstance(recorded_index, str)
            or index_identity(recorded_index) != index_identity(index)
        ):
            return None
        fp = manifest.get("fingerprint")
        if not isinstance(fp, dict) or fp.get("model") != model:
            return None
        if manifest.get(SUPERSEDED) is not None:  # the index named no artifact since
            return None
        recorded = fp.get("device")
        if isinstance(device, str):
            if not isinstance(recorded, list) or recorded[:1] != [device]:
                return None
        elif recorded != [device.name, device.digest()]:
            return None
        if not files_intact(layout.entry_dir(key), manifest):
            return None
        touch(layout.manifest(key))
    record = as_read(manifest.get("provenance"))
    made = artifact_of(layout, {**manifest, "key": key, "provenance": record}, False)
    reason = (
        f"served from the cache offline: {exc}; this is the artifact the index named "
        "when it was fetched, verified then and unchanged since"
    )
    get_logger(__name__).warning("%s: %s", index, reason)
    return replace(made, choice={**(made.choice or {}), "offline": reason})


def check_source(index: str, choice: Choice, prov: Provenance | None) -> None:
    """The portable source specialized for ``choice`` is the one the index records: its
    SHA-256 (and its .ptd's) as the artifact's provenance ``prov`` names it (no extra
    read: the run hashed the source for its record, and a hit keeps that record).
    Checked before a make publishes its entry (:mod:`.from_index`), and on a hit."""
    pairs = [("source", choice.pte, None if prov is None else prov.source)]
    if choice.ptd is not None:
        pairs.append((".ptd source", choice.ptd, None if prov is None else prov.ptd_source))
    for what, want, got in pairs:
        have = None if got is None else got.sha256
        if want.get("sha256") is not None and have != want["sha256"]:
            raise IntegrityError(
                f"{want['url']}: the portable {what} has {have}, the index {index} records "
                f"{want['sha256']} for model {choice.model!r}; it is not used (the index "
                "names another version of it: run the fleet job again, or restore the "
                "source)",
                published=False,
            )


def _count(moved: dict[str, int], origin: str, nbytes: int) -> None:
    moved[origin] = moved.get(origin, 0) + nbytes


def packed_from_index(
    artifact: Artifact,
    directory: str,
    digests: tuple[str, str | None],
    opts: dict[str, Any],
    moved: dict[str, int] | None = None,
) -> tuple[CacheFile | None, str | None]:
    """``ensure(index, ..., xnnpack_cache=True)``: the packed-weight file the index lists
    for the entry's artifact (``artifact.choice["xnnpack"]``, reported by
    :func:`~ptestore.select` for this CPU), downloaded into the entry's ``directory``
    and installed there once checked (:func:`ptestore.fleet.packed.deliver`: the index's
    size and SHA-256, this artifact's ``digests``, this runtime and CPU). Returns
    ``(file, None)``; ``(None, why)`` when the fleet's runtime refused one for this
    build and CPU (the model is served without); ``(None, None)`` when the index has
    none for this device or the delivered one failed a check (logged): the caller makes
    one here. The entry's packed-weight files of the artifact it held before (kept when
    it was fetched again) are the delivery's bases: only the chunks they do not hold are
    downloaded (:mod:`ptestore.fleet.packed_chunks`); ``moved`` counts the bytes by
    where they came from (``store``, ``base``, ``part``). A field ``select`` found
    malformed (``choice["xnnpack_error"]``), or one an entry's manifest recorded before
    its form was checked (:func:`~ptestore.fleet.packed_field.check_field`), is a
    delivery that failed: logged, and made here."""
    from ..fleet.packed import deliver
    from ..fleet.packed_chunks import packed_bases
    from ..fleet.packed_field import check_field, identity_claimed, runtime_build
    from ..xnnpack.identity import cpu_fingerprint
    from ..xnnpack.refusal import transient_reason

    choice = artifact.choice or {}
    field, problem = choice.get("xnnpack"), choice.get("xnnpack_error")
    if problem is None and field is not None:  # a manifest's, recorded unchecked
        entry = f"entry {choice.get('model')}/{choice.get('made_for')}"
        try:
            field = check_field(field, os.path.join(directory, MANIFEST), entry)
        except FormatError as exc:
            problem = str(exc)
    if problem is not None:
        _not_used(artifact, str(problem))
        return None, None
    if field is None:
        return None, None
    build = runtime_build()
    if field.get("cpu") != cpu_fingerprint() or build is None or field.get("executorch") != build:
        return None, None  # made for another CPU or build: of no use here
    claimed = identity_claimed(field)
    refused = field.get("refused")
    if isinstance(refused, str) and transient_reason(refused):
        return None, None  # a passing failure an earlier fleet recorded: made here
    if refused and (claimed["pte_sha256"], claimed["ptd_sha256"]) == digests:
        return None, f"{field['refused']} (refused by the fleet's runtime)"
    if not field.get("url"):
        return None, None
    try:
        return deliver(
            field,
            artifact.pte,
            artifact.ptd,
            directory,
            opts,
            pte_sha256=digests[0],
            ptd_sha256=digests[1],
            bases=packed_bases([directory]),
            events=None if moved is None else lambda e: _count(moved, e.origin, e.nbytes),
        ), None
    except PteStoreError as exc:  # checks, the store, a url naming a directory
        _not_used(artifact, str(exc))
        return None, None


def _not_used(artifact: Artifact, why: str) -> None:
    """Log that the fleet's packed-weight file of ``artifact`` is not used (``why``):
    one is made here."""
    from .._log import get_logger

    get_logger("ptestore.device").warning(
        "%s: the fleet's XNNPACK packed-weight file was not used (%s); making one here",
        artifact.pte,
        why,
    )
