"""What :func:`~ptestore.ensure` returns (:class:`Artifact`), and how an entry is found:
a hit read from its manifest under the key's shared lock, else made under its exclusive
lock (:func:`hit_or_make`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ..errors import PermissionDenied
from .entryfiles import check_entry_dir
from .keys import as_recorded
from .layout import CacheLayout, files_intact, read_manifest, touch
from .manifest import Manifest, as_json, recorded_fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..coordinator.report import Event
    from ..provenance.record import Provenance

__all__ = [
    "Artifact",
    "HeldProgress",
    "artifact_of",
    "hit_or_make",
    "lookup",
    "said_unchanged",
    "warn_unchanged",
]


@dataclass(frozen=True)
class Artifact:
    """What :func:`ensure` returns: where the specialized model is and how it was made."""

    #: Path of the specialized ``.pte``.
    pte: str
    #: Path of its ``.ptd`` (None without one).
    ptd: str | None
    #: The provenance record of the ``.pte`` (sources, backends, device); None when it
    #: was made with ``provenance=False``.
    provenance: Provenance | None
    #: True when this call made it, False when it came from the cache.
    created: bool
    #: The cache key (the entry's directory name under ``CACHE_DIR/entries``).
    key: str
    #: Whether a backend specialized anything (False: an unchanged copy).
    specialized: bool = True
    #: True when the source itself was rewritten (``in_place=True``).
    in_place: bool = False
    #: For a source that is a job index (``model=``): what :func:`ptestore.select` chose
    #: and why (``Choice.to_dict()``: ``kind`` ``"artifact"`` or ``"source"``, ``reason``).
    choice: dict[str, Any] | None = None
    #: With ``xnnpack_cache=True``: the path of the verified XNNPACK packed-weight file
    #: beside the entry (None when the runtime refused one: see ``xnnpack_refused``).
    xnnpack_cache: str | None = None
    #: Why the runtime could not have a packed-weight file (the artifact is served).
    xnnpack_refused: str | None = None
    #: Where ``xnnpack_cache`` came from: ``"found"`` beside the entry, ``"index"``
    #: delivered from the fleet's index, ``"made"`` here by this call.
    xnnpack_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "pte": self.pte,
            "ptd": self.ptd,
            "created": self.created,
            "key": self.key,
            "specialized": self.specialized,
            "in_place": self.in_place,
            "provenance": None if self.provenance is None else self.provenance.to_dict(),
        }
        if self.choice is not None:
            out["choice"] = self.choice
        if self.xnnpack_cache is not None or self.xnnpack_refused is not None:
            out["xnnpack_cache"] = self.xnnpack_cache
            if self.xnnpack_from is not None:
                out["xnnpack_from"] = self.xnnpack_from
            if self.xnnpack_refused is not None:
                out["xnnpack_refused"] = self.xnnpack_refused
        return out


def artifact_of(
    layout: CacheLayout, manifest: Manifest | dict[str, Any], created: bool
) -> Artifact:
    """The artifact a manifest describes (a copy in the entry, or a source rewritten in
    place)."""
    from ..provenance.record import Provenance

    m = manifest.to_dict() if isinstance(manifest, Manifest) else manifest
    key = m["key"]
    record = m.get("provenance")
    if m.get("in_place"):
        return Artifact(
            pte=m["source"],
            ptd=None,
            provenance=None if record is None else Provenance.from_dict(record, m["source"]),
            created=created,
            key=key,
            specialized=bool(m.get("specialized", True)),
            in_place=True,
        )
    directory = layout.entry_dir(key)
    files = m["files"]
    choice = m.get("choice")
    return Artifact(
        pte=os.path.join(directory, files["pte"]["name"]),
        ptd=os.path.join(directory, files["ptd"]["name"]) if "ptd" in files else None,
        provenance=None if record is None else Provenance.from_dict(record, layout.manifest(key)),
        created=created,
        key=key,
        specialized=bool(m.get("specialized", True)),
        choice=choice if isinstance(choice, dict) else None,
    )


def lookup(
    layout: CacheLayout, key: str, fingerprint: dict[str, Any], *, in_place: bool = False
) -> Artifact | None:
    """The entry ``key`` when its manifest records ``fingerprint`` (and, for a copy,
    its files are there as recorded); its last use is then set to now. None: a miss."""
    path = layout.manifest(key)
    check_entry_dir(layout.entry_dir(key))  # a real directory, this user's alone
    try:
        manifest = read_manifest(path, private=True)
    except PermissionDenied:  # another user's, or writable by others: refused
        raise
    except Exception:  # unreadable or not a manifest: a miss, made again under the lock
        return None
    if manifest is None:
        return None
    if manifest.get("superseded") is not None:  # the index names no artifact of it now
        return None  # (.superseded): fetched again when it does
    recorded = recorded_fingerprint(manifest)  # ctime_ns where it was recorded
    if recorded != as_recorded(as_json(fingerprint), recorded):
        return None
    if bool(manifest.get("in_place")) != in_place:
        return None
    if not in_place and not files_intact(layout.entry_dir(key), manifest):
        return None
    try:
        found = artifact_of(layout, {**manifest, "key": key}, False)
    except Exception:  # a damaged field (its provenance record): a miss, made again
        return None
    touch(path)
    return found


def hit_or_make(
    layout: CacheLayout,
    key: str,
    max_bytes: int | None,
    lookup: Callable[[], Artifact | None],
    make: Callable[[], Artifact],
    before_make: Callable[[], None] | None = None,
) -> Artifact:
    """The entry ``key``: ``lookup()`` under the key's shared lock (a hit), else under its
    exclusive lock ``lookup()`` again (another process may have made it) and ``make()``;
    a made entry then evicts others down to ``max_bytes``. A ``make()`` that fails
    removes the entry directory it created, when nothing is left in it (what is, a
    download to resume, stays; a directory there before it is never removed)."""
    with layout.lock(key, shared=True):
        hit = lookup()
    if hit is not None:
        return hit
    with layout.lock(key):
        if before_make is not None:
            before_make()
        hit = lookup()
        if hit is None:
            created = not os.path.lexists(layout.entry_dir(key))
            try:
                hit = make()
            except BaseException:
                if created:  # else not this make's to remove: an "incomplete" entry
                    layout.remove_empty_entry_dir(key)
                raise
    if max_bytes is not None:
        from .cache import evict

        evict(layout.root, max_bytes, keep=key)
    return hit


class HeldProgress:
    """The caller's ``progress`` callback as a make hands it to the run. An exception
    it raises at an event that comes once the change is made (``after``: ``publish``; in
    place ``write`` too, emitted once the file is rewritten) is held, so that the entry
    is recorded first (the cache keeps no half entry, and a rewritten file is never left
    unrecorded), and raised by :meth:`raise_held` once it is; raised at an earlier event
    it stops the run as it is, nothing published."""

    def __init__(self, progress: Callable[[Event], None], after: frozenset[str]) -> None:
        self.progress = progress
        self.after = after
        self.held: Exception | None = None

    def __call__(self, event: Event) -> None:
        try:
            self.progress(event)
        except Exception as exc:
            if event.kind not in self.after:
                raise
            if self.held is None:
                self.held = exc

    def raise_held(self) -> None:
        """Raise the exception held (once the entry is recorded), if any."""
        if self.held is not None:
            held, self.held = self.held, None
            raise held


def warn_unchanged(report: Any, key: str) -> None:
    """A run of ``ensure`` that specialized nothing (``strict=False``: the model is
    served unchanged, as a device app wants one) says so and why, a warning (on stderr
    in the CLI): never silent (docs/concepts.md, "No silent no-op"). Said once the
    entry is kept: never for one refused (``accept``) or not published."""
    from ..coordinator.report import served_unchanged_message

    said = served_unchanged_message(report, key)
    if said is not None:
        _warn(said)


def said_unchanged(src: str, key: str) -> None:
    """The warning of a hit on an entry whose run specialized nothing (that run's
    warning said why): served unchanged, never silently (docs/concepts.md)."""
    _warn(
        f"{src}: served unchanged from the cache (entry {key}, specialized: false): nothing "
        "was specialized when it was made (its warning said why)"
    )


def _warn(message: str) -> None:
    """A warning of ``ensure`` on the ``ptestore.device`` logger, as a library caller
    gets any (in the CLI a line ``ptestore ensure: warning: ...``: :mod:`ptestore._log`)."""
    from .._log import get_logger

    get_logger("ptestore.device").warning("%s", message)
