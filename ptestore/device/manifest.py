"""The manifest of a cache entry: one record (:class:`Manifest`), built in one place and
published atomically, last, after the files it names.

Every way an entry is made (a specialized copy, an in-place run, a download from a job
index) fills the same record; :meth:`Manifest.to_dict` is what ``manifest.json`` holds
and what :func:`~ptestore.device.entryfiles.read_manifest` gives back.

A local source's identity has a ``ctime_ns`` (:func:`~.keys.identity_of`); the manifest
records it beside the fingerprint (its ``ctime_ns`` field, by role), never inside
``fingerprint.source`` or ``fingerprint.ptd``: those stay what every version of
ptestore wrote (device, inode, size, ``mtime_ns``), since an older one compares them,
and the whole fingerprint, as they are (:func:`split_ctime`, :func:`recorded_fingerprint`).
"""

from __future__ import annotations

import errno
import json
import os
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ..errors import BackendError, StorageError
from ..storage.types import StorageURL, redacted_url
from .layout import MANIFEST_FORMAT, MANIFEST_VERSION, CacheLayout, file_stamp
from .private import make_private

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ..provenance.record import Provenance

__all__ = [
    "PTD_NAME",
    "PTE_NAME",
    "Manifest",
    "as_json",
    "disk_full_error",
    "file_records",
    "is_disk_full",
    "publish_manifest",
    "recorded_fingerprint",
    "split_ctime",
    "unpublish",
]

#: The names of an entry's files.
PTE_NAME = "model.pte"
PTD_NAME = "model.ptd"


def as_json(value: Any) -> Any:
    """``value`` as the manifest stores it (and as a fingerprint compares to it)."""
    return json.loads(json.dumps(value))


#: The roles of a fingerprint that hold a source's identity.
_ROLES = ("source", "ptd")


def split_ctime(fingerprint: Any) -> tuple[Any, dict[str, int]]:
    """``fingerprint`` (as stored: :func:`as_json`) as a manifest records it, and the
    ``ctime_ns`` of each local identity in it, by role (``{"source": N, "ptd": N}``):
    the identities without their ``ctime_ns``, as ptestore wrote them before it was
    taken (an older version compares ``fingerprint`` and ``fingerprint.source`` whole:
    one more key there made it remake every entry and ``cache prune --stale`` remove
    them)."""
    ctimes: dict[str, int] = {}
    if not isinstance(fingerprint, dict):
        return fingerprint, ctimes
    out = dict(fingerprint)
    for role in _ROLES:
        ident = fingerprint.get(role)
        if isinstance(ident, dict) and "ino" in ident and "ctime_ns" in ident:
            out[role] = {k: v for k, v in ident.items() if k != "ctime_ns"}
            ctimes[role] = ident["ctime_ns"]
    return out, ctimes


def recorded_fingerprint(manifest: Mapping[str, Any]) -> Any:
    """The fingerprint ``manifest`` records, each local identity with the ``ctime_ns``
    recorded for it: beside the fingerprint (the manifest's ``ctime_ns`` field), or in
    the identity itself (as ptestore wrote it for a while). An identity recorded with
    none has none (compared as before: :func:`~.keys.as_recorded`)."""
    fp = manifest.get("fingerprint")
    ctimes = manifest.get("ctime_ns")
    if not isinstance(fp, dict) or not isinstance(ctimes, dict):
        return fp
    out = dict(fp)
    for role in _ROLES:
        ident, ns = fp.get(role), ctimes.get(role)
        if not isinstance(ident, dict) or "ino" not in ident or "ctime_ns" in ident:
            continue  # remote, none, or recorded with its ctime_ns inside
        if isinstance(ns, int) and not isinstance(ns, bool):
            out[role] = {**ident, "ctime_ns": ns}
    return out


