"""Holds: how a fleet run keeps ``gc`` from removing an old object it relies on.

gc (:mod:`.orphans`) removes an object no live index entry names once it is older than
the grace. A run names its objects only when it publishes its index, at its end, and
an object it *reuses* rather than writes can be old and unreferenced until then: a
retired pair the job names again, found current and skipped; a shared ``.ptd`` found
stored at its content address; a packed-weight file found current. Its age says when it
was written, not when a run last relied on it.

So before a run relies on such an object it writes the object's *hold*, a small file
beside it (``<object>.ptestore-hold``: a JSON record naming the object, the time and a
fresh token, so two holds never have the same bytes; a shortened name for an object
whose name is too long for that, :func:`hold_url`), then looks at the object again
(:func:`hold`): one gone meanwhile (gc removed it before the hold was there) is made
again instead of relied on. gc counts an object held within the grace as young, and
looks at its hold again just before it removes it. A hold older than the grace holds
nothing, and gc removes it like an orphan. Keep the grace longer than the longest run:
a hold is written once, when the run starts relying on the object. Only the kinds of
object gc may remove (``.pte``, ``.ptd``, packed-weight files and records) are held:
a hold beside anything else would hold nothing and never be removed.

The object itself is never touched: not its bytes, not its time, not its metadata
(what pins a version elsewhere, the local ``mtime``/``ctime`` and inode, the ETag,
S3's stored checksum and part layout, stays as it was; :mod:`.binding`, ``fetch``'s
resume and the device cache rely on them). On S3 a hold is one ``PutObject`` and the
look a ``HEAD``; locally a small file renamed into place and an ``lstat``.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as _dt
import hashlib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..errors import ObjectNotFound, PteStoreError, StorageError
from ..storage.types import StorageURL

__all__ = [
    "HOLD_SUFFIX",
    "HOLD_THREADS",
    "NAME_MAX",
    "S3_KEY_MAX",
    "hold",
    "hold_each",
    "hold_url",
    "held_kind",
    "is_hold",
    "name_size",
]

#: What a hold's name adds to its object's.
HOLD_SUFFIX = ".ptestore-hold"

#: The longest name of a local file a hold's name is kept under, in bytes (NAME_MAX:
#: Linux's and macOS's). A fixed number, not the file system's ``pathconf``: the run
#: that writes a hold and gc that looks for it must name it alike.
NAME_MAX = 255

#: The longest S3 key, in bytes (UTF-8): a hold's key is kept under it.
S3_KEY_MAX = 1024

#: Hex digits of the SHA-256 of an object's name a shortened hold name carries.
_DIGEST_HEX = 32

#: Holds written (and objects looked at) at once.
HOLD_THREADS = 16

#: An object as :func:`~ptestore.coordinator.targets.target_identity` names it.
Identity = tuple[str, str]

#: The names of the objects gc may remove, whose holds it honours (:mod:`.orphans`).
_HELD_KINDS = (".pte", ".ptd", ".xpwc", ".xpwc.json")


def hold_url(url: str) -> str:
    """Where the hold of the object at ``url`` is: beside it, its name +
    :data:`HOLD_SUFFIX`; when that is too long for its store (a local name over
    :data:`NAME_MAX` bytes, an S3 key over :data:`S3_KEY_MAX`), a shortened name:
    ``<head>~<digest><kind>.ptestore-hold``, the head of the object's name (cut to fit),
    the first 32 hex digits of the SHA-256 of its whole name (UTF-8) and its kind
    (``.pte``, ``.ptd``, ...), which :func:`is_hold` knows as a hold. Only the name is
    digested, so the run (the job's spelling of the URL) and gc (its listing's) find the
    same hold. An S3 key too long even for the shortest such name is returned as
    :data:`HOLD_SUFFIX` makes it, refused when a hold is written there
    (:func:`_check_length`)."""
    plain = url + HOLD_SUFFIX
    room = _room(url)
    if room is None or room >= 0:
        return plain
    directory, sep, name = url.rpartition("/")
    kind = max((k for k in _HELD_KINDS if name.endswith(k)), key=len, default="")
    tail = f"~{_digest(name)}{kind}{HOLD_SUFFIX}"
    # the head's room: what the plain hold name takes, less what it is over by
    budget = _size(name + HOLD_SUFFIX) + room - _size(tail)
    if budget < 0:
        return plain
    from .._text import head_bytes

    return f"{directory}{sep}{head_bytes(name[: len(name) - len(kind)], budget)}{tail}"


def is_hold(name: str) -> bool:
    """Whether the file name (or URL) ``name`` is a hold of an object gc may remove (its
    name + :data:`HOLD_SUFFIX`, or the shortened name :func:`hold_url` gives a long
    one: it keeps the object's kind)."""
    return name.endswith(HOLD_SUFFIX) and name[: -len(HOLD_SUFFIX)].endswith(_HELD_KINDS)


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:_DIGEST_HEX]


