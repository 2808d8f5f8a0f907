"""``ptestore fleet retire JOB``: retire the index entries of pairs a job no longer names.

A model or device dropped from a job keeps its artifacts and its index entries: nothing
in a run knows what it used to name. Retiring marks each entry of the job's index whose
``(model, device)`` the job (all of it: no ``--models``/``--devices`` filter applies)
does not name with::

    "retired": {"at": "2026-12-02T15:00:00Z", "reason": "the job no longer names
                device 'pixel7'", "job": {"path": ..., "sha256": ...}}

A retired entry stays in the index (the index keeps every entry a run does not replace)
but :func:`~ptestore.select` never returns it, so neither ``fetch`` nor ``ensure INDEX``
does, and ``cache prune --stale`` finds the cache entries fetched for it stale. Its
files are left for ``gc`` (:mod:`.orphans`), which no longer counts them as referenced.
A later run of a job that names the pair again publishes a fresh entry over it.

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
from typing import Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, ObjectNotFound
from .index import index_url, iter_entries, update_index
from .job import Job

__all__ = ["RetireResult", "retire_dropped", "retired_reason"]


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "dry_run": self.dry_run,
            "found": self.found,
            "retired": self.retired,
            "already_retired": self.already,
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


def retire_dropped(job: Job, *, dry_run: bool = False) -> RetireResult:
    """Mark the entries of ``job``'s index whose pair ``job`` no longer names as retired
    (see the module docstring); with ``dry_run`` only list them."""
    if not isinstance(dry_run, bool):
        raise ConfigurationError(f"dry_run must be True or False, got {dry_run!r}")
    url = index_url(job)
    out = RetireResult(url, dry_run)
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stamp = {"path": job.path, "sha256": job.sha256}

    def retire(e: dict[str, Any]) -> dict[str, Any] | None:
        if e.get("retired"):
            return None
        why = retired_reason(job, e.get("model"), e.get("device"))
        if why is None:
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
    for e in sorted(changed, key=lambda e: (str(e.get("model")), str(e.get("device")))):
        out.retired.append(
            {"model": e.get("model"), "device": e.get("device"), "reason": e["retired"]["reason"]}
        )
    return out