def file_records(directory: str, names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{"pte": {"name": ..., "size", "ino", "mtime_ns", "ctime_ns"}, ...}`` of the
    files ``names`` gives (role -> file name in ``directory``), one ``stat`` each, after
    removing group and others' write permission (the cache is this user's alone)."""
    out = {}
    for role, name in names.items():
        path = os.path.join(directory, name)
        make_private(path)
        out[role] = {"name": name, **file_stamp(path)}
    return out


@dataclass(frozen=True)
class Manifest:
    """What ``entries/<key>/manifest.json`` says about the entry."""

    key: str
    #: The source's location (a local real path, or a URL as
    #: :func:`~ptestore.storage.types.redacted_url` shows it: no password, no signature).
    source: str
    #: What the entry was made for, as stored (:func:`as_json`), its local identities
    #: without their ``ctime_ns`` (:func:`split_ctime`).
    fingerprint: Any
    #: role (``"pte"``, ``"ptd"``) -> ``{"name", "size", "ino", "mtime_ns"}``; empty in place.
    files: dict[str, dict[str, Any]]
    #: Whether a backend specialized anything (False: an unchanged copy).
    specialized: bool
    #: The artifact's provenance record (``Provenance.to_dict()``), or None.
    provenance: dict[str, Any] | None
    ptd_source: str | None = None
    #: True for an entry whose source itself was rewritten.
    in_place: bool = False
    #: The job index it was fetched from, and what was chosen (index entries only).
    index: str | None = None
    choice: dict[str, Any] | None = None
    #: The device (``st_dev``) of a local index's file system when the entry was made:
    #: an index found missing later on another one is on a file system not mounted now
    #: (``cache prune --stale`` keeps the entry), not gone.
    index_device: int | None = None
    #: An entry fetched from an index whose answer since names no artifact for the
    #: device: what it answered (:mod:`.superseded`); never a hit, never served offline.
    superseded: dict[str, Any] | None = None
    #: A copy of the portable source an index named (``ensure(index, ...)`` fell back
    #: to it): that index's location (``cache prune --stale``'s options reach the
    #: source, as they reached it when it was read).
    named_by: str | None = None
    #: role (``"source"``, ``"ptd"``) -> the ``ctime_ns`` of that local identity
    #: (:func:`split_ctime`); None when neither is local.
    ctime_ns: dict[str, int] | None = None

    @classmethod
    def of(
        cls,
        *,
        key: str,
        source: str,
        fingerprint: Any,
        files: dict[str, dict[str, Any]],
        specialized: bool,
        provenance: Provenance | None,
        ptd_source: str | None = None,
        in_place: bool = False,
        index: str | None = None,
        choice: Mapping[str, Any] | None = None,
        named_by: str | None = None,
    ) -> Manifest:
        """The one place a manifest is built: the fingerprint and the choice as stored,
        the provenance as its record, the sources' and the index's URLs as shown, and
        so every URL of the choice (a manifest is readable by others: mode 0644); the
        fingerprint holds none (its URLs are identities: :func:`~.indexed.file_fp`); its
        local identities' ``ctime_ns`` beside it (:func:`split_ctime`)."""
        recorded, ctimes = split_ctime(as_json(fingerprint))
        return cls(
            key=key,
            source=redacted_url(source),
            fingerprint=recorded,
            files=files,
            specialized=bool(specialized),
            provenance=None if provenance is None else provenance.to_dict(),
            ptd_source=None if ptd_source is None else redacted_url(ptd_source),
            in_place=in_place,
            index=None if index is None else redacted_url(index),
            choice=None if choice is None else shown_urls(as_json(dict(choice))),
            index_device=None if index is None else _device_of(index),
            named_by=None if named_by is None else redacted_url(named_by),
            ctime_ns=ctimes or None,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "key": self.key,
            "source": self.source,
            "ptd_source": self.ptd_source,
            "fingerprint": self.fingerprint,
            "files": self.files,
            "specialized": self.specialized,
            "in_place": self.in_place,
            "provenance": self.provenance,
        }
        if self.index is not None:
            out["index"] = self.index
        if self.choice is not None:
            out["choice"] = self.choice
        if self.index_device is not None:
            out["index_device"] = self.index_device
        if self.superseded is not None:
            out["superseded"] = self.superseded
        if self.named_by is not None:
            out["named_by"] = self.named_by
        if self.ctime_ns is not None:
            out["ctime_ns"] = self.ctime_ns
        return out

    def publish(
        self, layout: CacheLayout, src: str, *, replaced: bool = False, freed: bool = False
    ) -> None:
        """Publish as entry ``self.key``'s manifest, atomically and durably
        (:func:`~ptestore.storage.atomic.put_bytes`); a full file system raises the
        cache's disk-full error naming ``src`` (``replaced``: the files of an earlier
        entry of the key were replaced, and the caller removes that entry; ``freed``:
        the earlier entry was removed before this one was made)."""
        publish_manifest(layout, self.key, self.to_dict(), src, replaced=replaced, freed=freed)


def publish_manifest(
    layout: CacheLayout,
    key: str,
    manifest: dict[str, Any],
    src: str,
    *,
    replaced: bool = False,
    freed: bool = False,
) -> None:
    """Publish ``manifest`` (a manifest as :meth:`Manifest.to_dict` makes it, or as
    :func:`~ptestore.device.entryfiles.read_manifest` read it, changed) as entry
    ``key``'s, as :meth:`Manifest.publish` does."""
    from ..storage.atomic import put_bytes

    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    try:
        put_bytes(layout.manifest(key), data, permissions=0o644)
    except OSError as exc:  # StorageError is one
        if is_disk_full(exc):
            raise disk_full_error(
                layout.root,
                src,
                len(data),
                exc,
                replaced=replaced,
                freed=freed,
                stage="manifest",
            ) from exc
        raise


