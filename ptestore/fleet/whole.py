"""The whole-file download of :mod:`.fetch`: a file without a chunk record (a
version-1 trailer, a ``.ptd`` stored once by content, the portable source) is
downloaded into ``DEST.part`` in ranged GETs pinned to its version, or taken whole from
a base of the same size, then checked whole (the ``check`` :mod:`.fetch` gives: the
size, the SHA-256 the index names and the trailer's checksum).

A download interrupted resumes where ``DEST.part`` ends when the ``.part.json`` pins the
same object version; the last bytes of the ``.part`` are read again from the object and
compared first (:func:`resume_point`): a ``.part`` that does not end where the object's
bytes do restarts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .._io import pwrite_all
from .._log import get_logger
from ..errors import FormatError, IntegrityError
from ..provenance.digest import content_digest
from ..provenance.trailer import read_trailer
from ..storage.atomic import sync_file
from ..storage.loaders import LocalFileLoader
from ..storage.types import absolute_path
from .chunked import Sink
from .delta import Base, copy_whole
from .download import check_room, clones_from, discard_part, open_part, read_state, save_state
from .fetch_checks import EntryMismatch, named
from .ranged import ObjectChanged, PinnedReader

__all__ = ["check_whole", "download_whole", "resume_point"]

log = get_logger(__name__)


#: Bytes at the end of a ``.part`` read again from the object and compared before a
#: download resumes: a ``.part`` that does not end where the object's bytes do (a byte
#: too many or too few, a torn last write) restarts instead of resuming.
_OVERLAP = 64 << 10


def resume_point(fd: int, resumed: int, size: int, read: Callable[[int, int], bytes]) -> int:
    """Where the download in ``fd`` (``resumed`` bytes on disk) really resumes: there
    when its last bytes are the object's, else 0 (start again)."""
    if resumed == 0:
        return 0
    if resumed > size:
        return 0  # longer than the object: not a prefix of it
    n = min(_OVERLAP, resumed)
    have = os.pread(fd, n, resumed - n)
    try:
        want = read(resumed - n, n)
    except ObjectChanged:
        return 0
    return resumed if have == want else 0


def download_whole(
    want: dict[str, Any],
    dest: str,
    state: dict[str, Any],
    reader: PinnedReader,
    bases: list[Base],
    chunk_size: int,
    sink: Callable[[str, str, int], Sink],
    check: Callable[[str, dict[str, Any]], str],
) -> dict[str, Any]:
    """A file without a chunk record (a version-1 trailer, a shared .ptd, the portable
    source): downloaded (or resumed, or taken whole from a base of the same bytes), then
    checked whole (:func:`check_whole`)."""
    url, size = str(want["url"]), int(state["size"])
    if "size" in want and size != want["size"]:  # before a byte is downloaded
        raise EntryMismatch(
            f"{url}: the object is {size} bytes, {named(want, want['size'])}", published=False
        )
    part, meta_path = dest + ".part", dest + ".part.json"
    report = sink(url, dest, size)
    on_disk = 0
    if read_state(meta_path) == state:
        try:
            on_disk = os.lstat(part).st_size
        except FileNotFoundError:
            on_disk = 0
    save_state(meta_path, json.dumps(state).encode(), dest, url)
    from_base: dict[str, int] = {}
    fd = open_part(part, on_disk > 0)
    try:
        resumed = resume_point(fd, on_disk, size, reader.read)
        os.ftruncate(fd, resumed)
        done = resumed
        if resumed:
            report.add("part", resumed)
        else:
            taken = _whole_from_base(want, dest, fd, size, bases)
            if taken is not None:
                from_base[taken] = done = size
        here = os.path.dirname(absolute_path(dest))
        if done < size and clones_from(here, [b.path for b in bases]):
            check_room(dest, size - done, 0)  # a base was counted as a free clone at best
        while done < size:
            end = min(done + chunk_size, size)
            for piece in reader.stream(done, end, min(chunk_size, 1 << 20)):
                pwrite_all(fd, memoryview(piece), done)
                done += len(piece)
                report.add("store", len(piece))
        # Written in place and resumed; one fsync makes the finished download durable
        # before it is checked and renamed into place.
        sync_file(fd)
    finally:
        os.close(fd)
    try:
        digest = check(part, want)
    except IntegrityError as exc:
        if from_base:  # the base was not those bytes after all: download them
            discard_part(dest)
            return download_whole(want, dest, state, reader, [], chunk_size, sink, check)
        discard_part(dest)
        if resumed:  # only its last bytes were compared: the .part may be what is damaged
            log.warning(
                "%s: the download resumed after %d bytes does not check (%s); the .part "
                "may have been damaged before its last %d bytes: downloading it again "
                "from the start",
                part,
                resumed,
                exc,
                _OVERLAP,
            )
            return download_whole(want, dest, state, reader, bases, chunk_size, sink, check)
        raise
    if from_base:
        report.add("base", size)  # once it checks
    return {
        "url": url,
        "path": dest,
        "size": size,
        "resumed_from": 0 if from_base else resumed,
        "sha256": digest,
        "verified": "whole",
        "received": reader.received,
        "requests": reader.requests,
        "from_base": size if from_base else 0,
        "bases": from_base,
    }


def _whole_from_base(
    want: dict[str, Any], dest: str, fd: int, size: int, bases: list[Base]
) -> str | None:
    """Copy the first base that could be these very bytes (the same size, and the
    trailer checksum the entry names when it names one) into the empty ``.part``
    (``fd``); its path, or None. :func:`check_whole` decides after."""
    directory = os.path.dirname(absolute_path(dest))
    pinned = want.get("trailer_sha256")
    for base in bases:
        if base.size != size:
            continue
        if pinned is not None:
            try:
                trailer = read_trailer(base.loader)
            except FormatError:
                continue
            if trailer is None or "sha256:" + trailer.sha256 != pinned:
                continue
        copy_whole(base, fd, directory)
        return base.path
    return None


def check_whole(path: str, want: dict[str, Any]) -> str:
    """The downloaded ``path`` is what ``want`` (an index file entry) names; returns the
    SHA-256 of its content (before its trailer, when it has one)."""
    loader = LocalFileLoader(path)
    try:
        size = loader.size()
        if "size" in want and size != want["size"]:
            raise IntegrityError(
                f"{want['url']}: downloaded {size} bytes, {named(want, want['size'])}",
                published=False,
            )
        if want.get("trailer_sha256") is not None:
            trailer = read_trailer(loader)
            if trailer is None or "sha256:" + trailer.sha256 != want["trailer_sha256"]:
                have = None if trailer is None else "sha256:" + trailer.sha256
                raise EntryMismatch(
                    f"{want['url']}: provenance trailer checksum {have}, "
                    f"{named(want, want['trailer_sha256'])}",
                    published=False,
                )
            got = content_digest(loader, trailer.content_size, like=want["sha256"]).sha256
        else:
            got = content_digest(loader, size, like=want["sha256"]).sha256
        if got != want["sha256"]:
            raise IntegrityError(
                f"{want['url']}: downloaded bytes have {got}, {named(want, want['sha256'])}",
                published=False,
            )
        return got
    except FormatError as exc:
        raise IntegrityError(f"{want['url']}: {exc}", published=False) from exc
    finally:
        loader.close()
