"""The index a fleet run publishes next to its artifacts: which artifact is whose.

One index per job destination prefix, found at ``<prefix>/ptestore-index.json`` (the part
of the destination template before its first ``{``). Its entries, one per
``(model, device)``::

    {"model": "mlp", "device": "pixel9",
     "device_options": {...}, "device_digest": "sha256:...",
     "key": "sha256:...",                         # the provenance key's digest
     "job": {"path", "sha256"} | null,
     "source": {"url", "size", "sha256"}, "ptd_source": {...} | null,
     "pte": {"url", "size", "sha256", "trailer_sha256"},
     "ptd": {"url", "size", "sha256", "trailer_sha256"} | null,   # or, stored
            # once by content: {"url": ".../_shared/sha256-tree/<hex>.ptd", "size",
            #  "sha256", "trailer_sha256": null, "shared": true}
     "compatibility": [{"id", "spec", "version", "compatibility"}],
     "created": "...", "retired": {...} (fleet/retire.py),
     "xnnpack": {...} | null}          # only for a device that declares xnnpack_cpu:
                                       # its packed-weight file (:mod:`.packed`)

``sha256`` is the SHA-256 of the file's bytes before its provenance trailer and
``trailer_sha256`` the trailer's own checksum (of its JSON): together with ``size`` they
pin every byte of the file (a shared .ptd has no trailer: ``sha256`` is the whole
object's, and its name). A run replaces its pairs' entries and keeps every other.

**Versions.** Version 3 (:mod:`.index_v3`), written on every store with compare-and-swap
(local files, ``memory://``, S3): ``ptestore-index.json`` is a small root naming a
directory of shards: per model, a trie of leaves of bounded size and a catalog of its
distinct compatibility stamps; a run touches only its pairs' leaves and its models'
catalogs, each by compare-and-swap, and reports each (:class:`IndexReport`). Versions 1
and 2 (:mod:`.index_v2`: one object holding every entry) are read, and migrated to
version 3 by the first publish that finds them (:mod:`.index_migrate`); a store without
compare-and-swap keeps writing version 2 (last writer wins).

Every update is a read-modify-write inside the compare-and-swap loop of the object it
changes (:mod:`.index_store`): :func:`publish_index` merges entries,
:func:`update_index` applies a change to each entry as it is at that moment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, FormatError, PteStoreError
from .index_bounds import check_entry_size, check_name, check_v2_entries
from .index_entry import artifact_entry, entry_for, shared_entry
from .index_migrate import NAMED_CHECKED, create_index, migrate_index, named_beside
from .index_pins import ArtifactPin, EntryGuard, superseded_line
from .index_root import overwritten
from .index_stats import IndexReport
from .index_store import IndexStore
from .index_v2 import INDEX_FORMAT, check_index, now, parse_index, publish_v2, update_v2
from .job import Job

if TYPE_CHECKING:
    from .index_v3 import ShardedIndex

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INDEX_VERSION",
    "IndexReport",
    "artifact_entry",
    "check_index",
    "create_index",
    "entry_for",
    "find_entry",
    "index_entries",
    "index_url",
    "iter_entries",
    "load_index",
    "migrate_index",
    "open_index",
    "publish_entries",
    "publish_index",
    "publish_pairs",
    "shared_entry",
    "update_index",
]

#: The version written on a store with compare-and-swap.
INDEX_VERSION = 3
INDEX_NAME = "ptestore-index.json"


def index_url(job: Job) -> str:
    """Where ``job``'s index goes: beside the artifacts, in the directory of the
    destination template before its first placeholder."""
    head = job.destination.split("{", 1)[0]
    cut = head.rfind("/")
    return (head[: cut + 1] if cut >= 0 else "") + INDEX_NAME


def open_index(
    url: str | os.PathLike[str], options: dict[str, Any] | None = None, *, whole: bool = False
) -> tuple[dict[str, Any], ShardedIndex | None, IndexStore]:
    """The index at ``url`` to read: its root (a version 1/2 index holds its entries),
    the sharded index of a version 3 root (else None), and the store (it counts what
    was read). :class:`~ptestore.errors.ObjectNotFound` when there is no index.

    A version 1/2 index beside a shard directory a version 3 root named (an older
    ptestore wrote it over a migrated index: :mod:`.index_root`) is not the whole index:
    with ``whole`` (a reader of every entry: ``load_index``, ``iter_entries``, so gc and
    ``fleet retire``) a :class:`FormatError`, else (a device looking its entry up, which
    reads the copies of the root in at most :data:`~.index_migrate.NAMED_CHECKED` of
    those directories) a warning, and its answer is this index's."""
    target = os.fspath(url)
    store = IndexStore(target, dict(options or {}))
    if store.cas:
        data, version = store.read(target)
    else:
        from .index_v2 import read_plain

        data, version = read_plain(store)
    if version is None:
        raise store.missing()
    root = parse_index(data, target)
    if root["version"] != 3:
        limit = None if whole else NAMED_CHECKED  # a device's look-up: a few at most
        if store.cas and (named := named_beside(store, limit)):
            problem = overwritten(target, root["version"], named)
            if whole:
                raise problem
            from .._log import get_logger

            get_logger(__name__).warning("%s", problem)
        return root, None, store
    if not store.cas:  # its nodes are read with version tokens: refused before any
        raise _no_tokens(target, store.protocol)
    from .index_root import check_layout
    from .index_v3 import ShardedIndex

    return root, ShardedIndex(store, check_layout(root, target)), store


