"""``prune_stale(cache_dir)`` (``ptestore cache prune --stale``): remove cache entries
whose source is gone or changed.

An entry's manifest records what it was made from (:mod:`.manifest`), so each kind of
entry is judged against what it recorded, without reading any artifact:

- a **copy** (``ensure(source)``) and an **in-place** entry: the source's identity now
  (:func:`~ptestore.device.keys.source_identity`: one ``stat`` locally, one metadata
  request for a URL, with the storage options given when the source is the portable
  one an index named: the manifest's ``named_by``), and the ``.ptd``'s, against the
  fingerprint's. A source that is gone, is no longer a regular file, or has another
  identity makes the entry stale. An in-place entry holds only its manifest: removing
  it never touches the rewritten file;
- an entry **fetched from a job index** (``ensure(index, model=...)``): the index is gone,
  or no live entry of it names the files the entry holds (the same URL, size, SHA-256 and
  trailer checksum of the ``.pte``, and the same ``.ptd``): the model or the device was
  dropped from the job and retired (:mod:`ptestore.fleet.retire`), or a newer run
  replaced the artifact.

A source that cannot be reached (a network error, refused credentials), or whose recorded
URL holds REDACTED (its credentials were not recorded: never re-opened), is *unknown*,
never stale: the entry is kept and the reason reported. So is a local source, ``.ptd``
or index that is missing while the nearest directory above it that exists is on another
file system than the one it was recorded on (the source's identity records its device;
an index's, ``index_device`` in the manifest): its file system is not mounted now, and
an empty mount point says nothing about the file. (A bind mount of a directory of the
same file system cannot be told from a removed file this way: such a source is gone.)
An entry another process holds (a running ``ensure`` of its key has its lock) is never
removed: it is reported busy.
Under the key's exclusive lock the manifest is read again, and an entry remade since it
was judged is judged again, so a run that refreshed it is never undone.
"""

from __future__ import annotations

import os
from typing import Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, ObjectNotFound, PteStoreError, StorageError
from ..storage.types import StorageURL, is_redacted
from .cache import remove_entry_locked, stopped
from .keys import as_recorded, file_fp, source_identity
from .layout import CacheLayout, load_entry, read_manifest
from .manifest import as_json, recorded_fingerprint

__all__ = ["StaleEntry", "StaleResult", "prune_stale", "why_stale"]


@dataclass(frozen=True)
class StaleEntry:
    """One entry :func:`prune_stale` judged stale (or could not judge)."""

    key: str
    #: What the entry was made from (its manifest's ``source``; an index's location for
    #: an entry fetched from one).
    source: str | None
    #: Why it is stale (or why it could not be judged).
    reason: str
    #: ``"removed"``, ``"would remove"`` (dry run), ``"busy"`` (another process holds
    #: it), ``"kept: unknown"`` (its source could not be checked), ``"kept: current"``
    #: (remade while it was judged) or ``"kept: already gone"``.
    action: str
    #: Removed: the bytes it freed on the file system (the blocks its files held);
    #: otherwise its size, as ``cache ls`` counts it.
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "source": self.source,
            "reason": self.reason,
            "action": self.action,
            "bytes": self.bytes,
        }


@dataclass
class StaleResult:
    """What :func:`prune_stale` found and did."""

    dry_run: bool
    entries: list[StaleEntry] = field(default_factory=list)
    #: Entries judged current.
    current: int = 0

    @property
    def removed(self) -> list[str]:
        return [e.key for e in self.entries if e.action == "removed"]

    @property
    def freed(self) -> int:
        return sum(e.bytes for e in self.entries if e.action == "removed")

    @property
    def busy(self) -> list[str]:
        return [e.key for e in self.entries if e.action == "busy"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "entries": [e.to_dict() for e in self.entries],
            "current": self.current,
            "removed": self.removed,
            "freed": self.freed,
            "busy": self.busy,
        }


class _Unknown(Exception):
    """The source could not be checked (not an answer about the entry)."""


def _not_mounted(role: str, where: str, device: Any) -> _Unknown | None:
    """For a local ``where`` found missing that was on file system ``device``: the
    :class:`_Unknown` of a path whose nearest existing directory is on another file
    system (the one it was on is not mounted now: an NFS share, a USB disk or an SD card
    not mounted yet leave their empty mount point), else None (gone)."""
    if not isinstance(device, int) or isinstance(device, bool):
        return None
    u = StorageURL.of(where)
    if not u.local:
        return None
    here = os.path.abspath(u.path)
    while True:
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up
        try:
            st = os.stat(here)
        except FileNotFoundError:
            continue
        except OSError as exc:  # cannot tell: not an answer either
            return _Unknown(f"its {role} {where} is missing and {here} cannot be checked: {exc}")
        if st.st_dev == device:
            return None
        return _Unknown(
            f"its {role} {where} is missing and its file system is not mounted (it was on "
            f"device {device}; the nearest directory there, {here}, is on device {st.st_dev})"
        )


