"""XNNPACK packed-weight files in a fleet: where they are stored, what the index lists of
them, and their delivery to a device (:mod:`.packing` makes them on the workers).

Beside each artifact of a device that declares its CPU fingerprint (``xnnpack_cpu`` in
the job file), through the job's storage::

    s3://models/pixel9/mlp.pte
    s3://models/pixel9/mlp.xnnpack-<id>.xpwc   the file, named after its identity
                                               (artifact x ExecuTorch build x CPU): stored
                                               once, created exclusively, never overwritten
    s3://models/pixel9/mlp.xpwc.json           its record: the artifact it is bound to and
                                               the index's ``xnnpack`` field (or why the
                                               runtime refused one) and the file's chunk
                                               digests (``chunks``, :mod:`.packed_chunks`)

The index lists, per entry, the record's field when the record is bound to the entry's
artifact (its ``.pte``'s SHA-256 and trailer checksum, its ``.ptd``'s SHA-256)::

    "xnnpack": {"url", "size", "sha256": "sha256:<hex>", "entries",
                "cpu", "executorch": {"version", "git_version"},
                "artifact_sha256": {"pte": "sha256:<hex>", "ptd": ... | null},
                "refused": null | "why", "chunks_root": "sha256-tree:<hex>" | null,
                "made": "<UTC>"}

``artifact_sha256`` are the SHA-256 of the whole ``.pte`` and ``.ptd`` files (trailers
included), as :mod:`ptestore.xnnpack.identity` binds a file. A device takes the file
only when ``cpu`` is its own fingerprint and ``executorch`` its own build
(:func:`.packed_field.why_not`; the field's form checked first,
:func:`.packed_field.check_field`); :func:`deliver` downloads it, checks its size and
SHA-256 against the index and (:func:`ptestore.xnnpack.adopt_cache`) against the
artifact it is bound to, and publishes it read-only where
:func:`ptestore.xnnpack.find_cache` finds it. Where the device holds packed-weight files
of earlier versions and the field names ``chunks_root``, only the chunks they do not
hold are downloaded (:mod:`.packed_chunks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import FormatError, IntegrityError, ObjectNotFound, PteStoreError, StorageError
from ..storage.loaders import open_loader
from ..storage.routing import options_for_loader
from ..storage.types import absolute_path
from .packed_field import FIELD_TYPES, KIND_NAMES, identity_claimed, runtime_build, why_not

if TYPE_CHECKING:
    from ..xnnpack import CacheFile
    from .chunked import FetchEvent

__all__ = [
    "RECORD_FORMAT",
    "deliver",
    "fetch_packed",
    "file_url",
    "is_packed_url",
    "read_record",
    "read_record_at",
    "record_url",
    "xnnpack_entry",
]

RECORD_FORMAT = "ptestore.fleet-xnnpack"
RECORD_VERSION = 1

_CHUNK = 8 << 20
#: A record is a small JSON object: anything larger is not one.
_RECORD_LIMIT = 1 << 20


def _stem(pte_url: str) -> str:
    return pte_url[:-4] if pte_url.endswith(".pte") else pte_url


def record_url(pte_url: str) -> str:
    """Where the record of the packed-weight file of the artifact ``pte_url`` is."""
    return _stem(pte_url) + ".xpwc.json"


def file_url(pte_url: str, name: str) -> str:
    """Where the packed-weight file ``name`` (``xnnpack-<id>``) of ``pte_url`` is."""
    return f"{_stem(pte_url)}.{name}.xpwc"


_PACKED_NAME = re.compile(r"\.xnnpack-[0-9a-f]{32}\.xpwc$")


def is_packed_url(url: str) -> bool:
    """Whether ``url`` is named as a packed-weight file beside an artifact
    (``<stem>.xnnpack-<32 hex>.xpwc``, :func:`file_url`)."""
    return bool(_PACKED_NAME.search(url))


def read_record(pte_url: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The record beside the artifact ``pte_url``; None when there is none; a
    :class:`FormatError` when it is not one."""
    return read_record_at(record_url(pte_url), options)