def _no_tokens(url: str, protocol: str) -> ConfigurationError:
    """The error of a version 3 root read from a store without version tokens."""
    return ConfigurationError(
        f"{url}: a version 3 (sharded) index is read with version tokens, which "
        f"{protocol}:// objects do not have: serve a version 2 index there (a job's "
        "index_version = 2, or this index as ptestore.fleet.index.load_index returns it, "
        "written as one object), or read this one from its store (s3://, a local file)"
    )


def load_index(url: str | os.PathLike[str], **storage_options: Any) -> dict[str, Any]:
    """Read and check the index at ``url``, whole, as one object: a version 1/2 index as
    it is; a version 3 one flattened into version 2's form (every entry of every shard,
    sorted by model and device, under ``"entries"``; its root under ``"sharded"``), which
    ``select`` and any reader of version 2 read as it is. It reads every shard: for tools
    and tests (a device reads a few objects, :mod:`.index_view`)."""
    root, sharded, _ = open_index(url, storage_options, whole=True)
    if sharded is None:
        return root
    entries = sorted(sharded.iter_entries(), key=lambda e: (str(e["model"]), str(e["device"])))
    return {"format": INDEX_FORMAT, "version": 2, "updated": now(), "entries": entries,
            "sharded": root}  # fmt: skip


def iter_entries(url: str | os.PathLike[str], **storage_options: Any) -> Iterator[dict[str, Any]]:
    """Every entry of the index at ``url``, a shard at a time (model by model)."""
    root, sharded, _ = open_index(url, storage_options, whole=True)
    if sharded is None:  # an entry that is not one refused, never skipped
        yield from check_v2_entries(root["entries"], os.fspath(url))
    else:
        yield from sharded.iter_entries()


def find_entry(
    url: str | os.PathLike[str], model: str, device: str, **storage_options: Any
) -> dict[str, Any] | None:
    """The entry of ``(model, device)`` in the index at ``url`` (None: none); a version
    3 index reads the model's catalog and the entry's leaf only."""
    from .index_bounds import check_asked

    check_asked("model", model)
    check_asked("device", device)
    root, sharded, _ = open_index(url, storage_options)
    if sharded is not None:
        return sharded.find(model, device)
    for e in check_v2_entries(root["entries"], os.fspath(url)):  # none skipped
        if e.get("model") == model and e.get("device") == device:
            return e
    return None


