"""The version of each artifact an index entry is made from, and the check, made inside
the compare-and-swap of the entry's leaf, that its URL still holds that version.

A run makes a pair's entry from the trailer at the pair's destination
(:func:`.index.entry_for`), after its pairs ran, and merges it into the index, replacing
the pair's entry. Two runs of one pair into one index (two ``fleet run`` of a job,
overlapping jobs) each publish their artifact at the same URL, then their entry. As A
publishes ``a`` and reads its trailer, B publishes ``b`` over it and writes its entry,
then A writes its own: the index names ``a`` while the URL holds ``b``, and ``select``
and ``fetch`` refuse the pair (``EntryMismatch``) until the next run.

So an entry comes with the version of each artifact it names that is replaced at its URL
(:data:`PINNED_ROLES`: its ``.pte``, and a ``.ptd`` beside it; a shared ``.ptd`` is named
by its bytes and never replaced), as the loader that read its trailer saw it, without a
request (:func:`stamp_of`): locally the file's device, inode, size and ``mtime_ns``; on
S3 its size, ETag and version id; in memory its size and creation time. Inside the
update of the entry's leaf, after the leaf is read and before its conditional write,
an entry that replaces one naming other artifact bytes is checked
(:meth:`EntryGuard.admits`): each pinned URL opened once (a HEAD on S3, an open and
``fstat`` locally) and its version compared. One that another run replaced since is not
written (that run's entry is the index's) and is reported: the pair and the URL
(``IndexReport.superseded``, ``index_shards`` of ``fleet run --json``, a line of its
summary), not a failure.

Why this is enough. Let Z be the run that published the URL's artifact last; it reads
that artifact's trailer after its publish, and its check passes (the URL holds its
version), so it writes its entry, unless the leaf names those bytes already.

- A write after Z's entry write replaces an entry naming Z's bytes: one naming other
  bytes is checked, finds the URL holds Z's version and is not written; one naming the
  same bytes is written unchecked, harmlessly.
- A write before Z's entry write is replaced by it.
- The check is made on every attempt, after the read: an attempt whose check passed and
  whose conditional write lost to another writer (Z's entry, say) reads the leaf again
  and checks again; one whose write succeeded had no write between its read and its
  write, so an entry Z writes after the check comes after that write and replaces it.

So once the runs have written their entries, the pair's entry names what its URL holds.
Between them it may not, for a moment (a check passes, then another run publishes over
it before the write), as between an artifact's publish and its run's entry write; a run
that published its artifact and never wrote its entry (killed, or its index not
published) leaves the index behind the URL until the next run, as before. The same
argument is why an entry that replaces none, or one naming the same artifact bytes (a
rerun that skipped the pair, an ``xnnpack`` field added), is written without a check:
a write of either kind before Z's entry write is replaced, and after it is of the
second kind. A run that replaces no entry of other bytes makes no request; one that
does, one per such entry per attempt (and pinned URL). An artifact whose store gives no
version (another fsspec protocol) is not checked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ObjectNotFound

if TYPE_CHECKING:
    from ..storage.types import DataLoader
    from .index_trie import Change

__all__ = [
    "PINNED_ROLES",
    "ArtifactPin",
    "EntryGuard",
    "pin_of",
    "replacing",
    "same_artifacts",
    "stamp_of",
    "superseded_line",
]

#: The files of an entry that a run replaces at their URL.
PINNED_ROLES = ("pte", "ptd")
#: What names a file's bytes in an entry.
_FILE_KEYS = ("url", "size", "sha256", "trailer_sha256")


def stamp_of(loader: DataLoader) -> tuple[Any, ...] | None:
    """The version of the object ``loader`` reads, as it saw it when opened (no
    request): a local file's device, inode, size and ``mtime_ns`` (a publish renames or
    links a new file over the path); a remote object's size, ETag, version id and
    creation time. None when the store gives none of those."""
    fileno = getattr(loader, "fileno", None)
    if callable(fileno):
        st = os.fstat(fileno())
        return ("file", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    etag, version, created = (getattr(loader, n, None) for n in ("etag", "version_id", "created"))
    if etag is None and version is None and created is None:
        return None
    return ("object", loader.size(), etag, version, created)


class ArtifactPin:
    """The version (:func:`stamp_of`) of the artifact at ``url`` an entry was made
    from; ``options`` are its loader's."""

    def __init__(self, url: str, stamp: tuple[Any, ...], options: Mapping[str, Any]) -> None:
        self.url = url
        self.stamp = stamp
        self.options = dict(options)

    def held(self) -> bool:
        """Whether ``url`` holds that version now (one open: a HEAD on S3, an open and
        an ``fstat`` locally); False when there is nothing there."""
        from ..storage.loaders import open_loader

        try:
            loader = open_loader(self.url, **self.options)
        except ObjectNotFound:
            return False
        try:
            return stamp_of(loader) == self.stamp
        finally:
            loader.close()