def _size(text: str) -> int:
    """The bytes ``text`` takes in a file name (as ``os.fsencode`` gives it) or a key."""
    return len(text.encode("utf-8", "surrogateescape"))


def name_size(url: str) -> tuple[int, int] | None:
    """``(bytes, limit)`` of the name ``url`` gives its store: a local file's name
    against :data:`NAME_MAX`, an S3 key against :data:`S3_KEY_MAX`; None for a store
    without such a limit."""
    u = StorageURL.of(url)
    if u.local:
        return _size(os.path.basename(u.path)), NAME_MAX
    if u.protocol == "s3":
        return _size(u.path.partition("/")[2]), S3_KEY_MAX
    return None


def _room(url: str) -> int | None:
    """How many bytes the plain hold name of the object at ``url`` has to spare under
    its store's limit (negative: over it by that much); None for a store without one."""
    sized = name_size(url + HOLD_SUFFIX)
    return None if sized is None else sized[1] - sized[0]


def _check_length(target: str, url: str) -> None:
    """Refuse (:class:`~ptestore.errors.StorageError`) writing the hold ``target`` of the
    object at ``url`` when its key is over the store's limit even shortened (an S3 key
    whose directory leaves no room; a local name always fits once shortened)."""
    room = _room(url) if target == url + HOLD_SUFFIX else None
    if room is None or room >= 0:
        return
    key = StorageURL.of(target).path.partition("/")[2]
    raise StorageError(
        f"{target}: the hold's key would be {_size(key)} bytes, over S3's limit "
        f"of {S3_KEY_MAX} bytes per key, and its directory leaves no room for a shortened "
        "name: a shorter destination prefix makes it fit"
    )


def hold(
    urls: Sequence[str], options: Mapping[str, Any], named: Collection[Identity] | None = None
) -> list[str]:
    """Write the hold of each object in ``urls`` (storage ``options`` as a job's), then
    look at each object again; returns those that are gone (removed before their hold
    was written: not to be relied on). A hold that cannot be written raises (a
    :class:`~ptestore.errors.StorageError` naming it): nothing is relied on unheld.
    Only objects gc may remove are held, and none that ``named`` (identities the live
    index entry of the pair relying on them names) holds: gc keeps those anyway."""
    gone, failed = hold_each(urls, options, named)
    for exc in failed.values():
        raise exc
    return gone


def hold_each(
    urls: Sequence[str], options: Mapping[str, Any], named: Collection[Identity] | None = None
) -> tuple[list[str], dict[str, PteStoreError]]:
    """:func:`hold`, each object on its own: ``(those gone, {url: why its hold cannot be
    written})``; an object whose hold failed is not looked at again."""
    todo = [u for u in dict.fromkeys(urls) if held_kind(u)]
    if named:
        from ..coordinator.targets import target_identity

        todo = [u for u in todo if target_identity(u) not in named]
    failed: dict[str, PteStoreError] = {}

    def write(url: str) -> None:
        try:
            _write(url, options)
        except PteStoreError as exc:
            failed[url] = exc

    if len(todo) < 2:
        for url in todo:
            write(url)
        return [u for u in todo if u not in failed and not _exists(u, options)], failed
    with cf.ThreadPoolExecutor(max_workers=min(HOLD_THREADS, len(todo))) as pool:
        list(pool.map(write, todo))
        written = [u for u in todo if u not in failed]
        there = list(pool.map(lambda u: _exists(u, options), written))
    failed = {u: failed[u] for u in todo if u in failed}  # in the order given
    return [u for u, ok in zip(written, there, strict=True) if not ok], failed


def held_kind(url: str) -> bool:
    """Whether the object at ``url`` is of a kind gc may remove (and so is held)."""
    name = url.rstrip("/").rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]
    return name.endswith(_HELD_KINDS) and not name.startswith(".")


def _write(url: str, options: Mapping[str, Any]) -> None:
    from ..storage.atomic import put_bytes
    from ..storage.routing import options_for_writer

    record = {
        "format": "ptestore.hold",
        "object": url,
        "at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "token": os.urandom(8).hex(),  # every hold's bytes differ: its ETag changes too
    }
    target = hold_url(url)
    _check_length(target, url)
    local = StorageURL.of(target).local
    put_bytes(
        target,
        json.dumps(record, sort_keys=True).encode(),
        durable=False,  # a hold lost in a crash held nothing: its run died too
        storage_options=None if local else options_for_writer(target, options),
    )


def _exists(url: str, options: Mapping[str, Any]) -> bool:
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader

    try:
        loader = open_loader(url, **options_for_loader(url, options, "dst"))
    except ObjectNotFound:
        return False
    loader.close()
    return True