def read_record_at(url: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The record at ``url`` (:func:`read_record`)."""
    try:
        loader = open_loader(url, **options_for_loader(url, options, "dst"))
    except ObjectNotFound:
        return None
    try:
        size = loader.size()
        if size > _RECORD_LIMIT:
            raise FormatError(url, "record size", size, f"<= {_RECORD_LIMIT} bytes")
        data = bytes(loader.load(0, size))
    finally:
        loader.close()
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise FormatError(url, "record", data[:40], "JSON", str(exc)) from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        got = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise FormatError(url, "record format", got, repr(RECORD_FORMAT))
    if isinstance(record.get("version"), bool) or record.get("version") != RECORD_VERSION:
        raise FormatError(url, "record version", record.get("version"), str(RECORD_VERSION))
    field = record.get("xnnpack")
    if not isinstance(field, dict):
        raise FormatError(url, "record xnnpack", type(field).__name__, "an object")
    for name, kinds in FIELD_TYPES.items():
        if not isinstance(field.get(name), kinds):
            raise FormatError(url, f"record xnnpack.{name}", field.get(name), KIND_NAMES[kinds])
    return record


def _record_of_file(
    url: str, options: dict[str, Any], record: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The record beside the packed-weight file ``url`` (``<stem>.xnnpack-<id>.xpwc``:
    ``<stem>.xpwc.json``), ``record`` when the caller read it; None when it cannot be
    read (logged: the file is then downloaded whole)."""
    if record is not None:
        return record
    where = url[: url.rfind(".xnnpack-")] + ".xpwc.json"
    try:
        return read_record_at(where, options)
    except (FormatError, StorageError) as exc:
        from .._log import get_logger

        get_logger(__name__).info("%s: cannot be read (%s): %s downloaded whole", where, exc, url)
        return None


def bound_to(record: dict[str, Any], pte: dict[str, Any], ptd_sha256: str | None) -> bool:
    """Whether ``record`` was made for the artifact whose index file entry is ``pte``
    (SHA-256 and trailer checksum) with a .ptd of ``ptd_sha256``."""
    mine = record.get("pte") or {}
    return (
        mine.get("sha256") == pte.get("sha256")
        and mine.get("trailer_sha256") == pte.get("trailer_sha256")
        and record.get("ptd_sha256") == ptd_sha256
    )


def xnnpack_entry(
    pte_url: str, pte: dict[str, Any], ptd_sha256: str | None, options: dict[str, Any]
) -> dict[str, Any] | None:
    """The index entry's ``xnnpack`` field of the artifact at ``pte_url`` (its index file
    entry ``pte``, its .ptd's SHA-256): the record's, when one is there and bound to this
    artifact; else None (none was made for it)."""
    record = read_record(pte_url, options)
    if record is None or not bound_to(record, pte, ptd_sha256):
        return None
    field: dict[str, Any] = record["xnnpack"]
    return field


Progress = Callable[[str, int, int], None]


def deliver(
    field: dict[str, Any],
    pte: str,
    ptd: str | None,
    directory: str,
    options: dict[str, Any],
    *,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    progress: Progress | None = None,
    chunk_size: int = _CHUNK,
    bases: Sequence[str] = (),
    events: Callable[[FetchEvent], None] | None = None,
    record: dict[str, Any] | None = None,
    installed_for: str | None = None,
) -> CacheFile:
    """The index's packed-weight file ``field`` for the local artifact ``pte`` (and
    ``ptd``; their whole-file SHA-256 when the caller knows them), downloaded into
    ``directory`` and installed there (:func:`ptestore.xnnpack.adopt_cache`): checked
    against the index's size and SHA-256 and against this artifact, runtime and CPU
    before it is published read-only. Nothing unverified is ever left under a name
    :func:`ptestore.xnnpack.find_cache` reads; a check that fails raises
    :class:`IntegrityError` (``published=False``) naming the file.

    ``bases``: packed-weight files of earlier versions here (:func:`.packed_chunks.
    packed_bases`). When the field names a chunk record (``chunks_root``; ``record`` is
    the record beside the file when the caller read it) the file is downloaded chunk by
    chunk, each checked as it arrives (:mod:`.packed_chunks`): the chunks the bases hold
    are taken from them, and a download that fails (not a check) leaves its ``.part``
    and its verified chunks for the next call to resume from. Without one it is
    downloaded whole, from the start. ``events`` says where each piece came from;
    ``installed_for`` is passed to :func:`~ptestore.xnnpack.adopt_cache`."""
    from ..provenance.chunks import well_formed
    from ..storage.flock import locked
    from ..xnnpack import adopt_cache
    from .download import discard_part
    from .packed_chunks import download_delta, download_whole, recorded_chunks

    sha = field.get("sha256")
    if not well_formed(sha, ("sha256",)):
        raise FormatError(str(field.get("url")), "xnnpack.sha256", sha, "'sha256:<64 hex digits>'")
    dest = os.path.join(directory, f"xnnpack-download-{sha[7:23]}.xpwc")
    # One delivery of a file into a directory at a time: another (the same DEST fetched
    # twice at once, two DESTs of one artifact) would resume this one's live .part.
    with locked(dest + ".lock", remove=True):
        chunks = None
        if field.get("chunks_root"):
            chunks = recorded_chunks(field, _record_of_file(str(field["url"]), options, record))
        try:
            if chunks is not None:
                digest = download_delta(
                    field, dest, chunks, options, bases, chunk_size, progress, events
                )
            else:
                discard_part(dest)
                digest = download_whole(
                    field, dest + ".part", options, progress, chunk_size, events
                )
            made = adopt_cache(
                dest + ".part",
                pte=pte,
                ptd=ptd,
                directory=directory,
                made_for=identity_claimed(field),
                size=int(field["size"]),
                sha256=digest,
                pte_sha256=pte_sha256,
                ptd_sha256=ptd_sha256,
                what=str(field["url"]),
                hashed=True,
                installed_for=installed_for,
            )
        except BaseException as exc:
            if chunks is None or isinstance(exc, IntegrityError):
                discard_part(dest)  # else kept: the next call resumes at its verified chunks
            else:  # adopt_cache may have made it read-only before it failed
                with contextlib.suppress(OSError):
                    os.chmod(dest + ".part", 0o600)
            raise
        discard_part(dest)  # its resume marker
        return made


def fetch_packed(
    src: str,
    offered: dict[str, Any] | None,
    files: list[dict[str, Any]],
    options: dict[str, Any],
    chunk_size: int = _CHUNK,
    progress: Progress | None = None,
    *,
    indexed: bool,
    base_dirs: Sequence[str] = (),
    events: Callable[[FetchEvent], None] | None = None,
    malformed: str | None = None,
    trusted_origins: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``fetch(..., xnnpack_cache=True)``, once the pair is published: the packed-weight
    file of this artifact, runtime and CPU delivered beside the .pte (:func:`deliver`):
    from an index (``indexed``) the one it lists for this CPU (``offered``, the
    selection's), for an artifact fetched by URL ``src`` the one its record beside it
    names; the packed-weight files of earlier versions beside the .pte and in
    ``base_dirs`` (those of ``fetch``'s bases) are its bases. ``{"path", "url", "size",
    "sha256", "reason", "received", "from_base", "removed"}``: ``path`` None and ``reason`` why
    when there is none for this device (another CPU or ExecuTorch build, none made, a
    refusal by the runtime); ``received`` the bytes downloaded, ``from_base`` those
    taken from earlier files, ``removed`` the earlier files installed for this .pte and
    for no other, removed once this one is installed (:mod:`ptestore.xnnpack.users`).
    A delivery that fails, or a field for this CPU the selection found ``malformed``
    (why), is an error saying that the pair was published
    (:class:`~ptestore.errors.PartialPublish`; :class:`IntegrityError` with
    ``published=True`` for a check that failed).

    A record is read from the store as an index is, and held to the same rules
    (docs/fleet.md, "What an index may name"): its field's form
    (:func:`.packed_field.check_field`) and its ``url`` (:func:`.index_bounds.
    check_named_url`, the artifact's URL standing for the index's, with the
    ``trusted_origins``), checked before anything it names is requested; a record that
    breaks them is a delivery that failed, as an index's malformed field. The file it
    names is fetched under the redirect rule of an object an index names
    (:func:`~ptestore.storage.redirects.index_redirects`)."""
    from ..xnnpack.identity import cpu_fingerprint
    from .job import ptd_beside
    from .packed_chunks import packed_bases
    from .packed_source import kept_file, not_delivered, record_for

    pte = next(  # by role: the .ptd is where fetch puts it, beside the .pte
        f for f in files if all(g is f or g["path"] == ptd_beside(f["path"]) for g in files)
    )
    ptd = next((g for g in files if g is not pte), None)
    # a file already current (fetch left it as it was) is not one this call published
    published = tuple(str(f["path"]) for f in files if not f.get("current"))
    done = f"{pte['path']} was " + ("already current" if pte.get("current") else "published")
    artifact = absolute_path(str(pte["path"]))
    directory = os.path.dirname(artifact)

    def failed(why: str, *, none: bool = False) -> str:
        return not_delivered(done, why, kept_file(pte, ptd, directory), none=none)

    if indexed and malformed is not None:
        raise _partial(
            f"{malformed}; {failed(_MALFORMED)}",
            published,
        )
    cpu = cpu_fingerprint()
    field = offered
    record = None
    if not indexed:
        try:
            where = record_url(src)
            found = read_record_at(where, options)
            record = record_for(found, where, pte, ptd, cpu, trusted_origins)
        except FormatError as exc:
            why = f"the XNNPACK record beside {src} is malformed"
            raise _partial(f"{exc}; {failed(why)}", published) from exc
        if record is not None:
            field = {**record["xnnpack"], "named_by": "xnnpack record", "named_in": src}
    build = runtime_build()
    reason = why_not(field, cpu, build, source="index" if indexed else "record")
    if reason is None and build is None:
        reason = "no ExecuTorch runtime here to load it with (pip install 'ptestore[xnnpack]')"
    if reason is not None or field is None:
        none = {"path": None, "url": None, "size": None, "sha256": None, "reason": reason}
        return {**none, "received": 0, "from_base": 0, "removed": []}
    moved = {"store": 0, "base": 0}

    def count(event: FetchEvent) -> None:
        moved[event.origin] = moved.get(event.origin, 0) + event.nbytes
        if events is not None:
            events(event)

    from ..storage.redirects import index_redirects

    # what a record names is fetched as what an index names (fetch entered it for one)
    guard = contextlib.nullcontext() if indexed else index_redirects(src, trusted_origins)
    try:
        with guard:
            made = deliver(
                field,
                str(pte["path"]),
                None if ptd is None else str(ptd["path"]),
                directory,
                options,
                progress=progress,
                chunk_size=chunk_size,
                bases=packed_bases([directory, *base_dirs], artifact),
                events=count,
                record=record,
                installed_for=artifact,
            )
    except IntegrityError as exc:
        raise IntegrityError(f"{exc}; {failed('', none=True)}", published=bool(published)) from exc
    except PteStoreError as exc:  # a failed delivery (a url naming a directory too)
        again = "fetch --xnnpack-cache again resumes its download"
        raise _partial(
            f"{exc}; {failed(again if isinstance(exc, StorageError) else '')}", published
        ) from exc
    except KeyboardInterrupt as exc:
        after = f"after publishing {pte['path']}" if published else f"{pte['path']} already current"
        raise KeyboardInterrupt(
            f"{after}; its XNNPACK packed-weight file was not "
            "installed (fetch --xnnpack-cache again resumes its download)"
        ) from exc
    from pathlib import Path

    from ..xnnpack.users import release

    gone = release(Path(directory), artifact, Path(made.path))
    return {
        "path": str(made.path),
        "url": field["url"],
        "size": made.size,
        "sha256": "sha256:" + made.sha256,
        "reason": None,
        "received": moved["store"],
        "from_base": moved["base"],
        "removed": [str(p) for p in gone],
    }


_MALFORMED = "the index's entry for it is malformed"


def _partial(message: str, published: tuple[str, ...]) -> StorageError:
    """The error of a packed-weight file not delivered after the pair was fetched: a
    :class:`~ptestore.errors.PartialPublish` naming what this call published, or, when
    every file was already current (nothing published), a plain :class:`StorageError`."""
    from ..errors import PartialPublish

    return PartialPublish(message, published=published) if published else StorageError(message)
