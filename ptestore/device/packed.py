"""``ensure(..., xnnpack_cache=True)``: XNNPACK's packed-weight file beside an entry.

The file is :func:`ptestore.xnnpack.make_cache`'s, made in the entry's own directory,
once, under the entry's exclusive lock (and the maker's own ``flock``); a hit finds it
under the shared lock with :func:`ptestore.xnnpack.find_cache` (``full=False``: a few
``stat`` calls and one small read, the SHA-256 only for a file that is not the inode
published with its record). Missing, corrupt or made for another artifact, runtime or
CPU: it is made again. Refused by the runtime: the artifact is still served, the reason
is logged (``ptestore.device``), returned (``Artifact.xnnpack_refused``) and remembered
beside it (the maker's ``.refused.json``: not tried again for the same identity unless
``xnnpack_retry``), unless it may pass (a run of the runtime longer than
``xnnpack_timeout``, 3600 s by default, a kill from outside: tried again next time).

The artifact's digests, which bind the file to it, are hashed once and kept in
``xnnpack.json`` with the stamps (size, inode, mtime, ctime) of the files they were
taken of; they are hashed again only when a stamp differs, and the file's own record
remembers them too (:mod:`ptestore.xnnpack.digests`: an app's quick check before its
load then hashes nothing). Everything sits in the entry's directory, so it counts in
``max_bytes`` and goes with the entry when LRU evicts it.
``ptestore.xnnpack`` is imported only here, only when asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING, Any

from .._dataclass import replace
from ..errors import ConfigurationError, StorageError
from .artifact import Artifact
from .entryfiles import MAX_MANIFEST_BYTES, read_regular
from .layout import CacheLayout, file_stamp, packed_weights_file

if TYPE_CHECKING:
    from ..xnnpack import CacheFile

__all__ = ["DIGESTS_NAME", "check_packed_args", "with_packed_weights"]

#: The entry's record of its files' digests (for the packed file's identity).
DIGESTS_NAME = "xnnpack.json"


def _digests(directory: str, artifact: Artifact, compute: bool) -> tuple[str, str | None] | None:
    """The SHA-256 of the entry's ``.pte`` and ``.ptd``: from ``xnnpack.json`` while its
    stamps still match, else (``compute``) hashed and recorded, else None."""
    files = (
        {"pte": artifact.pte}
        if artifact.ptd is None
        else {"pte": artifact.pte, "ptd": artifact.ptd}
    )
    try:
        stamps = {role: file_stamp(path) for role, path in files.items()}
    except FileNotFoundError:  # the entry went (evicted): none here
        return None
    record_path = os.path.join(directory, DIGESTS_NAME)
    try:  # not blocking on a FIFO, not through a link, not too deep to parse
        record = json.loads(read_regular(record_path, MAX_MANIFEST_BYTES, "digest record"))
        if isinstance(record, dict) and record.get("stamps") == stamps:
            digests = record["sha256"]
            return digests["pte"], digests.get("ptd")
    except (OSError, StorageError, ValueError, RecursionError, KeyError, TypeError):
        pass
    if not compute:
        return None
    from ..storage.atomic import put_bytes
    from ..xnnpack.identity import file_sha256

    sha = {role: file_sha256(path) for role, path in files.items()}
    data = json.dumps({"stamps": stamps, "sha256": sha}, indent=1, sort_keys=True).encode()
    put_bytes(record_path, data, permissions=0o644)
    return sha["pte"], sha.get("ptd")


def _share_digests(artifact: Artifact, found: CacheFile, digests: tuple[str, str | None]) -> None:
    """The entry's digests (``xnnpack.json``, just checked or hashed under the entry's
    lock) remembered in the record of the file made or delivered for it
    (:mod:`ptestore.xnnpack.digests`): an app that loads the entry with it and gives no
    digest (``ptestore.xnnpack.load(pte, cache=path, full=False)``) hashes nothing."""
    from pathlib import Path

    from ..xnnpack.digests import remember_quietly, vouched

    learned: dict[str, Any] = {}
    for path, digest in ((artifact.pte, digests[0]), (artifact.ptd, digests[1])):
        if path is not None and digest is not None:
            with contextlib.suppress(OSError):
                learned.update(vouched(path, digest))
    remember_quietly(Path(found.record_path), learned)


def _found(directory: str, artifact: Artifact) -> CacheFile | None:
    from ..xnnpack import find_cache

    digests = _digests(directory, artifact, compute=False)
    if digests is None:
        return None
    return find_cache(
        artifact.pte,
        ptd=artifact.ptd,
        directory=directory,
        pte_sha256=digests[0],
        ptd_sha256=digests[1],
        full=False,
    )


def _stale(directory: str, keep: str) -> list[str]:
    """The entry's packed-weight files (with their records, locks and refusals) that are
    not those of the file ``keep``: an earlier artifact's, kept as the bases of the
    delivery of this one's (:func:`.indexed.packed_from_index`); and what a delivery
    that failed left to resume from."""
    stem = os.path.basename(keep)[: -len(".xpwc")] + "."  # "xnnpack-<id>."
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [
        n
        for n in names
        if (packed_weights_file(n) and n != DIGESTS_NAME and not n.startswith(stem))
        or n.startswith("xnnpack-download-")  # a delivery's leftovers, kept to resume it
    ]


def _remove(directory: str, names: list[str]) -> None:
    """``names`` removed; a packed-weight file with its record under the file's own
    ``flock`` (record first, then the file, then the lock while held, as
    :func:`ptestore.xnnpack.users.release` does): an app's check remembering digests in
    that record (:func:`ptestore.xnnpack.digests.remember_quietly`) then either finishes
    first or finds it gone, and never writes a removed record back."""
    packed = [n for n in names if n.endswith(".xpwc")]
    for name in packed:
        _remove_packed(directory, name)
    done = {f"{n}{suffix}" for n in packed for suffix in ("", ".json", ".lock")}
    for name in names:
        if name not in done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _remove_packed(directory: str, name: str) -> None:
    from pathlib import Path

    from ..storage.flock import locked

    path = Path(directory, name)
    lock = path.with_name(name + ".lock")
    with locked(lock):
        for p in (path.with_name(name + ".json"), path, lock):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def _refused(
    directory: str, artifact: Artifact, digests: tuple[str, str | None], why: str
) -> Artifact:
    """``artifact`` served without a packed-weight file (``why``); the entry's files of
    earlier artifacts go (this one's refusal record stays)."""
    from ..errors import PteStoreError
    from ..xnnpack.native import executorch_build
    from ..xnnpack.record import identity_of

    try:
        build = executorch_build()
    except PteStoreError:
        build = None
    if build is not None:
        name = identity_of(artifact.pte, artifact.ptd, digests[0], digests[1], build).name
        _remove(directory, _stale(directory, os.path.join(directory, name + ".xpwc")))
    return replace(artifact, xnnpack_refused=why)


def check_packed_args(
    source: str | os.PathLike[str], in_place: bool, cache: object, retry: object, timeout: object
) -> None:
    """``ensure``'s ``xnnpack_*`` arguments, checked before anything is done."""
    for name, value in (("xnnpack_cache", cache), ("xnnpack_retry", retry)):
        if not isinstance(value, bool):
            raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    if timeout is not None and (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not 0 < timeout < float("inf")
    ):
        raise ConfigurationError(
            f"xnnpack_timeout must be a number of seconds > 0 or None, got {timeout!r}"
        )
    given = [n for n, v in (("xnnpack_retry=True", retry), ("xnnpack_timeout", timeout)) if v]
    if given and not cache:
        raise ConfigurationError(
            f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to the "
            "XNNPACK packed-weight file xnnpack_cache=True makes: add xnnpack_cache=True "
            "(CLI: --xnnpack-cache)"
        )
    if cache and in_place:
        raise ConfigurationError(
            f"{os.fspath(source)}: xnnpack_cache=True applies to a copy in the cache, not to "
            "in_place=True (CLI: --xnnpack-cache without --in-place)"
        )


def with_packed_weights(
    layout: CacheLayout,
    artifact: Artifact,
    storage_options: dict[str, Any] | None = None,
    retry: bool = False,
    timeout: float | None = None,
) -> Artifact:
    """``artifact`` with its packed-weight file (``xnnpack_cache``), found, delivered from
    the fleet's index it was fetched from (``storage_options`` for its store: see
    :func:`.indexed.packed_from_index`) or made now; or, refused by the runtime, with the
    reason (``xnnpack_refused``). ``xnnpack_from`` says which. ``retry``: made here again
    although refused before (here or by the fleet's runtime); ``timeout``: seconds for
    each run of the runtime (None: :data:`ptestore.xnnpack.refusal.DEFAULT_TIMEOUT`)."""
    from ..errors import PackedWeightsRefused
    from ..xnnpack.refusal import DEFAULT_TIMEOUT

    directory = layout.entry_dir(artifact.key)
    with layout.lock(artifact.key, shared=True):
        found = _found(directory, artifact)
        stale = [] if found is None else _stale(directory, str(found.path))
    if stale and found is not None:  # a run that died before removing them
        with layout.lock(artifact.key):
            _remove(directory, _stale(directory, str(found.path)))
    source = "found"
    moved: dict[str, int] = {}  # what a delivery from the index moved, by origin
    if found is None:
        from ..xnnpack import make_cache

        with layout.lock(artifact.key):
            if not os.path.isfile(layout.manifest(artifact.key)):
                raise StorageError(
                    f"{directory}: the entry was removed (evicted or pruned) before its "
                    "XNNPACK packed-weight file was made; call ensure again"
                )
            digests = _digests(directory, artifact, compute=True)
            if digests is None:
                raise StorageError(f"{artifact.pte}: missing from its entry; call ensure again")
            if artifact.choice is not None:  # from a fleet's index: its file, if it has one
                from .indexed import packed_from_index

                found, refused = packed_from_index(
                    artifact, directory, digests, dict(storage_options or {}), moved
                )
                if refused is not None and not retry:
                    return _refused(directory, artifact, digests, refused)
                source = "index"
            try:
                if found is None:
                    found = make_cache(
                        artifact.pte,
                        ptd=artifact.ptd,
                        directory=directory,
                        pte_sha256=digests[0],
                        ptd_sha256=digests[1],
                        full=False,
                        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
                        retry_refused=retry,
                    )
                    # made now, or found: another process made it while this one waited
                    # for the entry's lock (its xnnpack.json then not yet read here)
                    source = "made" if found.made else "found"
            except PackedWeightsRefused as exc:
                from .._log import get_logger

                get_logger("ptestore.device").warning(
                    "%s: served without an XNNPACK packed-weight file: %s", artifact.pte, exc.reason
                )
                return _refused(directory, artifact, digests, exc.reason)
            _remove(directory, _stale(directory, str(found.path)))
            _share_digests(artifact, found, digests)
    if source == "index" and artifact.choice is not None:  # what the delivery moved
        fetched = {"received": moved.get("store", 0), "from_base": moved.get("base", 0)}
        artifact = replace(artifact, choice={**artifact.choice, "xnnpack_fetched": fetched})
    return replace(artifact, xnnpack_cache=str(found.path), xnnpack_from=source)