def pin_of(loader: DataLoader, url: str, options: Mapping[str, Any]) -> ArtifactPin | None:
    """The pin of the artifact at ``url`` that ``loader`` (opened with ``options``)
    read, or None when its store gives no version."""
    stamp = stamp_of(loader)
    return None if stamp is None else ArtifactPin(url, stamp, options)


def same_artifacts(old: object, new: Mapping[str, Any]) -> bool:
    """Whether the entry ``old`` (as read from a leaf) names the same bytes as ``new``
    at each of :data:`PINNED_ROLES` (URL, size, digests)."""
    if not isinstance(old, dict):
        return False
    for role in PINNED_ROLES:
        a, b = old.get(role), new.get(role)
        if a is None and b is None:
            continue
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False
        if any(a.get(k) != b.get(k) for k in _FILE_KEYS):
            return False
    return True


class EntryGuard:
    """The pins of the entries one publish writes (``(model, device)`` -> the pins of
    its entry), and the pairs it leaves out because another run replaced an artifact
    (module docstring). Called from the threads that update leaves."""

    def __init__(self, pins: Mapping[tuple[str, str], Sequence[ArtifactPin]]) -> None:
        self.pins = {key: tuple(p) for key, p in pins.items()}
        self._lock = threading.Lock()
        self._left: dict[tuple[str, str], str] = {}  # pair -> the URL found replaced
        self._models: dict[str, set[str]] = {}

    def admits(self, old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
        """Whether ``new`` may replace ``old``, the entry of its pair in the leaf as
        just read: unless it would replace an entry naming other bytes while one of its
        artifacts is no longer the version it was made from. Decided again on each
        attempt (the last one stands)."""
        key = (str(new.get("model")), str(new.get("device")))
        pins = self.pins.get(key, ())
        replaced = None
        if old is not None and pins and not same_artifacts(old, new):
            replaced = next((p.url for p in pins if not p.held()), None)
        with self._lock:
            left = self._models.setdefault(key[0], set())
            if replaced is None:
                self._left.pop(key, None)
                left.discard(key[1])
            else:
                self._left[key] = replaced
                left.add(key[1])
        return replaced is None

    def left_out(self, model: str) -> set[str]:
        """The devices of ``model`` whose entry was left out (the set itself: filled as
        the leaves are updated)."""
        with self._lock:
            return self._models.setdefault(model, set())

    def superseded(self) -> list[dict[str, str]]:
        """``{"model", "device", "url"}`` of every pair left out, in order."""
        with self._lock:
            left = sorted(self._left.items())
        return [{"model": m, "device": d, "url": url} for (m, d), url in left]


def superseded_line(left: Mapping[str, str]) -> str:
    """How a run says a pair's entry was left out (``left``: an item of
    :meth:`EntryGuard.superseded`)."""
    return (
        f"{left['model']} on {left['device']}: not indexed: {left['url']} was replaced by "
        "another run after this run read it (that run indexes what it published)"
    )


def replacing(entry: dict[str, Any], guard: EntryGuard | None = None) -> Change:
    """The change that makes a pair's entry ``entry`` (whatever it was), unless
    ``guard`` does not admit it (then None: the entry is left as it is)."""

    def change(old: dict[str, Any] | None) -> dict[str, Any] | None:
        if guard is not None and not guard.admits(old, entry):
            return None
        return entry

    return change