def publish_entries(
    url: str,
    entries: Iterable[dict[str, Any]],
    options: dict[str, Any],
    *,
    version: int | None = None,
    pins: dict[tuple[str, str], list[ArtifactPin]] | None = None,
    errors: dict[str, PteStoreError] | None = None,
) -> IndexReport:
    """Merge ``entries`` into the index at ``url`` (created when there is none; a
    version 1/2 index on a store with compare-and-swap is migrated to version 3 first,
    unless ``version=2``). ``pins``: per ``(model, device)``, the versions of the
    artifacts its entry was made from (:func:`entry_for`); an entry that would replace
    one naming other bytes while an artifact of it was replaced since is left out,
    and named in the report's ``superseded`` (:mod:`.index_pins`). A model of a version
    3 index whose entries cannot be published (a lost leaf, a catalog rebuild given up,
    a storage failure on its objects) leaves the others published: its error is put in
    ``errors`` (model -> error), or without it the first is raised (by model name)."""
    from .index_migrate import open_for_writing

    new = list(entries)
    for e in new:
        if not isinstance(e.get("model"), str) or not isinstance(e.get("device"), str):
            raise FormatError(url, "index entry", {k: e.get(k) for k in ("model", "device")},
                              "an entry with a model and a device name")  # fmt: skip
        for name in ("model", "device"):
            check_name(e[name], url, f"index entry {name}")
        check_entry_size(e, url, f"index entry {e['model']}/{e['device']}")
    store = IndexStore(url, dict(options))
    sharded, migrated, stats = open_for_writing(store, version=version)
    guard = None if pins is None else EntryGuard(pins)
    if sharded is None:
        report = IndexReport(url, 2, stats + publish_v2(store, new, guard))
    else:
        made = sharded.publish(new, guard=guard, errors=errors)
        report = IndexReport(url, 3, stats + made, migrated)
    if guard is not None:
        report.superseded = guard.superseded()
        for s in report.superseded:
            from .._log import get_logger

            get_logger(__name__).warning("%s: %s", url, superseded_line(s))
    return report


def publish_index(url: str, entries: Iterable[dict[str, Any]], options: dict[str, Any]) -> str:
    """Merge ``entries`` into the index at ``url`` (see :func:`publish_entries`);
    returns ``url``."""
    publish_entries(url, entries, options)
    return url


def update_index(
    url: str | os.PathLike[str],
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    models: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    version: int | None = None,
) -> IndexReport:
    """Apply ``change`` to every entry of the index at ``url`` (of ``models`` only,
    when given), inside the compare-and-swap loop of the object that holds it: ``change``
    sees each entry as it is at that moment (again after a conflict) and returns its new
    version, or None to keep it. It must keep the entry's model and device. A version
    1/2 index on a store with compare-and-swap is migrated to version 3 first (unless
    ``version=2``). :class:`~ptestore.errors.ObjectNotFound` when there is no index."""
    from .index_migrate import open_for_writing

    target = os.fspath(url)
    store = IndexStore(target, dict(storage_options or {}))

    def checked(entry: dict[str, Any]) -> dict[str, Any] | None:
        new = change(entry)
        if new is not None and (new.get("model"), new.get("device")) != (
            entry.get("model"),
            entry.get("device"),
        ):
            raise ConfigurationError(
                f"{target}: update_index's change must keep an entry's model and device "
                f"({entry.get('model')!r}, {entry.get('device')!r})"
            )
        return new

    _, whole, _ = open_index(target, store.options, whole=True)  # ObjectNotFound: none
    if whole is not None and models is None:  # its shards there, before a writer marks them
        from .index_whole import model_segments

        models = [m for m in map(whole.model_of, model_segments(whole)) if m]
    sharded, migrated, stats = open_for_writing(store, version=version)
    if sharded is None:
        wanted = None if models is None else set(models)
        made, more, seen, retired = update_v2(
            store, lambda e: checked(e) if wanted is None or e.get("model") in wanted else None
        )
        return IndexReport(target, 2, stats + more, changed=made, examined=seen, retired=retired)
    report = sharded.update(checked, models=models)
    return IndexReport(
        target,
        3,
        stats + report.stats,
        migrated,
        changed=report.changed,
        examined=report.examined,
        retired=report.retired,
    )


