"""``ptestore fleet retire JOB``: retire the index entries of pairs a job no longer names.

A model or device dropped from a job keeps its artifacts and its index entries: nothing
in a run knows what it used to name. Retiring marks each entry of the job's index that
this job wrote (its ``job`` stamp names this job file: the same path, or the same file
once both paths are resolved; runs record the job file's absolute path, so this holds
from any directory) and whose ``(model, device)`` the job (all of
it: no ``--models``/``--devices`` filter applies) does not name with::

    "retired": {"at": "2026-12-02T15:00:00Z", "reason": "the job no longer names
                device 'pixel7'", "job": {"path": ..., "sha256": ...}}

A retired entry stays in the index (the index keeps every entry a run does not replace)
but :func:`~ptestore.select` never returns it, so neither ``fetch`` nor ``ensure INDEX``
does, and ``cache prune --stale`` finds the cache entries fetched for it stale. Its
files are left for ``gc`` (:mod:`.orphans`), which no longer counts them as referenced.
A later run of a job that names the pair again publishes a fresh entry over it.

Entries another job file wrote under the same prefix, or that carry no job stamp, are
left alone and counted (``other_jobs``): several jobs may share one prefix, and one job
dropping a pair says nothing of another's. ``all_jobs=True`` (``--all-jobs``) retires
them too, judged by this job's names alone.

Retirement is explicit, never a side effect of ``fleet run``: a run filtered with
``--models``/``--devices`` names a part of the job on purpose, and a run cannot tell a
pair dropped on purpose from one written by another job file under the same prefix.

Each entry is retired inside the compare-and-swap of the object that holds it
(:func:`.index.update_index`): the decision is made on the entry as it is at that moment,
so a run that publishes a fresh entry meanwhile is never overwritten by an older copy
(its fresh entry is retired, or, when it arrived after the walk of its shard, left
live); entries the job still names are never written.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, ObjectNotFound
from ..storage.types import StorageURL
from .index import index_url, iter_entries, update_index
from .job import Job

__all__ = ["RetireResult", "retire_dropped", "retired_reason", "written_by"]


@dataclass
class RetireResult:
    """What :func:`retire_dropped` did: the index, and each entry it retired."""

    index: str
    dry_run: bool
    #: ``{"model", "device", "reason"}`` of every entry retired (or to retire).
    retired: list[dict[str, Any]] = field(default_factory=list)
    #: Entries already retired before (left as they were).
    already: int = 0
    #: Whether the index exists at all.
    found: bool = True
    #: Live entries this job does not name that another job (or none) wrote: left.
    others: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "dry_run": self.dry_run,
            "found": self.found,
            "retired": self.retired,
            "already_retired": self.already,
            "other_jobs": self.others,
        }


def retired_reason(job: Job, model: object, device: object) -> str | None:
    """Why the entry of ``(model, device)`` is no longer ``job``'s, or None when the job
    names the pair."""
    models = {m.name for m in job.models}
    devices = {d.name for d in job.devices}
    if model not in models:
        return f"the job no longer names model {model!r}"
    if device not in devices:
        return f"the job no longer names device {device!r}"
    return None


def written_by(entry: dict[str, Any], job: Job) -> bool:
    """Whether ``entry``'s job stamp names ``job``'s file: the same path (as given, or
    the job file's absolute path, which runs record since they record one), or (local
    paths) the same file once both are resolved. A stamp an earlier version recorded as
    given (relative) is resolved from the current directory: it matches the job given
    by that same path, or from the directory that run was started in. The job's digest
    is not compared: retiring follows an edit of the job file."""
    stamp = entry.get("job")
    other = stamp.get("path") if isinstance(stamp, dict) else None
    if not isinstance(other, str) or not other:
        return False
    if other in (job.path, job.stamp_path):
        return True
    mine, theirs = StorageURL.of(job.stamp_path), StorageURL.of(other)
    if not (mine.local and theirs.local):
        return False
    try:
        return os.path.realpath(mine.path) == os.path.realpath(theirs.path)
    except (OSError, ValueError):
        return False


def retire_dropped(job: Job, *, dry_run: bool = False, all_jobs: bool = False) -> RetireResult:
    """Mark the entries of ``job``'s index that ``job`` wrote and whose pair it no longer
    names as retired (with ``all_jobs``, whoever wrote them: see the module docstring);
    with ``dry_run`` only list them."""
    for name, value in (("dry_run", dry_run), ("all_jobs", all_jobs)):
        if not isinstance(value, bool):
            raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    url = index_url(job)
    from .preflight import check_job_options

    check_job_options(job, url)  # as fleet run checks them, before the index is read
    out = RetireResult(url, dry_run)
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stamp = {"path": job.stamp_path, "sha256": job.sha256}
    # Pairs of other jobs seen (a set: a compare-and-swap may call retire() again).
    others: set[tuple[str, str]] = set()

    def retire(e: dict[str, Any]) -> dict[str, Any] | None:
        if e.get("retired"):
            return None
        why = retired_reason(job, e.get("model"), e.get("device"))
        if why is None:
            return None
        if not all_jobs and not written_by(e, job):
            others.add((str(e.get("model")), str(e.get("device"))))
            return None
        return {**e, "retired": {"at": now, "reason": why, "job": stamp}}

    try:
        if dry_run:
            changed = []
            for e in iter_entries(url, **job.storage_options):
                if e.get("retired"):
                    out.already += 1
                elif (new := retire(e)) is not None:
                    changed.append(new)
        else:
            report = update_index(
                url, retire, storage_options=dict(job.storage_options), version=job.index_version
            )
            changed, out.already = report.changed, report.retired
    except ObjectNotFound:
        out.found = False
        return out
    out.others = len(others)
    for e in sorted(changed, key=lambda e: (str(e.get("model")), str(e.get("device")))):
        out.retired.append(
            {"model": e.get("model"), "device": e.get("device"), "reason": e["retired"]["reason"]}
        )
    return out
