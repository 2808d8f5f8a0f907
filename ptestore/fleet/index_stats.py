"""What the operations on a fleet index did: each object a run updated
(:class:`ObjectStats`: attempts, conflicts, writes, splits), what a reader read
(:class:`ReadCount`), and the one-line summary of a run's index objects
(:func:`shards_line`). Kept by :mod:`.index_store`, which re-exports them; a publish or
an update reports them all in an :class:`IndexReport` (:mod:`.index` re-exports it)."""

from __future__ import annotations

import threading
from typing import Any

from .._dataclass import dataclass, field

__all__ = ["IndexReport", "ObjectStats", "ReadCount", "shards_line"]


@dataclass
class ObjectStats:
    """One object a run updated: how many attempts its compare-and-swap took."""

    url: str
    kind: str
    #: Read-modify-write attempts (1 when nobody else wrote it meanwhile).
    attempts: int = 0
    #: Attempts lost to another writer (412 / ``PreconditionFailed`` / ``AlreadyExists``).
    conflicts: int = 0
    #: Whether this run published a new version (False: nothing to change).
    written: bool = False
    #: Entries of the run's pairs in it (a leaf).
    entries: int = 0
    #: Splits this run committed (a leaf that grew past the bound).
    splits: int = 0
    #: Attempts whose write may or may not have landed (``PublishUncertain``: an answer
    #: lost, and the retry refused by a version that is not ours); counted in
    #: ``conflicts`` too, each read again like one.
    uncertain: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.url,
            "kind": self.kind,
            "entries": self.entries,
            "attempts": self.attempts,
            "conflicts": self.conflicts,
            "uncertain": self.uncertain,
            "written": self.written,
            "splits": self.splits,
        }


@dataclass
class ReadCount:
    """What an operation read: objects found, bytes, requests (a missing object is a
    request that found nothing)."""

    objects: int = 0
    bytes: int = 0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, size: int | None) -> None:
        with self.lock:
            self.requests += 1
            if size is not None:
                self.objects += 1
                self.bytes += size

    def part(self, size: int) -> None:
        """A read of part of an object (counted whole by another: a large root's head)."""
        with self.lock:
            self.requests += 1
            self.bytes += size

    def to_dict(self) -> dict[str, int]:
        return {"objects": self.objects, "bytes": self.bytes, "requests": self.requests}


@dataclass
class IndexReport:
    """What publishing or updating an index did: its version, and every object it
    touched with its compare-and-swap attempts and conflicts."""

    url: str
    version: int
    stats: list[ObjectStats] = field(default_factory=list)
    #: What a migration from version 1/2 did (None: no migration).
    migrated: dict[str, Any] | None = None
    #: The entries an update changed (as published), and how many it examined.
    changed: list[dict[str, Any]] = field(default_factory=list)
    examined: int = 0
    retired: int = 0
    #: ``{"model", "device", "url"}`` of each entry a publish left out: the artifact at
    #: ``url`` was replaced by another run since the entry was made (:mod:`.index_pins`).
    superseded: list[dict[str, str]] = field(default_factory=list)

    @property
    def conflicts(self) -> int:
        return sum(s.conflicts for s in self.stats)

    @property
    def uncertain(self) -> int:
        return sum(s.uncertain for s in self.stats)

    def to_dict(self) -> dict[str, Any]:
        """The ``index_shards`` of ``fleet run --json``: per object, and the totals."""
        return {
            "version": self.version,
            "migrated": self.migrated,
            "objects": len(self.stats),
            "written": sum(1 for s in self.stats if s.written),
            "conflicts": self.conflicts,
            "uncertain": self.uncertain,
            "shards": [s.to_dict() for s in self.stats],
            "superseded": [dict(s) for s in self.superseded],
        }


def shards_line(shards: dict[str, Any]) -> str:
    """The ``index shards`` line of a run's summary, from ``IndexReport.to_dict()``:
    version, objects, writes, conflicts (those of them whose write's outcome was unknown,
    and the kinds of object they were in)."""
    hot = [s for s in shards["shards"] if s["conflicts"]]
    text = (
        f"v{shards['version']}: {shards['objects']} objects, {shards['written']} written, "
        f"{shards['conflicts']} conflicts"
    )
    if shards.get("uncertain"):  # absent from a report an earlier ptestore wrote
        text += f" ({shards['uncertain']} uncertain)"
    if hot:
        text += f" retried in {len(hot)} ({', '.join(sorted({s['kind'] for s in hot}))})"
    if shards.get("migrated"):
        text += f"; migrated from v{shards['migrated']['from_version']}"
    return text