def index_entries(
    job: Job,
    pairs: Iterable[tuple[str, str]],
    skipped: list[str] | None = None,
    pins: dict[tuple[str, str], list[ArtifactPin]] | None = None,
) -> list[dict[str, Any]]:
    """The entries of ``job``'s ``(model, device)`` pairs (read from their trailers,
    a few at once). An artifact whose trailer names another device, or other options
    for it, than its pair's (another pair's artifact copied there, another job's), or
    whose trailer cannot be read (gone, damaged, a storage failure), is never indexed
    as the pair's: its reason is appended to ``skipped``, or, without a list, raised
    (:class:`FormatError`, or the read's error). ``pins`` gets, per pair, the versions of
    the artifacts read (:func:`entry_for`)."""
    entries, refused = _pair_entries(job, pairs, pins)
    if refused and skipped is None:
        raise refused[0][2]
    if skipped is not None:
        skipped += [str(exc) for _, _, exc in refused]
    return entries


def _pair_entries(
    job: Job,
    pairs: Iterable[tuple[str, str]],
    pins: dict[tuple[str, str], list[ArtifactPin]] | None,
) -> tuple[list[dict[str, Any]], list[tuple[str, str, PteStoreError]]]:
    """:func:`index_entries`'s entries, and ``(model, device, why)`` of each pair whose
    artifact's trailer names another device or cannot be read."""
    import concurrent.futures as cf

    wanted = set(pairs)
    todo = [p for p in job.pairs() if (p.model.name, p.device.name) in wanted]

    from .shared import shared_root

    def one(p: Any) -> dict[str, Any] | PteStoreError:
        root = shared_root(job.destination) if p.ptd_destination is not None else None
        read: list[ArtifactPin] = []
        try:  # an artifact gone, damaged or unreadable since: its pair alone left out
            e = entry_for(
                p.destination,
                p.ptd_destination,
                job.storage_options,
                root,
                xnnpack=p.xnnpack_cpu is not None,
                pins=read,
            )
        except PteStoreError as exc:
            return exc
        if pins is not None:
            pins[(p.model.name, p.device.name)] = read
        e["model"] = p.model.name
        digest = p.device.digest()
        if e["device"] != p.device.name or e["device_digest"] != digest:
            return FormatError(
                p.destination,
                "provenance device",
                (e["device"], e["device_digest"]),
                f"the pair ({p.model.name}, {p.device.name})'s device, "
                f"({p.device.name!r}, {digest!r})",
                "not indexed",
            )
        return e

    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(one, todo))
    refused = [
        (p.model.name, p.device.name, x)
        for p, x in zip(todo, got, strict=True)
        if isinstance(x, PteStoreError)
    ]
    return [x for x in got if not isinstance(x, PteStoreError)], refused


def publish_pairs(
    job: Job, pairs: list[tuple[str, str]], problems: list[dict[str, Any]] | None = None
) -> tuple[str | None, str | None, IndexReport | None]:
    """Index ``job``'s ``(model, device)`` pairs that are done or skipped: ``(url, why,
    report)`` once any is published, ``(None, why, None)`` when none could be (the run's
    artifacts are unaffected), ``(None, None, None)`` when there is nothing to index.
    ``why`` (None: every pair indexed) joins the messages of what left pairs out, each
    also appended to ``problems`` as ``{"model", "device", "index", "error"}``: a pair
    whose artifact's trailer names another device or cannot be read (the other pairs
    indexed: :func:`index_entries`), a model whose
    entries could not be published (``device`` null: :func:`publish_entries`' errors;
    the other models' are published), or the index itself (``model`` null too: no
    entry published)."""
    if not pairs:
        return None, None, None
    url = index_url(job)
    left: list[dict[str, Any]] = []

    def record(model: str | None, device: str | None, exc: PteStoreError) -> None:
        left.append({"model": model, "device": device, "index": url, "error": str(exc)})

    pins: dict[tuple[str, str], list[ArtifactPin]] = {}
    report = None
    try:
        entries, refused = _pair_entries(job, pairs, pins)
        for model, device, exc in refused:
            record(model, device, exc)
        if entries:
            failed: dict[str, PteStoreError] = {}
            report = publish_entries(
                url,
                entries,
                dict(job.storage_options),
                version=job.index_version,
                pins=pins,
                errors=failed,
            )
            for model in sorted(failed):
                record(model, None, failed[model])
            if not {e["model"] for e in entries} - set(failed):
                report = None  # no model's entries published
    except PteStoreError as exc:
        record(None, None, exc)
    if problems is not None:
        problems += left
    why = "; ".join(p["error"] for p in left) or None
    return (None if report is None else url), why, report
