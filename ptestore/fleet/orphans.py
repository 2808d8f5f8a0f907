"""``gc --job JOB`` and ``gc INDEX_PREFIX``: the artifacts no index references any more.

A fleet job leaves, under its destination root (where its index lives), per-device files
(``<root>/<device>/<model>.pte``, ``.ptd``) and shared objects
(``<root>/_shared/sha256-tree/<hex>.ptd``, :mod:`.shared`). A model or device dropped from the
job (and retired, :mod:`.retire`), or a newer run that stored another ``.ptd``, leaves
objects that no index names. :func:`collect_orphans` removes them, and only them:

- **which indexes**: every ``ptestore-index.json`` under the prefix (the directory the
  kernel resolves it to: ``lnk/..`` is ``lnk``'s target's parent), and the one of each
  directory above it (a job rooted above the prefix references files in it); a sharded
  (version 3) index is read shard by shard, all of them. Every entry
  that is not retired references its ``.pte``, its ``.ptd`` (per device or shared), its
  source and its ``.ptd`` source. An index that cannot be read whole stops the
  collection: nothing is removed when a reference may be missed (:mod:`.orphan_refs`: a
  missing shard directory or leaf, a catalog its leaves disagree with, a malformed live
  entry, an entry whose ``.pte`` is outside the index's directory: an index moved or
  copied from elsewhere; a path that is not a regular file is never waited on). With
  the job's pairs (``gc --job``), a pair without an entry in the job's index stops it
  too: a lost model directory or leaf the index's own structure cannot show;
- **which files**: only below the directory of one of those indexes (a prefix without an
  index governs nothing), only ``.pte``/``.ptd`` files and XNNPACK packed-weight files
  with their records (:mod:`.packed`; an entry's ``xnnpack`` field references both), and
  only ptestore's own: a shared object by its content address, a packed-weight file by
  its name (``<model>.xnnpack-<32 hex>.xpwc``), a record when it is one, any other file
  when it carries a provenance trailer recording the device it was made for (a portable
  source never does). Anything else is neither touched nor reported;
- **when**: an orphan younger than the grace period (its modification time; on S3
  ``LastModified``, measured against the server's clock) is kept: a run may be about to
  name it in its index (a run stores its objects before it publishes its index). The
  indexes are read again just before the first removal: an object named meanwhile is
  kept, and so is one whose index is gone since (a directory without an index governs
  nothing);
- **a time no age can be measured from** (before 2000-01-01, or more than a day after
  gc's now: :func:`~ptestore.gc.implausible`, stamped by a clock that was wrong): the
  age is unknown, never taken for an old one: the orphan is kept and reported with its
  time, and a hold of unknown time still holds (both kept, reported). A
  ``LastModified`` without a zone is UTC (:mod:`.orphan_store`);
- **which object**: only the one listed. Just before its removal the object is looked at
  again (locally ``lstat``: device, inode, size, ``mtime_ns``; on S3 ``HEAD``: ETag,
  ``LastModified``, size): one a run stored since the listing (a retired pair made
  again, not yet in the run's index) is kept, reported ``skipped: changed since
  listed``. On S3 the delete is also conditional (``If-Match`` on the listed ETag), so
  an object of other bytes stored after that look is refused by the service; what is
  left is a same-bytes rewrite (locally: any rewrite) landing between the look and the
  delete. A delete retried after an attempt whose answer was lost (it may have landed)
  that finds the object gone counts it ``removed``; found gone otherwise, it is
  ``skipped: already gone``, and a refused one looks at the object again.

A run that *reuses* an old orphan (a retired pair named again and found current, a
shared ``.ptd`` found stored) names it only when it publishes its index: before it
relies on it, it writes the object's *hold* beside it (:mod:`.holds`). An object held
within the grace is kept (``skipped: a run held it within the grace``) whatever its own
age, and one held since the listing is kept too (its hold is looked at again just
before the removal); a hold older than the grace holds nothing and is removed like an
orphan (kind ``"hold"``). Keep the grace longer than the longest run. gc finds an
object's hold by the same :func:`~.holds.hold_url` the run wrote it at (a shortened name
for a long one: both take it from the object's name alone) and knows a hold by
:func:`~.holds.is_hold`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

from ..coordinator.targets import target_identity
from ..errors import PteStoreError
from ..gc import GcEntry, implausible
from ..storage.types import StorageURL
from .holds import hold_url, is_hold
from .index import INDEX_NAME
from .orphan_refs import index_references, referenced
from .orphan_store import OrphanStore, Stamp
from .packed import is_packed_url, read_record
from .shared import is_shared_url

__all__ = ["DEFAULT_GRACE", "collect_orphans", "referenced"]

#: Default grace period (seconds): an unreferenced object younger than this is kept.
DEFAULT_GRACE = 7 * 86400.0

#: A job's ``(model, device)``.
Pair = tuple[str, str]


def _indexes(store: OrphanStore, root: str, listed: list[str]) -> list[str]:
    """The index URLs that govern ``root``: those under it, then those above it."""
    sep = "/" if not store.url.local else os.sep
    out = [u for u in listed if u.rsplit(sep, 1)[-1] == INDEX_NAME] + store.odd
    up = store.parent(root)
    while up is not None:
        out.append(store.join(up, INDEX_NAME))
        up = store.parent(up)
    return out


def _references(
    indexes: list[str], options: dict[str, Any], job: tuple[str, Collection[Pair]] | None
) -> tuple[set[Any], list[str], str | None]:
    """``(referenced identities, the directories of the indexes that exist, an error)``;
    ``job``: the index of a job and the pairs it names, each of which must have an entry
    there (when there is one) if it was made (:func:`_made`)."""
    refs: set[tuple[str, str]] = set()
    dirs: list[str] = []
    for url in indexes:
        entries: set[Pair] | None = None if job is None or url != job[0] else set()
        try:
            found = index_references(url, options, entries)
        except PteStoreError as exc:
            return refs, dirs, f"{url}: cannot read the index: {exc}"
        if found is None:
            if os.path.islink(url):  # an index under a local prefix linked to nothing
                return refs, dirs, f"{url}: cannot read the index: a symbolic link to nothing"
            continue
        if job is not None and entries is not None:
            missing = [p for p in job[1] if p not in entries and _made(job[1], p)]
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                error = (
                    f"{url}: the job names {missing[0][0]}/{missing[0][1]}{more}, which has no "
                    "entry in the index, live or retired: the index is incomplete (its shards "
                    "lost the entry) or the job's run never published it, and gc would take "
                    "that pair's files for orphans. Run `ptestore fleet run JOB` (or "
                    "`ptestore fleet check-index`) first"
                )
                return refs, dirs, error
        refs |= found
        dirs.append(url[: -len(INDEX_NAME)])
    return refs, dirs, None


def _made(pairs: Collection[Pair], pair: Pair) -> bool:
    """Whether the job's ``pair`` was made: its destination is among the files listed,
    or (a local one, spelled through a link) exists, when ``pairs`` maps each pair to
    its destination and the files listed (:class:`_JobPairs`); True when they are not
    known. A pair never made (its backend always fails, a run still going) leaves no
    file an entry of it could name; one made without an entry is an index that lost it
    (or a run not published yet), and gc stops."""
    if not isinstance(pairs, _JobPairs):
        return True
    dst = pairs[pair]
    if target_identity(dst) in pairs.listed:
        return True
    return StorageURL.of(dst).local and os.path.lexists(dst)


class _JobPairs(dict[Pair, str]):
    """The pairs of ``gc --job``'s job, each with its destination, and the identities
    of the files gc listed (:func:`_made`)."""

    def __init__(self, destinations: Mapping[Pair, str], listed: set[Any]) -> None:
        super().__init__(destinations)
        self.listed = listed


def _ours(url: str, options: dict[str, Any]) -> str | None:
    """``"shared-object"``, ``"packed-weights"``, ``"packed-record"`` or ``"artifact"``
    for ptestore's own files, else None."""
    if is_shared_url(url):
        return "shared-object"
    if is_packed_url(url):
        return "packed-weights"
    if url.endswith(".xpwc.json"):
        try:
            record = read_record(url[: -len(".xpwc.json")] + ".pte", options)
        except PteStoreError:
            return None
        return None if record is None else "packed-record"
    from ..provenance import read_provenance
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader

    try:
        loader = open_loader(url, **options_for_loader(url, options))
    except PteStoreError:
        return None
    try:
        prov = read_provenance(loader)
    except PteStoreError:
        return None
    finally:
        loader.close()
    return "artifact" if prov is not None and prov.device is not None else None