def shown_urls(value: Any) -> Any:
    """``value`` (JSON as stored) with every string that holds a URL as
    :func:`~ptestore.storage.types.redacted_url` shows it: an index's choice names the
    files by the URLs it read them from (resolved against the index's URL, with its
    credentials)."""
    if isinstance(value, str):
        return redacted_url(value)  # (a string without a URL: as it is)
    if isinstance(value, list):
        return [shown_urls(v) for v in value]
    if isinstance(value, dict):
        return {k: shown_urls(v) for k, v in value.items()}
    return value


def _device_of(index: str) -> int | None:
    """``st_dev`` of a local index (None for a URL, or one that cannot be stat'ed)."""
    u = StorageURL.of(index)
    if not u.local:
        return None
    try:
        return os.stat(u.location).st_dev
    except OSError:
        return None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is ENOSPC or EDQUOT, raised by
    ptestore's own writes (the cache's, the spool's, the journal's). The walk stops at a
    :class:`~ptestore.errors.BackendError`: what a backend's own code raised (about its
    own scratch files, maybe on another file system) is the backend's failure, never
    the cache's full disk (a spool write that fails inside the backend's call is a
    ``StorageError`` the run passes on unwrapped, still found)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, BackendError):
            return False
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def disk_full_error(
    where: str,
    src: str,
    need: int,
    exc: BaseException,
    *,
    replaced: bool = False,
    freed: bool = False,
    stage: str = "copy",
) -> StorageError:
    """The error for a cache whose file system is full, with what to do about it
    (``replaced``: an earlier entry's files were replaced, and that entry was removed;
    ``freed``: the earlier entry, stale, was removed before this one was made, so the
    room asked for is the new copy's alone).
    ``stage`` says what failed, so that the bytes it names are true together: ``"copy"``,
    the run (``need``: about the source's size; the free space is measured once the run
    removed its partial copy, so it may exceed ``need``: the copy and the spooled
    replacements filled the disk); ``"manifest"``, the entry's manifest (``need`` its
    size); ``"entry"``, the entry's directory (no size)."""
    from .._io import free_bytes, free_inodes

    left = free_bytes(where)
    # (the copy's free space is measured once its partial copy is removed)
    copy = stage == "copy"
    verb, when = ("are", "now") if copy else ("were", "when it failed")
    if left is None:
        free = "free space unknown"
    elif free_inodes(where) == 0:  # ENOSPC with bytes free: out of inodes
        free = f"no inode {'is' if copy else 'was'} free {when}, {left} bytes {verb}"
    else:
        free = f"{left} bytes {verb} free {when}"
    if stage == "copy":
        what = (
            f"the specialized copy of {src} (it needs about {need} bytes, the source's "
            f"size, and room for the replaced bytes while they are spooled; {free}, the "
            "partial copy removed)"
        )
    else:
        what = (
            f"the manifest of the entry of {src} ({need} bytes; {free})"
            if stage == "manifest"
            else f"the entry directory of {src} ({free})"
        )
    return StorageError(
        f"{where}: no space left on the file system for {what}; "
        + (
            "the source is unchanged; the entry's earlier version, whose files this run "
            "had replaced, was removed (made again by the next call). "
            if replaced
            else "the source is unchanged; the entry's earlier version (stale: never "
            "served again) was removed before it was made again, its room freed (the next "
            "call makes it). "
            if freed
            else "the cache and the source are unchanged. "
        )
        + "Free space (`ptestore cache prune --max-bytes N`) or specialize in place "
        f"(--in-place): {exc}",
        errno=_full_errno(exc),
    )


def _full_errno(exc: BaseException) -> int:
    """ENOSPC or EDQUOT, as the cause of a full disk said it (ENOSPC when none did): the
    ``errno`` of :func:`disk_full_error`'s error, as :class:`StorageError` promises."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return cur.errno
        cur = cur.__cause__ or cur.__context__
    return errno.ENOSPC


def unpublish(layout: CacheLayout, key: str, names: Iterable[str], had_entry: bool) -> None:
    """The files a run published in entry ``key``, removed when its manifest could not
    be (a full disk): the cache keeps no half entry. An earlier entry's files were
    replaced by them, so its manifest (naming those) goes too (``had_entry``), and its
    directory when nothing else is left in it: the entry is made again by the next call,
    never listed as an empty incomplete one meanwhile."""
    import contextlib

    for name in (*names, *(("manifest.json",) if had_entry else ())):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(layout.entry_dir(key), name))
    if had_entry:  # nothing of the earlier entry is left: its directory, once empty
        with contextlib.suppress(OSError):
            os.rmdir(layout.entry_dir(key))
