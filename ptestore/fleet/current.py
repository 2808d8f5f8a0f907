"""What ``DEST`` already holds, for :mod:`.fetch`: the destination's own files as bases,
and whether they already are what the index names.

A ``DEST`` (the ``.pte``, and the ``.ptd`` beside it) that is a local regular file is
opened (:func:`dest_base`: looked at without following a link, then opened and checked
to be that same file; a symbolic link, a FIFO, a directory, a file that cannot be read
is not a base, and the fetch is the plain one it was) and then:

- **current** (:func:`current_file`): every byte is what the index entry names, read and
  hashed from ``DEST`` itself: its size, the checksum of its trailer (the index pins it:
  its record is then the index's) and its footer's format version (the one the
  writer of its record wrote: no digest covers it), every chunk's SHA-256 against that
  record and the content's digest (the record's root, or the whole SHA-256 of a file checked whole)
  against the entry's ``sha256``. Its size, modification time or trailer alone are never
  taken for it; a size or a trailer that differs is enough to say it is not, and so is a
  file another user owns, unless this is root (who could rewrite it later: it is
  replaced by one of this user's, as before; root's replacement keeps the owner). Nothing
  is downloaded and the file is not touched (mode, owner, inode and times as they were);
- otherwise it is one more base of the delta fetch (:mod:`.delta`), after the ones the
  user gave (``--base``): the chunks it holds are taken from it, verified, and only the
  others are downloaded; the download is published as any other.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ..errors import FormatError, PteStoreError
from .delta import Base

__all__ = ["current_file", "dest_base", "may_be_current"]


def may_be_current(path: str, want: dict[str, Any]) -> bool:
    """``path`` is a regular file of the size ``want`` names (or it names none): it may
    be current (only :func:`current_file` says whether it is)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == want.get("size", st.st_size)


def dest_base(path: str) -> Base | None:
    """``path`` (a file fetch publishes) as a base when it is a local regular file this
    process can read (not a link to one: ``lstat``, then the opened file must be the same
    one); None otherwise (nothing there, a link, a FIFO, a directory, unreadable)."""
    from ..storage.loaders import LocalFileLoader
    from .delta import recorded

    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        loader = LocalFileLoader(path)
    except (PteStoreError, OSError):
        return None
    opened = os.fstat(loader.fileno())
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        loader.close()  # replaced (by a link?) between the look and the open
        return None
    try:
        return Base(path, loader, loader.size(), recorded(loader))
    except (PteStoreError, OSError, ValueError):
        loader.close()
        return None


def current_file(base: Base, want: dict[str, Any]) -> dict[str, Any] | None:
    """What the fetch result says of the file ``want`` (an index file entry) names when
    ``base`` (its ``DEST``, :func:`dest_base`) already is it, read and hashed (see the
    module); None when it is not, or cannot be read whole."""
    try:
        got = _current(base, want)
        if got is not None:
            base.loader.check_unchanged()  # written to meanwhile: not what was hashed
        return got
    except (PteStoreError, OSError, ValueError):
        return None  # unreadable, or changed while read: downloaded as if not there


def _current(base: Base, want: dict[str, Any]) -> dict[str, Any] | None:
    from ..provenance.chunks import hash_chunks
    from ..provenance.digest import content_digest
    from ..provenance.record import Provenance
    from ..provenance.trailer import TRAILER_VERSION, read_trailer

    loader, size = base.loader, base.loader.size()
    if "size" in want and size != want["size"]:
        return None
    euid = os.geteuid()
    if euid != 0 and os.fstat(loader.fileno()).st_uid != euid:
        # another user's (a shared sticky directory), who may rewrite it later: replaced
        # by one of this user's, as before. Root's replacement would keep that owner
        # (writers' take-over): nothing gained, so as root such a file may be current.
        return None
    pinned = want.get("trailer_sha256")
    out: dict[str, Any] = {
        "url": str(want["url"]),
        "path": base.path,
        "size": size,
        "resumed_from": 0,
        "received": 0,
        "requests": 0,
        "from_base": 0,
        "bases": {},
        "current": True,
    }
    if pinned is None:  # no trailer pinned: the whole file has the entry's digest
        got = content_digest(loader, size, like=want["sha256"]).sha256
        return {**out, "sha256": got, "verified": "whole"} if got == want["sha256"] else None
    try:
        trailer = read_trailer(loader)
    except FormatError:
        return None
    if trailer is None or "sha256:" + trailer.sha256 != pinned:
        return None
    try:
        prov = Provenance.of_trailer(trailer, base.path)
    except FormatError:
        return None  # the index pins a trailer whose record is invalid: the download says
    if trailer.version != (1 if prov.version == 1 else TRAILER_VERSION):
        # The footer's format version is the one field no digest covers: current only
        # as the writer of this record wrote it (version 1 before chunk digests, when
        # the record was version 1 too), else its trailer is downloaded.
        return None
    content = prov.content
    chunks = None if content is None else content.chunks
    if content is None or chunks is None:  # a version-1 record: the content whole
        got = content_digest(loader, trailer.content_size, like=want["sha256"]).sha256
        return {**out, "sha256": got, "verified": "whole"} if got == want["sha256"] else None
    if want["sha256"] not in (content.sha256, chunks.digest):
        return None  # the entry names other bytes than its pinned trailer: the download says
    if chunks.length != trailer.content_size:
        return None
    hashed = hash_chunks(loader, chunks.length)
    if [hashed.get(i) for i in range(len(chunks.digests))] != list(chunks.digests):
        return None
    return {
        **out,
        "sha256": content.sha256,
        "verified": "chunks",
        "chunks": len(chunks.digests),
        "chunk_size": chunks.chunk_size,
        "cloned": 0,
        "base_damaged": [],
        "part_damaged": [],
        "store_retried": [],
    }
