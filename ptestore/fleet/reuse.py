"""What a run reuses, held before it relies on it (:mod:`.holds`).

gc (:mod:`.orphans`) keeps an object an index names, or a young one. A run names what
it relies on only when it publishes its index, at its end, so an old object it reuses
that no live entry names yet needs a hold. :func:`hold_reused` looks, before any pair
runs, at the live entries of the plan's pairs in the job's index (one read of their
leaves, as the final publish does) and:

- **skipped pairs** (current: nothing is written): holds every object such a pair
  relies on (its ``.pte``, its ``.ptd`` or the shared one, its packed-weight file and
  record, as the plan found them) that its own live entry does not name: a pair
  retired and named again, one whose entry is gone or names other objects. A pair whose
  object is gone by the time its hold is written (removed between the plan and the
  hold) is run instead; one whose hold cannot be written fails, with that hold's
  error (the pairs that do not rely on it go on);
- **pairs to run** with a shared ``.ptd``: lists the shared objects stored when the run
  starts and gives each task those no live entry names
  (:attr:`~.work.PairTask.hold_shared`): a pair that finds one of them stored holds it
  before it relies on it (:class:`~.shared.SharedStore`). An object stored during the
  run (by a sibling pair) or named by an entry needs no hold: young, or referenced.
  Only the entries of the plan's pairs are read (never the whole index): a filtered
  run holds a shared object only other pairs' entries name when it finds it;
- **pairs to run** with a shared ``.ptd`` or a packed-weight file: each task gets what
  its pair's live entry names (:attr:`~.work.PairTask.named`): a worker that finds its
  artifact current (a re-pack, a retry) does not hold those.

In the common case (every pair indexed as it is, no shared orphan) nothing is written.
An index that cannot be read is taken as naming nothing; a listing that cannot be made
leaves every find to hold what it finds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._dataclass import replace
from .._log import get_logger
from ..coordinator.targets import target_identity
from ..errors import ObjectNotFound, PteStoreError
from ..storage.types import StorageURL
from .holds import hold_each

if TYPE_CHECKING:
    from .job import Job
    from .plan import Plan, PlannedPair

__all__ = ["MAX_HOLD_SHARED", "hold_reused", "live_entries"]

log = get_logger(__name__)

#: Shared objects no live entry names, given to each task at most (each task carries
#: them: about 110 bytes pickled each, and a Dask run submits every task at once); more
#: (a prefix whose orphans gc has not removed yet): every find holds what it finds (one
#: more hold per shared object a pair finds stored).
MAX_HOLD_SHARED = 64

Identity = tuple[str, str]


def hold_reused(plan: Plan, unable: Callable[[PlannedPair], str | None] | None = None) -> int:
    """Hold what the skipped pairs of ``plan`` rely on and their live index entries do
    not name, and give each pair to run the shared objects it must hold if it finds
    them (see the module docstring); changes the skipped pairs whose objects are gone to
    ``"run"`` and those whose holds cannot be written to ``"fail"``. ``unable`` says why
    the run cannot make a pair again (its workers lack the device's CPU), or None: a
    pair whose object is gone and that the run cannot make again fails with that
    reason. Returns how many objects it held.

    Call it once whatever refuses the whole run has passed: the holds it writes stay
    (gc removes them after the grace)."""
    job = plan.job
    skipped = [p for p in plan.pairs if p.action == "skip" and p.relies]
    sharing = [p for p in plan.pairs if p.action == "run" and p.task and p.task.shared_root]
    # pairs whose worker may find their artifact current and hold it (a re-pack)
    packing = [p for p in plan.pairs if p.action == "run" and p.task and p.task.xnnpack_cpu]
    running = list({id(p): p for p in sharing + packing}.values())
    if not skipped and not running:
        return 0
    try:
        entries = live_entries(job, [_key(p) for p in skipped + running])
    except ObjectNotFound:
        entries = {}  # no index yet: nothing is named
    except PteStoreError as exc:
        log.warning("%s: cannot read the index, taken as naming nothing: %s", job.path, exc)
        entries = {}
    if sharing:
        _give_unnamed_shared(job, sharing, entries)
    for p in running:  # a worker does not hold what its own live entry names
        assert p.task is not None
        p.task = replace(p.task, named=frozenset(_named(entries.get(_key(p)))))
    need: dict[str, list[PlannedPair]] = {}
    for p in skipped:
        named = _named(entries.get(_key(p)))
        for url in p.relies:
            if target_identity(url) not in named:
                need.setdefault(url, []).append(p)
    if not need:
        return 0
    gone, failed = hold_each(list(need), job.storage_options)
    for url, why in failed.items():  # only the pairs that rely on it, each with its own
        for p in need[url]:
            if p.action != "fail":
                p.action = "fail"
                p.reason = (
                    "current, but what it reuses cannot be held against ptestore gc "
                    f"(a hold beside each object): {why}"
                )
    from .estimate import estimate_pair

    for url in gone:
        for p in need[url]:
            if p.action == "skip" and p.task is not None:
                if unable is not None and (cannot := unable(p)) is not None:
                    p.action = "fail"
                    p.reason = (
                        f"current when planned, but {url} is gone since, and this run "
                        f"cannot make it again: {cannot}"
                    )
                    continue
                p.action = "run"
                p.reason = f"current when planned, but {url} is gone since: made again"
                p.estimate = estimate_pair(p.task, "run", p.reason, job)
    held = len(need) - len(failed)
    log.info("%s: held %d reused objects no live index entry names", job.path, held)
    return held


def _give_unnamed_shared(
    job: Job, sharing: list[PlannedPair], entries: dict[Identity, Any]
) -> None:
    """Give each task of ``sharing`` the shared objects stored now that no live entry
    of ``entries`` names (left None, every find holds, when they cannot be listed or
    are too many)."""
    roots = {p.task.shared_root for p in sharing if p.task and p.task.shared_root}
    try:
        stored = {target_identity(u) for root in roots for u in _shared_objects(root, job)}
    except Exception as exc:  # any listing failure: every find holds what it finds
        log.warning("%s: cannot list the shared objects, each one found is held: %s", job.path, exc)
        return
    named: set[Identity] = set()
    for e in entries.values():
        named |= _named(e)
    unnamed = frozenset(stored - named)
    if len(unnamed) > MAX_HOLD_SHARED:
        return
    for p in sharing:
        assert p.task is not None
        p.task = replace(p.task, hold_shared=unnamed)


def _shared_objects(root: str, job: Job) -> list[str]:
    """The URLs of the objects stored under the shared root ``root`` (``.../_shared/``),
    listed now (never from a listing cached earlier)."""
    out: list[str] = []
    u = StorageURL.of(root)
    for algorithm in ("sha256-tree", "sha256"):
        directory = f"{root}{algorithm}"
        if u.local:
            path = os.path.join(u.path, algorithm)
            try:
                out += [os.path.join(path, n) for n in os.listdir(path) if n.endswith(".ptd")]
            except FileNotFoundError:
                pass
            continue
        scheme = directory.partition("://")[0]
        found = _listed(directory, job)
        out += [f"{scheme}://{str(p).lstrip('/')}" for p in found if str(p).endswith(".ptd")]
    return out


def _listed(directory: str, job: Job) -> list[Any]:
    """The paths under the remote ``directory`` now (none when there is none), listed
    through a filesystem whose one retry layer is the policy of the job's ``retry_*``
    options (s3fs's and botocore's retries off): a transient failure retried by it
    alone, then a :class:`~ptestore.errors.StorageError` naming the directory and the
    request."""
    from .._retry import to_storage_error
    from ..storage.filesystems import close_filesystem, open_filesystem
    from ..storage.routing import options_for_loader

    u = StorageURL.of(directory)
    opts = options_for_loader(u, job.storage_options, "dst")
    fs, path, retry = open_filesystem(u, opts)  # on S3 its own client, closed below
    request = "ListObjectsV2" if u.protocol == "s3" else "list"

    def listing() -> list[Any]:
        fs.invalidate_cache(path)
        found: list[Any] = fs.ls(path, detail=False, refresh=True)
        return found

    try:
        return retry.call(listing, what=f"{directory}/: {request}")
    except Exception as exc:
        error = to_storage_error(exc, f"{directory}/", request)
        if isinstance(error, ObjectNotFound):
            return []
        raise error from exc
    finally:
        close_filesystem(fs)


def _key(p: PlannedPair) -> Identity:
    return p.pair.model.name, p.pair.device.name


def _named(entry: dict[str, Any] | None) -> set[Identity]:
    """The identities the live ``entry`` names (none when it is retired or absent)."""
    if entry is None:
        return set()
    from .orphans import referenced

    try:
        return referenced({"entries": [entry]})
    except PteStoreError:  # a relative URL: which file it names is unknown
        return set()


def live_entries(job: Job, pairs: Iterable[Identity]) -> dict[Identity, Any]:
    """The entries of ``job``'s index for ``pairs`` (``(model, device)``), retired ones
    included; a version 3 index is read per model: its catalog and the leaves that hold
    the devices. :class:`~ptestore.errors.ObjectNotFound` when there is no index."""
    from .index import index_url, open_index

    wanted = list(dict.fromkeys(pairs))
    root, sharded, _ = open_index(index_url(job), dict(job.storage_options))
    out: dict[Identity, Any] = {}
    if sharded is None:
        keep = set(wanted)
        for e in root["entries"]:
            if isinstance(e, dict) and (key := (e.get("model"), e.get("device"))) in keep:
                out[(str(key[0]), str(key[1]))] = e
        return out
    from .index_catalog import depth_range

    by_model: dict[str, list[str]] = {}
    for model, device in wanted:
        by_model.setdefault(model, []).append(device)
    for model, devices in by_model.items():
        catalog, _ = sharded.read_catalog(model)
        lo, hi = depth_range(catalog)
        for node, found in sharded.trie(model).locate(devices, lo, hi).values():
            for device in found:
                if device in node.entries:
                    out[(model, device)] = node.entries[device]
    return out