def _not_reopened(role: str, where: str) -> _Unknown | None:
    """Why the recorded ``where`` is not opened to judge the entry: its credentials
    were not recorded (:func:`~ptestore.storage.types.is_redacted`), and a private
    store answers a request without them with a refusal or a 404, which says nothing
    of the object."""
    if not is_redacted(where):
        return None
    return _Unknown(
        f"its {role} {where} was recorded without its URL's credentials (REDACTED): it "
        "is not opened again to judge the entry (give the URL with its credentials to "
        "ensure, which checks it, or remove the entry)"
    )


def _identity_changed(
    role: str, where: str, recorded: Any, options: dict[str, Any] | None = None
) -> str | None:
    unknown = _not_reopened(role, where)
    if unknown is not None:
        raise unknown
    try:
        now = source_identity(where, _routed(where, options))
    except ObjectNotFound as exc:
        device = recorded.get("dev") if isinstance(recorded, dict) else None
        unmounted = _not_mounted(role, where, device)
        if unmounted is not None:
            raise unmounted from exc
        return f"its {role} {where} is gone"
    except ConfigurationError as exc:
        if not StorageURL.of(where).local:  # options or an extra missing: not an answer
            raise _Unknown(f"its {role} {where} could not be checked: {exc}") from exc
        return f"its {role} {where} is unusable: {exc}"  # no longer a regular file
    except PteStoreError as exc:
        raise _Unknown(f"its {role} {where} could not be checked: {exc}") from exc
    now = as_recorded(as_json(now), recorded)  # an older manifest: without ctime
    if now != recorded:
        changed = sorted(
            k
            for k in set(now) | set(recorded if isinstance(recorded, dict) else {})
            if not isinstance(recorded, dict) or now.get(k) != recorded.get(k)
        )
        return f"its {role} {where} changed ({', '.join(changed)})"
    return None


