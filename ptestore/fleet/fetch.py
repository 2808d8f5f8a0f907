"""``ptestore fetch``: download the artifact an index selects for a device (and its
.ptd) to local disk, verified before anything is published.

Each file is downloaded into ``DEST.part`` (the version it is pinned to beside it in
``DEST.part.json``: the URL, the size, and the ETag and version id of an S3 object or
the device, inode and ``mtime_ns`` of a local file), checked and only then renamed to
``DEST`` (atomic: nothing partial is ever visible at ``DEST``; the download itself is
the published file, so a fetch needs the artifact's size on disk once, not twice). The
two download files are opened in the destination's directory without following links
(``O_NOFOLLOW``; a new ``.part`` with ``O_EXCL``): a symbolic link, or a file another
user owns or that has other names, at either name is refused, never written through.
One fetch into a destination at a time: each holds an ``flock`` on ``DEST.part.lock``
from its first download to its last rename (:mod:`ptestore.storage.flock`). Before the
first request (:mod:`.fetch_checks`): ``DEST`` and its ``.ptd``'s path are not
directories, every base given is a local regular file, an index entry's fields are in
their form (and, when the destination has no room for them, its sizes are its objects').
A URL fetched directly is described from its trailer; an object replaced between that
and its download is described again and fetched from the start, once.

The check, per file:

- an artifact whose trailer records chunk digests (record version 2) is checked **chunk
  by chunk as it arrives** (:mod:`.chunked`): its trailer is read first (a ranged GET of
  the tail, pinned by the index entry's ``trailer_sha256`` and ``size``), and each 4 MiB
  chunk is compared with the record's digest; ``DEST.part.json`` also counts the verified
  chunks, and a resume keeps no byte past them. With ``base=`` (or from ``ensure``, what
  the cache holds) the chunks a local file already has are cloned or copied from it
  and checked the same way (:mod:`.delta`): only the others are downloaded;
- any other file (a version-1 record, a .ptd stored once by content (:mod:`.shared`),
  the portable source) is checked whole (:mod:`.whole`): the size and the SHA-256 the
  index names (for an artifact, of its bytes before the provenance trailer, plus the
  trailer's own checksum); an interrupted download resumes where ``DEST.part`` ends when
  the object is still the version it was pinned to and the ``.part``'s last bytes are
  the object's.

Then the pair's binding: a .pte whose record names its .ptd's SHA-256 is fetched only
with that .ptd. Every request is pinned to the object's version (``If-Match`` on S3,
:mod:`.ranged`); an object that changed restarts the download from the beginning.
Every file is downloaded and checked before any is published (a mismatch is an
:class:`~ptestore.errors.IntegrityError` with ``published=False``); then the .ptd is
published first, then the .pte: a failure between the two is a
:class:`~ptestore.errors.PartialPublish` naming the .ptd as published.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from .._log import get_logger
from ..errors import (
    ConfigurationError,
    IntegrityError,
    PartialPublish,
)
from ..storage.atomic import rename
from ..storage.types import absolute_path
from .chunked import FetchEvent, Sink, download_chunks, pinned_record
from .current import current_file, dest_base, may_be_current
from .delta import Base, open_bases
from .download import discard_part, local_writes, open_part, refuse_link
from .fetch_checks import (
    EntryMismatch,
    base_paths,
    check_bases,
    check_chosen_options,
    check_dest,
    check_entry,
    check_options,
    check_pair,
    check_paths,
    check_pinned,
    check_room_for,
    dest_lock,
)
from .index_bounds import trusted_origins as origins_of
from .index_entry import ptd_entry_of
from .job import ptd_beside
from .ranged import PinnedReader, pinned_attempts
from .select import Choice, select_from
from .whole import check_whole, download_whole

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..storage.loaders import DataLoader

__all__ = ["FetchEvent", "FetchResult", "fetch"]

log = get_logger(__name__)

#: The most bytes asked of the store in one request (a ranged GET): consecutive chunks
#: are coalesced up to this, read and written in pieces of at most 1 MiB.
_CHUNK = 64 << 20

Progress = Callable[[str, int, int], None]


@dataclass
class FetchResult:
    """What :func:`fetch` published: for each file its URL and path, size, where it
    resumed, how it was verified (``"chunks"``: each chunk against the record in its
    trailer; ``"whole"``), the bytes ``received`` from the store in how many
    ``requests``, the bytes taken ``from_base`` (by base, ``bases``); and the
    selection that chose them."""

    choice: Choice | None
    files: list[dict[str, Any]] = field(default_factory=list)
    #: With ``xnnpack_cache=True``: the XNNPACK packed-weight file delivered beside the
    #: .pte (:func:`.packed.fetch_packed`: ``path`` None and ``reason`` when none).
    xnnpack: dict[str, Any] | None = None

    @property
    def received(self) -> int:
        """Bytes the store sent for every file (trailer reads included)."""
        return sum(int(f.get("received", 0)) for f in self.files)

    @property
    def from_base(self) -> int:
        """Bytes taken from the bases instead of the store."""
        return sum(int(f.get("from_base", 0)) for f in self.files)

    @property
    def current(self) -> bool:
        """Every file was already at its path, as the index names it (:mod:`.current`):
        nothing was downloaded, nothing rewritten."""
        return bool(self.files) and all(f.get("current") for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "choice": None if self.choice is None else self.choice.to_dict(),
            "files": self.files,
            "received": self.received,
            "from_base": self.from_base,
            "current": self.current,
        }
        if self.xnnpack is not None:
            out["xnnpack"] = self.xnnpack
        return out


def _download(
    want: dict[str, Any],
    dest: str,
    options: dict[str, Any],
    chunk_size: int,
    bases: list[Base],
    sink: Callable[[str, str, int], Sink],
) -> dict[str, Any]:
    url = str(want["url"])
    part, meta_path = dest + ".part", dest + ".part.json"
    for name in (part, meta_path):
        refuse_link(name)

    def run(loader: DataLoader, reader: PinnedReader, state: dict[str, Any]) -> dict[str, Any]:
        size = int(state["size"])
        record = pinned_record(want, size, reader)
        if record is None:  # its .part also pinned to the bytes the index names
            pins = {"sha256": want["sha256"], "trailer_sha256": want.get("trailer_sha256")}
            return download_whole(
                want, dest, {**state, **pins}, reader, bases, chunk_size, sink, check_whole
            )
        chunks = record.chunks  # verified chunk by chunk (.chunked)
        got = download_chunks(
            url=url,
            dest=dest,
            size=size,
            state={
                **state,
                "trailer_sha256": want["trailer_sha256"],
                "chunks": {"size": chunks.chunk_size, "root": chunks.root},
            },
            chunks=chunks,
            trailer_bytes=record.trailer,
            tail=(record.tail_offset, record.tail),
            reader=reader,
            bases=bases,
            request_size=chunk_size,
            sink=sink(url, dest, size),
            record_name="the record in its trailer"
            + ("" if want.get("named_by") else " (the one the index names)"),
        )
        got["sha256"] = record.sha256
        return got

    with local_writes(dest, url, part):  # a full disk: a StorageError, not an OSError
        return pinned_attempts(url, options, dest, run)


def _take_over(got: dict[str, Any]) -> None:
    """A checked download's ``DEST.part`` (already durable) given what it keeps of the
    file it replaces, as the local writer's publish (its permission bits, never setuid,
    setgid or sticky; its owner and group as far as the process may: as root both), or
    ``0666`` less the umask as a new file. Done for every file of a pair before the
    first is renamed (a DEST this refuses, a loop of links, leaves the pair as it was)."""
    from ..writers._staging import current_umask, take_over

    dest = str(got["path"])
    fd = open_part(dest + ".part", True)  # the download's own (O_NOFOLLOW, one name)
    try:
        take_over(fd, dest, 0o666 & ~current_umask())
    finally:
        os.close(fd)


def _publish(got: dict[str, Any]) -> None:
    """Publish a checked download, already taken over (:func:`_take_over`): ``DEST.part``
    renamed over ``DEST``, the directory synced; then its resume marker removed."""
    dest = str(got["path"])
    rename(dest + ".part", dest)
    try:
        os.unlink(dest + ".part.json")
    except FileNotFoundError:
        pass


def _discard_parts(files: list[dict[str, Any]]) -> None:
    for f in files:
        discard_part(str(f["path"]))


def fetch(
    index_or_url: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    model: str | None = None,
    device: DeviceProfile | str | None = None,
    storage_options: dict[str, Any] | None = None,
    chunk_size: int = _CHUNK,
    progress: Progress | None = None,
    base: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    events: Callable[[FetchEvent], None] | None = None,
    xnnpack_cache: bool = False,
    require_base: bool = True,
    trusted_origins: Sequence[str] | None = None,
) -> FetchResult:
    """Download what ``index_or_url`` selects for ``model`` on ``device`` (an index),
    or the artifact at ``index_or_url`` itself (a .pte: its .ptd beside it is fetched
    when its record names one), to ``dest`` (the .pte's path; a .ptd goes beside it).

    ``base``: local files (a path, or several) holding an earlier version of the
    artifact (or the portable source): the chunks they hold are taken from them (cloned
    or copied, each verified against the artifact's record) and only the others are
    downloaded; a base's ``.ptd`` is the one beside it. ``progress(url, done, total)``
    and ``events(FetchEvent)`` report each piece put in place (``events`` says where it
    came from); a ``base`` that does not exist is a ConfigurationError, or with
    ``require_base=False`` skipped (``ensure``'s bases: another process may evict one
    meanwhile). ``xnnpack_cache``: then also its XNNPACK packed-weight file for this
    CPU and ExecuTorch build, when the fleet made one (:func:`.packed.fetch_packed`:
    verified, beside ``dest``). ``storage_options``: for the index and the files it
    names, or the URL fetched; one that applies to none of them is refused before they
    are read (:func:`.fetch_checks.check_options`). ``trusted_origins``: as for
    :func:`~.select.select` (an index read over http(s), or the XNNPACK record beside an
    artifact fetched by its http(s) URL), checked before anything is read. See the
    module docstring."""
    from .._args import path_argument

    src = path_argument(index_or_url, "index_or_url")
    target = check_dest(path_argument(dest, "dest"))
    if chunk_size < 1:
        raise ConfigurationError(f"chunk_size must be >= 1, got {chunk_size}")
    if src.endswith(".json") and (model is None or device is None):
        raise ConfigurationError(f"{src}: fetching from an index needs --model and --device")
    opts = dict(storage_options or {})
    given = [] if base is None else [base] if isinstance(base, str | os.PathLike) else list(base)
    pte_bases = base_paths(given)
    check_options(src, target, pte_bases, opts)  # before the first read
    origins_of(trusted_origins)  # also an artifact's by URL: what its XNNPACK record may name
    if require_base:  # before the first request
        check_bases(pte_bases)

    def sink(url: str, path: str, total: int) -> Sink:
        return Sink(url, path, total, progress, events)

    choice, files = _files(src, target, model, device, opts, trusted_origins)
    if choice is not None:  # a local index is read: the files it names
        packed = choice.xnnpack if xnnpack_cache else None
        check_chosen_options(src, [choice.pte, choice.ptd, packed], opts)
        check_pinned(src, choice.kind, f"{choice.model}/{choice.made_for}", choice.pte, choice.ptd)
    from ..storage.redirects import index_redirects

    # The files an index read over http(s) names: a redirect only to its origins
    with index_redirects(src, trusted_origins) if choice is not None else nullcontext():
        for again in (False, True):
            result = FetchResult(choice)
            try:
                _fetch_files(files, target, pte_bases, opts, chunk_size, sink, result, require_base)
                break
            except EntryMismatch as exc:
                if choice is not None or again:
                    raise
                log.warning("%s; reading its trailer again and fetching it from the start", exc)
                choice, files = _files(src, target, model, device, opts, trusted_origins)
        if xnnpack_cache:
            from .packed import fetch_packed

            offered = None if choice is None or choice.kind != "artifact" else choice.xnnpack
            result.xnnpack = fetch_packed(
                src,
                offered,
                result.files,
                opts,
                chunk_size,
                progress,
                indexed=choice is not None,
                base_dirs=[os.path.dirname(absolute_path(b)) for b in pte_bases],
                events=events,
                malformed=None if choice is None else choice.xnnpack_error,
                trusted_origins=trusted_origins,
            )
    return result


def _files(
    src: str,
    target: str,
    model: str | None,
    device: DeviceProfile | str | None,
    opts: dict[str, Any],
    trusted: Sequence[str] | None = None,
) -> tuple[Choice | None, list[tuple[dict[str, Any], str]]]:
    """What to fetch: the choice of the index ``src`` and its files, or the artifact at
    the URL ``src`` (its entry what its trailer says now: ``named_by``) and the .ptd its
    record names; each with the path it is published at."""
    if src.endswith(".json"):
        assert model is not None and device is not None  # checked by fetch
        choice = select_from(src, model, device, storage_options=opts, trusted_origins=trusted)
        files = [(choice.pte, target)]
        if choice.ptd is not None:
            files.append((choice.ptd, ptd_beside(target)))
        return choice, files
    files = [({**_describe(src, opts), "named_by": "trailer"}, target)]
    ptd_want = ptd_entry_of(src, opts)
    if ptd_want is not None:
        by = "record" if ptd_want.get("shared") else "trailer"
        files.append(({**ptd_want, "named_by": by}, ptd_beside(target)))
    return None, files


def _fetch_files(
    files: list[tuple[dict[str, Any], str]],
    target: str,
    pte_bases: list[str],
    opts: dict[str, Any],
    chunk_size: int,
    sink: Callable[[str, str, int], Sink],
    result: FetchResult,
    require_base: bool,
) -> None:
    """The entries and the destination checked, and room for the files
    (:mod:`.fetch_checks`), before anything is downloaded; then, under the destination's
    lock, :func:`_download_all`."""
    for want, _ in files:
        check_entry(want)
    check_paths([p for _, p in files], target)
    ptd_bases = [ptd_beside(b) for b in pte_bases]
    room = {p: [*(pte_bases if p == target else ptd_bases), p] for _, p in files}
    # A DEST of the entry's size may be it already: its room is checked (under the lock)
    # once it is known not to be, so that a full disk never refuses a current DEST.
    later = {p for want, p in files if may_be_current(p, want)}
    check_room_for([f for f in files if f[1] not in later], room, opts)
    # One fetch into a destination at a time: another would take over (or remove) this
    # one's live .part, and this one would then publish bytes it never checked.
    with dest_lock(target, [p for _, p in files]):
        own = {p: dest_base(p) for _, p in files}  # DEST itself: current, or a base
        try:
            done = {p: current_file(b, w) for w, p in files if (b := own[p]) is not None}
            check_room_for([f for f in files if f[1] in later and not done.get(f[1])], room, opts)
            got = [(w, p, done.get(p), own[p]) for w, p in files]
            _download_all(got, target, pte_bases, opts, chunk_size, sink, result, require_base)
        finally:
            for b in own.values():
                if b is not None:
                    b.close()


def _download_all(
    files: list[tuple[dict[str, Any], str, dict[str, Any] | None, Base | None]],
    target: str,
    pte_bases: list[str],
    opts: dict[str, Any],
    chunk_size: int,
    sink: Callable[[str, str, int], Sink],
    result: FetchResult,
    require_base: bool = True,
) -> None:
    """Every file downloaded and checked before any is published (a mismatch is an
    IntegrityError with nothing published), the pair's binding too; then the .ptd, then
    the .pte (:func:`_publish_all`). A file already ``current`` (its result given) is
    neither downloaded nor published; ``DEST``'s own file (a :class:`Base`) is the
    last base of its download."""
    for want, path, current, own in sorted(files, key=lambda f: f[1] == target):  # .ptd first
        if current is not None:
            result.files.append(current)
            continue
        is_ptd = path != target
        paths = [ptd_beside(b) for b in pte_bases] if is_ptd else pte_bases
        bases = open_bases(paths, required=require_base and not is_ptd)
        try:
            mine = [] if own is None else [own]
            got = _download(want, path, opts, chunk_size, bases + mine, sink)
            result.files.append({**got, "current": False})
        finally:
            for b in bases:
                b.close()
    fresh = [f for f in result.files if not f["current"]]
    try:
        check_pair(result.files, target)
    except IntegrityError:
        _discard_parts(fresh)
        raise
    _publish_all(fresh)


def _publish_all(files: list[dict[str, Any]]) -> None:
    """Publish the checked downloads, .ptd first; a failure after the .ptd says so."""
    for got in files:
        _take_over(got)
    done: list[str] = []
    for got in files:
        try:
            _publish(got)
        except BaseException as exc:
            if not done:
                raise
            where = f"{done[0]} was published, {got['path']} was not"
            text = (
                f"{where} (it still holds what it held before, or nothing): the pair is "
                "torn until the fetch is run again"
            )
            if isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt(f"after publishing {done[0]}; {text}") from exc
            raise PartialPublish(f"{text}: {exc}", published=tuple(done)) from exc
        done.append(str(got["path"]))


def _describe(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """What a direct artifact URL must be: its trailer names its bytes."""
    from .index_entry import artifact_entry

    return artifact_entry(url, options)[0]