def collect_orphans(
    target: str | os.PathLike[str],
    *,
    grace: float = DEFAULT_GRACE,
    dry_run: bool = False,
    pairs: Collection[Pair] | Mapping[Pair, str] | None = None,
    **storage_options: Any,
) -> list[GcEntry]:
    """Remove the fleet artifacts under ``target`` (a directory, an S3 prefix or an
    index's URL) that no index references, once older than ``grace`` seconds (see the
    module docstring); with ``dry_run`` only list them. ``pairs``: the ``(model,
    device)`` pairs of the job whose index is the one of ``target`` (``gc --job``): one
    without an entry there stops the collection; given as a mapping to each pair's
    destination (what ``gc --job`` passes), only one whose destination exists (it was
    made: a pair that always fails, or one a running job has not made yet, is not a
    lost entry)."""
    from ..gc import check_older_than

    check_older_than(grace, "grace")
    with OrphanStore(os.fspath(target), storage_options) as store:  # its client closed
        return _collect(store, grace, dry_run, pairs, storage_options)


def _collect(
    store: OrphanStore,
    grace: float,
    dry_run: bool,
    pairs: Collection[Pair] | Mapping[Pair, str] | None,
    storage_options: dict[str, Any],
) -> list[GcEntry]:
    """:func:`collect_orphans` on ``store``."""
    root = store.root()
    listed = list(store.files(root))
    urls = [u for u, _, _, _ in listed]
    holds = {u: (t, s) for u, t, _, s in listed if is_hold(u)}  # by the hold's URL
    if isinstance(pairs, Mapping):  # each pair's destination: a pair never made is no loss
        pairs = _JobPairs(pairs, {target_identity(u) for u in urls})
    job = None if pairs is None else (store.join(root, INDEX_NAME), pairs)
    refs, dirs, error = _references(_indexes(store, root, urls), storage_options, job)
    if error is not None:
        return [GcEntry(error.split(": ", 1)[0], "index", 0.0, f"failed: {error}")]
    if not dirs:
        return []
    now = store.now(root)
    found: list[tuple[str, str, float, int, Stamp, str | None]] = []
    for url, mtime, size, stamp_ in listed:
        name = url.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]
        held = is_hold(name)  # a run's hold (:mod:`.holds`)
        if not (held or name.endswith((".pte", ".ptd", ".xpwc", ".xpwc.json"))):
            continue
        if name.startswith("."):
            continue
        if not any(url.startswith(d) for d in dirs) or target_identity(url) in refs:
            continue
        kind = "hold" if held else _ours(url, storage_options)
        if kind is not None:  # a time no age can be measured from: unknown, kept
            why = implausible(mtime, now)
            age = 0.0 if why is not None else max(0.0, now - mtime)
            found.append((url, kind, age, size, stamp_, why))
    # Objects before holds: a hold this gc removes is looked at again with its object,
    # which would then be kept "held since listed" (a local listing's order is the
    # directory's).
    found.sort(key=lambda f: f[1] == "hold")
    out: list[GcEntry] = []
    due = [f for f in found if f[5] is None and f[2] >= grace]
    if due and not dry_run:  # named since the first read (a run that just published)?
        refs, dirs, error = _references(_indexes(store, root, urls), storage_options, job)
        if error is not None:
            return [GcEntry(error.split(": ", 1)[0], "index", 0.0, f"failed: {error}")]
    for url, kind, age, size, stamp_, why in found:
        held_at, held_stamp = holds.get(hold_url(url), (None, None))
        held_why = None if held_at is None else implausible(held_at, now, "hold's time")
        if why is not None:  # stamped by a clock that was wrong: never taken for old
            action = f"skipped: {why}: its age is unknown"
        elif age < grace:
            action = f"skipped: younger than the grace of {grace:g}s"
        elif held_why is not None:  # a hold of unknown time still holds
            action = f"skipped: {held_why}: a hold of unknown time still holds"
        elif held_at is not None and now - held_at < grace:  # a run relies on it
            action = f"skipped: a run held it within the grace of {grace:g}s"
        elif target_identity(url) in refs:
            action = "skipped: an index names it now"
        elif dry_run:
            action = "would remove"
        elif not any(url.startswith(d) for d in dirs):  # its index went since the first read
            action = "skipped: no index governs it now"
        else:
            try:  # only the object listed, and only if still older than the grace
                if kind != "hold" and store.stamp(hold_url(url)) != held_stamp:
                    action = "skipped: a run held it since listed"
                else:
                    action = store.remove(url, stamp_)
            except Exception as exc:  # a refused or failed delete: reported, never silent
                action = f"failed: {exc}"
        out.append(GcEntry(url, kind, age, action, size))
    return out