def _routed(where: str, options: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``options`` that apply to reading ``where`` (none to a local file)."""
    if not options or StorageURL.of(where).local:
        return None
    from ..storage.routing import options_for_loader

    return options_for_loader(where, options)


def _index_stale(manifest: dict[str, Any], options: dict[str, Any]) -> str | None:
    from ..fleet.index import find_entry

    index = str(manifest["index"])
    unknown = _not_reopened("index", index)
    if unknown is not None:
        raise unknown
    fp = manifest.get("fingerprint")
    if not isinstance(fp, dict):
        return f"its manifest records no fingerprint of the index entry ({index})"
    model, made_for = fp.get("model"), fp.get("made_for")
    try:
        # The entry it was fetched for: its model and the device it was made for (a
        # sharded index reads that entry's shard only).
        entry = (
            find_entry(index, model, made_for, **options)
            if isinstance(model, str) and isinstance(made_for, str)
            else None
        )
    except ObjectNotFound as exc:
        unmounted = _not_mounted("index", index, manifest.get("index_device"))
        if unmounted is not None:
            raise unmounted from exc
        return f"its index {index} is gone"
    except PteStoreError as exc:
        raise _Unknown(f"its index {index} could not be read: {exc}") from exc
    if (
        entry is not None
        and not entry.get("retired")
        and as_json(file_fp(entry.get("pte"))) == fp.get("pte")  # URLs as identities
        and as_json(file_fp(entry.get("ptd"))) == fp.get("ptd")
    ):
        return None
    pte = fp.get("pte")
    url = pte.get("url") if isinstance(pte, dict) else None
    return (
        f"its index {index} no longer names the artifact it holds "
        f"(model {fp.get('model')!r}, {url}): dropped, retired or replaced"
    )


def _why_stale(manifest: dict[str, Any], options: dict[str, Any]) -> str | None:
    """Why the entry with ``manifest`` is stale, or None; :class:`_Unknown` when its
    source cannot be checked."""
    if manifest.get("index") is not None:
        return _index_stale(manifest, options)
    fp = recorded_fingerprint(manifest)  # ctime_ns where it was recorded
    source = manifest.get("source")
    if not isinstance(fp, dict) or not isinstance(source, str):
        return "its manifest records no source identity"
    # The portable source an index named (ensure fell back to it) was read with the
    # index's options: so is it here. Any other source was read without.
    opts = options if manifest.get("named_by") is not None else None
    why = _identity_changed("source", source, fp.get("source"), opts)
    if why is None and manifest.get("ptd_source") is not None:
        why = _identity_changed(".ptd", str(manifest["ptd_source"]), fp.get("ptd"), opts)
    return why


def why_stale(
    manifest: dict[str, Any], storage_options: dict[str, Any] | None = None
) -> tuple[str | None, bool]:
    """``(reason, known)`` for the cache entry whose manifest is ``manifest``: why it is
    stale (None: current), or, with ``known`` False, why it could not be judged (its
    source or index unreachable: such an entry is kept)."""
    try:
        return _why_stale(manifest, dict(storage_options or {})), True
    except _Unknown as exc:
        return str(exc), False


def prune_stale(
    cache_dir: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> StaleResult:
    """Remove the entries of ``cache_dir`` whose source is gone or changed (see the
    module docstring); with ``dry_run`` only list them. ``storage_options`` reach the
    job indexes of entries fetched from one, and the portable sources (and ``.ptd``)
    an index named, specialized when no artifact fit (as ``ensure(storage_options=...)``
    gave them to those); one that applies to none of the remote ones is a
    :class:`ConfigurationError`, raised before any is read (none is refused when every
    one is local).

    Broken and incomplete entries are :func:`~ptestore.device.prune`'s (``ptestore cache
    prune`` without ``--stale`` removes them too).

    A file or lock file it cannot remove stops it with a
    :class:`~ptestore.errors.StorageError` naming that file, what it had removed and
    what the cache keeps (as ``prune`` and ``clear`` say it)."""
    if not isinstance(dry_run, bool):
        raise ConfigurationError(f"dry_run must be True or False, got {dry_run!r}")
    layout = CacheLayout(cache_dir)
    if not os.path.isdir(layout.root):
        raise ObjectNotFound(f"{layout.root}: no such cache directory")
    options = dict(storage_options or {})
    ready = [e for e in (load_entry(layout, k) for k in layout.entry_keys()) if e.state == "ready"]
    if options:
        _check_options(options, [url for e in ready for url in _reached(e.manifest)])
    out = StaleResult(dry_run)
    try:
        for entry in ready:
            key = entry.key
            manifest = entry.manifest
            source = manifest.get("index") or entry.source
            reason, known = why_stale(manifest, options)
            if reason is None:
                out.current += 1
            elif not known:
                out.entries.append(StaleEntry(key, source, reason, "kept: unknown", entry.bytes))
            elif dry_run:
                out.entries.append(StaleEntry(key, source, reason, "would remove", entry.bytes))
            else:
                _remove(layout, key, manifest, source, reason, entry.bytes, options, out)
    except StorageError as exc:  # a file or lock file it cannot remove: what it did, said
        raise stopped(layout, "prune --stale", len(out.removed), out.freed, exc) from exc
    return out


def _reached(manifest: dict[str, Any]) -> list[Any]:
    """The URLs of an entry that the storage options reach: the job index it was
    fetched from, or the portable source (and its ``.ptd``) an index named."""
    if manifest.get("index") is not None:
        return [manifest["index"]]
    if manifest.get("named_by") is not None:
        return [manifest.get("source"), manifest.get("ptd_source")]
    return []


def _check_options(options: dict[str, Any], indexes: list[Any]) -> None:
    """Refuse a storage option that applies to none of the URLs they reach (the job
    indexes the entries were fetched from, the portable sources an index named:
    :func:`_reached`; :meth:`~ptestore.storage.routing.StorageOptions.check`: "did you
    mean 'endpoint_url'?"), before any is read. Options are used for no other URL here,
    and are left unused when every one of those is local. A URL whose protocol cannot be
    read is left out: its entry is judged unknown, with the reason."""
    from ..storage.routing import StorageOptions
    from ..storage.schemes import loader_options

    readable: list[str] = []
    for index in dict.fromkeys(str(i) for i in indexes if i is not None):
        try:
            loader_options(index)
        except PteStoreError:
            continue
        readable.append(index)
    StorageOptions(options).check(readable, local_ok=True)


def _remove(
    layout: CacheLayout,
    key: str,
    judged: dict[str, Any],
    source: str | None,
    reason: str,
    size: int,
    options: dict[str, Any],
    out: StaleResult,
) -> None:
    """Remove entry ``key`` under its exclusive lock, taken without waiting: a running
    ``ensure`` holds it (busy). The manifest is read again under the lock: one that
    changed since it was judged (an ``ensure`` remade the entry) is judged again. What
    was done goes to ``out``; a removed entry before its lock file goes (a
    :class:`~ptestore.errors.StorageError` when that cannot: the entry is gone all the
    same, counted)."""
    lock = layout.lock(key, blocking=False)
    if not lock.acquire():
        out.entries.append(StaleEntry(key, source, reason, "busy", size))
        return
    removed = False
    try:
        try:
            now = read_manifest(layout.manifest(key))
        except PteStoreError:
            now = None
        if now is None:
            out.entries.append(StaleEntry(key, source, reason, "kept: already gone"))
            return
        if now != judged:
            again, known = why_stale(now, options)
            if again is None or not known:
                why = "remade while it was judged" if again is None else again
                kept = "kept: current" if known else "kept: unknown"
                out.entries.append(StaleEntry(key, source, why, kept))
                return
            reason = again
        freed = remove_entry_locked(layout, key)
        out.entries.append(StaleEntry(key, source, reason, "removed", freed))
        removed = True
    finally:
        if not removed:
            lock.release()
    lock.remove()  # the entry is gone: its lock file goes with it, as eviction does
