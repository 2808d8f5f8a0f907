"""The index a fleet run publishes next to its artifacts: which artifact is whose.

One JSON object per job destination prefix (``<prefix>/ptestore-index.json``, the part
of the destination template before its first ``{``)::

    {"format": "ptestore.index", "version": 2, "updated": "2026-12-01T08:00:00Z",
     "entries": [
       {"model": "mlp", "device": "pixel9",
        "device_options": {...}, "device_digest": "sha256:...",
        "key": "sha256:...",                         # the provenance key's digest
        "job": {"path", "sha256"} | null,
        "source": {"url", "size", "sha256"}, "ptd_source": {...} | null,
        "pte": {"url", "size", "sha256", "trailer_sha256"},
        "ptd": {"url", "size", "sha256", "trailer_sha256"} | null,   # or, stored
               # once by content: {"url": ".../_shared/sha256/<hex>.ptd", "size",
               #  "sha256", "trailer_sha256": null, "shared": true}
        "compatibility": [{"id", "spec", "version", "compatibility"}],
        "created": "...",
        "xnnpack": {...} | null}]}        # only for a device that declares xnnpack_cpu:
                                          # its packed-weight file (:mod:`.packed`)

``sha256`` is the SHA-256 of the file's bytes before its provenance trailer and
``trailer_sha256`` the trailer's own checksum (of its JSON): together with ``size`` they
pin every byte of the file (a shared .ptd has no trailer: ``sha256`` is the whole
object's, and its name). Version 1 indexes (no shared entries) are read and
rewritten as version 2. Entries are keyed by ``(model, device)``; a run replaces its
pairs' entries and keeps every other.

Concurrent or partial runs never lose entries: the index is read with its version
token, merged and published with ``publish(mode="if-match")`` (``"create"`` when there is
no index yet), and read and merged again on a conflict, under the one retry policy
(:data:`~ptestore._retry.CONFLICT_RETRY`). The writers do the compare-and-swap: on S3
``If-Match``/``If-None-Match`` on the PutObject, on local disks an ``flock`` and a hash
check before the rename, in memory a version counter (docs/storage.md). Other fsspec
stores get an unconditional write (last writer wins).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import FormatError, ObjectNotFound, PreconditionFailed
from ..provenance import Provenance, read_trailer
from ..storage.loaders import open_loader, split_url
from ..storage.routing import options_for_loader, options_for_writer
from ..storage.types import StorageURL
from .job import Job

if TYPE_CHECKING:
    from ..provenance.record import ContentDigest

__all__ = [
    "publish_pairs",
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INDEX_VERSION",
    "entry_for",
    "index_entries",
    "index_url",
    "load_index",
    "publish_index",
]

INDEX_FORMAT = "ptestore.index"
INDEX_VERSION = 2
#: Versions read (version 1 has no shared .ptd entries; it is rewritten as version 2).
READABLE_VERSIONS = (1, 2)
INDEX_NAME = "ptestore-index.json"
#: Stores whose writers publish conditionally (``publish(mode="if-match")``).
_CAS_PROTOCOLS = ("file", "memory", "s3")


def index_url(job: Job) -> str:
    """Where ``job``'s index goes: beside the artifacts, in the directory of the
    destination template before its first placeholder."""
    head = job.destination.split("{", 1)[0]
    cut = head.rfind("/")
    return (head[: cut + 1] if cut >= 0 else "") + INDEX_NAME


def artifact_entry(url: str, options: dict[str, Any]) -> tuple[dict[str, Any], Provenance]:
    """An artifact's entry (URL, size, SHA-256 of its content and of its trailer) and
    its record; a file without a trailer naming its bytes is a :class:`FormatError`."""
    loader = open_loader(url, **options_for_loader(url, options, "dst"))
    try:
        trailer = read_trailer(loader)
        if trailer is None:
            raise FormatError(
                url, "provenance trailer", None, "present (an artifact that names its bytes)"
            )
        prov = Provenance.from_dict(trailer.record(), url)
        if prov.content is None:
            raise FormatError(url, "provenance content", None, "a digest of the bytes")
        return {
            "url": url,
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
        "url": url,
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
) -> dict[str, Any]:
    """The index entry of the artifact at ``pte_url`` (and its ``ptd_url``, or with
    ``shared_root`` the .ptd stored there by content, :mod:`.shared`), from its
    trailers (ranged reads only); with ``xnnpack`` (its device declares a CPU
    fingerprint) also its ``"xnnpack"`` field (:func:`.packed.xnnpack_entry`: the
    packed-weight file beside it, or null)."""
    pte, prov = artifact_entry(pte_url, options)
    ptd = None
    if shared_root is not None and prov.ptd_output is not None:
        from .shared import shared_url

        ptd = shared_entry(shared_url(shared_root, prov.ptd_output.sha256), prov.ptd_output)
    elif ptd_url is not None:
        ptd = artifact_entry(ptd_url, options)[0]
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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(old: dict[str, Any] | None, entries: list[dict[str, Any]]) -> dict[str, Any]:
    kept = {(e["model"], e["device"]): e for e in (old or {}).get("entries", [])}
    for e in entries:
        kept[(e["model"], e["device"])] = e
    return {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "updated": _now(),
        "entries": [kept[k] for k in sorted(kept)],
    }


def check_index(value: object, url: str) -> dict[str, Any]:
    """``value`` if it is an index, else :class:`FormatError` naming the field."""
    if not isinstance(value, dict):
        raise FormatError(url, "index", type(value).__name__, "a JSON object")
    if value.get("format") != INDEX_FORMAT:
        raise FormatError(url, "index format", value.get("format"), repr(INDEX_FORMAT))
    if value.get("version") not in READABLE_VERSIONS:
        raise FormatError(
            url,
            "index version",
            value.get("version"),
            " or ".join(str(v) for v in READABLE_VERSIONS),
        )
    if not isinstance(value.get("entries"), list):
        raise FormatError(url, "index entries", value.get("entries"), "a list")
    return value


def _parse(data: bytes, url: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise FormatError(url, "index", data[:40], "JSON", str(exc)) from None
    return check_index(value, url)


def load_index(url: str | os.PathLike[str], **storage_options: Any) -> dict[str, Any]:
    """Read and check the index at ``url``."""
    target = os.fspath(url)
    loader = open_loader(target, **options_for_loader(target, storage_options, "dst"))
    try:
        return _parse(bytes(loader.load(0, loader.size())), target)
    finally:
        loader.close()


def publish_index(url: str, entries: Iterable[dict[str, Any]], options: dict[str, Any]) -> str:
    """Merge ``entries`` into the index at ``url`` (conditional writes, see the module
    docstring); returns ``url``."""
    new = list(entries)
    if split_url(url)[0] in _CAS_PROTOCOLS:
        _publish_conditionally(url, new, options)
        return url
    try:
        old: dict[str, Any] | None = load_index(url, **options)
    except ObjectNotFound:
        old = None
    from ..writers import open_writer

    w = open_writer(url, **options)
    w.write(json.dumps(_merge(old, new), indent=1).encode(), 0)
    w.publish("overwrite")
    return url


def _publish_conditionally(
    url: str, entries: list[dict[str, Any]], options: dict[str, Any]
) -> None:
    """Read the index and its version, merge, publish if it is still that version;
    again on a conflict (another run published in between)."""
    from .._retry import CONFLICT_RETRY, is_conflict
    from ..writers import open_writer
    from ..writers.versions import read_versioned

    local = StorageURL.of(url).local
    # The version is read where the writer publishes: memory:// through the writer's own
    # store (it takes the writer's options), S3 with the reading side's client options.
    if local:
        read_options: dict[str, Any] = {}
    elif split_url(url)[0] == "memory":
        read_options = options_for_writer(url, options)
    else:
        read_options = options_for_loader(url, options, "dst")
    write_options: dict[str, Any] = (
        {"auto_mkdir": True} if local else options_for_writer(url, options)
    )
    if split_url(url)[0] == "s3":  # served as JSON, as before
        extra = dict(write_options.get("s3_additional_kwargs") or {})
        extra.setdefault("ContentType", "application/json")
        write_options["s3_additional_kwargs"] = extra
    attempts = [0]

    def attempt() -> None:
        attempts[0] += 1
        current = read_versioned(url, **read_options)
        old = None if current.version is None else _parse(current.data, url)
        w = open_writer(url, **write_options)
        w.write(json.dumps(_merge(old, entries), indent=1).encode(), 0)
        w.publish(current.mode, expected=current.version)

    try:
        CONFLICT_RETRY.call(attempt, what=f"{url}: index update", retry_on=is_conflict)
    except PreconditionFailed as exc:
        if attempts[0] < CONFLICT_RETRY.attempts:
            raise
        raise PreconditionFailed(
            f"{url}: the index changed under every one of {attempts[0]} attempts to merge "
            f"into it (last: {exc})",
            url=url,
            expected=exc.expected,
            found=exc.found,
            refused_by=exc.refused_by,
        ) from exc


def index_entries(job: Job, pairs: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """The entries of ``job``'s ``(model, device)`` pairs (read from their trailers,
    a few at once)."""
    import concurrent.futures as cf

    wanted = set(pairs)
    todo = [p for p in job.pairs() if (p.model.name, p.device.name) in wanted]

    from .shared import shared_root

    def one(p: Any) -> dict[str, Any]:
        root = shared_root(job.destination) if p.ptd_destination is not None else None
        e = entry_for(
            p.destination,
            p.ptd_destination,
            job.storage_options,
            root,
            xnnpack=p.xnnpack_cpu is not None,
        )
        e["model"] = p.model.name
        return e

    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, todo))


def publish_pairs(job: Job, pairs: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """Index ``job``'s ``(model, device)`` pairs that are done or skipped: ``(url, None)``
    once published, ``(None, why)`` when the index could not be (the run's artifacts are
    unaffected), ``(None, None)`` when there is nothing to index."""
    from ..errors import PteStoreError

    if not pairs:
        return None, None
    try:
        url = publish_index(index_url(job), index_entries(job, pairs), dict(job.storage_options))
    except PteStoreError as exc:
        return None, str(exc)
    return url, None
