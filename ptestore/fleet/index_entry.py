"""An index entry made from an artifact's trailers (:mod:`.index` describes the entry):
the URL, size and digests of each file, and the provenance record's device, key, job,
sources and backends; ranged reads only. :func:`ptd_entry_of`: what the .ptd of an
artifact fetched by URL must be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FormatError, ObjectNotFound
from ..provenance import Provenance, read_trailer
from ..storage.loaders import open_loader
from ..storage.routing import options_for_loader
from ..storage.types import absolute_local
from .index_pins import ArtifactPin, pin_of

if TYPE_CHECKING:
    from ..provenance.record import ContentDigest

__all__ = ["artifact_entry", "entry_for", "ptd_entry_of", "shared_entry"]


def artifact_entry(
    url: str, options: dict[str, Any], pins: list[ArtifactPin] | None = None
) -> tuple[dict[str, Any], Provenance]:
    """An artifact's entry (URL, size, SHA-256 of its content and of its trailer) and
    its record; a file without a trailer naming its bytes (or whose record claims other
    bytes than precede its trailer) is a :class:`FormatError`. The version read is
    appended to ``pins``, when given and the store gives one (:mod:`.index_pins`)."""
    loader_options = options_for_loader(url, options, "dst")
    loader = open_loader(url, **loader_options)
    try:
        trailer = read_trailer(loader)
        if trailer is None:
            raise FormatError(
                url, "provenance trailer", None, "present (an artifact that names its bytes)"
            )
        prov = Provenance.of_trailer(trailer, url)
        if prov.content is None:
            raise FormatError(url, "provenance content", None, "a digest of the bytes")
        if pins is not None and (pin := pin_of(loader, url, loader_options)) is not None:
            pins.append(pin)
        return {
            "url": absolute_local(url),
            "size": loader.size(),
            "sha256": prov.content.sha256,
            "trailer_sha256": "sha256:" + trailer.sha256,
        }, prov
    finally:
        loader.close()


def shared_entry(url: str, content: ContentDigest) -> dict[str, Any]:
    """The entry of a .ptd stored once at its content address ``url`` (no trailer: the
    .pte's record names its size and SHA-256)."""
    return {
        "url": absolute_local(url),
        "size": content.size,
        "sha256": content.sha256,
        "trailer_sha256": None,
        "shared": True,
    }


def entry_for(
    pte_url: str,
    ptd_url: str | None,
    options: dict[str, Any],
    shared_root: str | None = None,
    *,
    xnnpack: bool = False,
    pins: list[ArtifactPin] | None = None,
) -> dict[str, Any]:
    """The index entry of the artifact at ``pte_url`` (and its ``ptd_url``, or with
    ``shared_root`` the .ptd stored there by content, :mod:`.shared`), from its
    trailers (ranged reads only); with ``xnnpack`` (its device declares a CPU
    fingerprint) also its ``"xnnpack"`` field (:func:`.packed.xnnpack_entry`: the
    packed-weight file beside it, or null). ``pins`` gets the versions of the files
    read that a run replaces at their URL (not a shared .ptd: :mod:`.index_pins`)."""
    pte, prov = artifact_entry(pte_url, options, pins)
    ptd = None
    if shared_root is not None and prov.ptd_output is not None:
        from .shared import shared_url

        ptd = shared_entry(shared_url(shared_root, prov.ptd_output.sha256), prov.ptd_output)
    elif ptd_url is not None:
        ptd = artifact_entry(ptd_url, options, pins)[0]
    dev = prov.device
    entry: dict[str, Any] = {
        "model": None,
        "device": None if dev is None else dev.name,
        "device_options": None if dev is None else dev.options,
        "device_digest": None if dev is None else dev.digest,
        "key": prov.key().digest(),
        "job": None if prov.job is None else prov.job.to_dict(),
        "source": {k: prov.source.to_dict()[k] for k in ("url", "size", "sha256")},
        "ptd_source": None
        if prov.ptd_source is None
        else {k: prov.ptd_source.to_dict()[k] for k in ("url", "size", "sha256")},
        "pte": pte,
        "ptd": ptd,
        "compatibility": [b.to_dict() for b in prov.backends],
        "created": prov.created,
    }
    if xnnpack:
        from .packed import xnnpack_entry

        ptd_sha256 = None if prov.ptd_output is None else prov.ptd_output.sha256
        entry["xnnpack"] = xnnpack_entry(pte_url, pte, ptd_sha256, options)
    return entry


def ptd_entry_of(url: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """What the .ptd of the artifact at ``url`` must be (an index entry), when its
    record names one: the one beside it, else the one stored by content above it. One
    beside it that is not the record's (one an earlier version wrote per device beside
    a fleet's .pte) does not hide the copy stored by content."""
    from ..provenance import read_provenance
    from .job import ptd_beside
    from .shared import SHARED_DIR, locate_shared

    loader = open_loader(url, **options_for_loader(url, options))
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    if prov is None or prov.ptd_output is None:
        return None
    beside = ptd_beside(url)
    found = locate_shared(url, prov.ptd_output.sha256, lambda u: _exists(u, options))
    if _exists(beside, options):
        try:
            entry = artifact_entry(beside, options)[0]
        except FormatError:  # no trailer: only the copy stored by content can say
            if found is None:
                raise
        else:
            if entry["sha256"] == prov.ptd_output.sha256 or found is None:
                return entry
    if found is None:
        raise ObjectNotFound(
            f"{url}: its record names a .ptd ({prov.ptd_output.sha256}); there is none at "
            f"{beside}, nor in a {SHARED_DIR}/ directory above it"
        )
    return shared_entry(found, prov.ptd_output)


def _exists(url: str, options: dict[str, Any]) -> bool:
    try:
        open_loader(url, **options_for_loader(url, options)).close()
    except ObjectNotFound:
        return False
    return True
