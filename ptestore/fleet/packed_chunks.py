"""The chunk record of a fleet's XNNPACK packed-weight file, and its download: by chunks
from earlier versions' files (delta), or whole.

A packed-weight file is as large as the weights it packs, and a model update that
changes one weight changes one packed region of it: the other regions keep their bytes
and their offsets (XNNPACK packs the same graph in the same order, each region at a
page-aligned offset). So the fleet records, beside each file it makes (hashed as it is
uploaded, :mod:`.packing`), the SHA-256 of every 4 MiB chunk of it
(:class:`~ptestore.provenance.chunks.ChunkDigests`, the same record an artifact's
trailer holds) in the file's record ``<stem>.xpwc.json``
(``"chunks"``), and their root in the index's ``xnnpack`` field (``"chunks_root"``,
``sha256-tree:<hex>``, which pins the record: a record made since for another version
does not match it and is not used).

A device that already holds packed-weight files of an earlier version of the model (the
cache entry's, or those beside a fetched ``.pte``) gets the new one by
:func:`download_delta`: each chunk an old file holds at the same offset is cloned or
copied from it and checked against the record, only the others are downloaded (ranged
GETs pinned to the object's version, each chunk checked as it arrives,
:func:`ptestore.fleet.chunked.download_chunks`). Every chunk is checked against the
record the index pins; the file assembled is then hashed whole (once, from local disk:
its chunks come in no fixed order) and checked against the index's ``sha256``, the
digest the file is installed under: nothing else ties ``chunks_root`` to it, and an
index whose two disagree is refused. With no old file every chunk
comes from the store, still checked as it arrives, and a download cut off resumes at
its verified chunks. Without a chunk record (a file made by an older ptestore) the file
is downloaded whole (:func:`download_whole`).

A weight whose packed size changed (a layer of another shape) moves every region after
it. :class:`PackedLayouts` then finds them where the old file keeps them: the new
file's index (at its end: its last chunk, downloaded first) and the old file's are
read, each region paired with the old region of the same entry name (the named-data
keys of the weight and its bias) when both have the same size, and a chunk whose
regions moved is built from the old file's ranges (:func:`.shift.chunk_pieces`). The
pairing is a guess, never trusted: every chunk built from it is checked against the
record.
"""

from __future__ import annotations

import contextlib
import glob
import json
import mmap
import os
import stat
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._io import pread_all
from .._log import get_logger
from ..errors import FormatError, IntegrityError, StorageError
from ..provenance.chunks import ChunkDigests
from .fetch_checks import named
from .shift import Moves

if TYPE_CHECKING:
    from ..xnnpack.xpwc import Entry
    from .bases import FromStore
    from .delta import Base

__all__ = [
    "PackedLayouts",
    "download_delta",
    "download_whole",
    "packed_bases",
    "recorded_chunks",
]

log = get_logger(__name__)

#: How many old packed-weight files a delivery takes chunks from (newest first).
MAX_BASES = 4


def recorded_chunks(field: dict[str, Any], record: dict[str, Any] | None) -> ChunkDigests | None:
    """The chunk digests of the index's packed-weight file ``field`` from ``record`` (the
    one beside the file), when the field names their root and the record's match it;
    else None (logged): the file is then downloaded whole."""
    root = field.get("chunks_root")
    url = str(field.get("url"))
    if not isinstance(root, str) or not isinstance(field.get("size"), int):
        return None
    d = None if record is None else record.get("chunks")
    try:
        chunks = ChunkDigests.from_dict(d, int(field["size"]), url, "xnnpack record")
    except FormatError as exc:
        log.info("%s: no chunk record beside it (%s): downloaded whole", url, exc)
        return None
    if chunks.digest != root:
        log.info(
            "%s: the chunk record beside it has the root %s, %s (a later run replaced "
            "it): downloaded whole",
            url,
            chunks.digest,
            named(field, root),
        )
        return None
    return chunks


def _entries(fd: int, size: int, source: str) -> list[Entry] | None:
    """The index entries of the packed-weight file open at ``fd`` (``size`` bytes);
    None when it is not one (:func:`ptestore.xnnpack.xpwc.parse_index`)."""
    from ..xnnpack.xpwc import parse_index

    if size == 0:
        return None
    try:
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            view = memoryview(m)
            try:
                return parse_index(view, source)
            finally:
                view.release()
    except (FormatError, OSError, ValueError):
        return None


class PackedLayouts:
    """The :class:`.bases.Layouts` of XNNPACK packed-weight files (see the module)."""

    def __init__(self) -> None:
        self._bases: dict[str, list[Entry] | None] = {}

    def of_base(self, base: Base) -> list[Entry] | None:
        if base.path not in self._bases:
            self._bases[base.path] = _entries(base.fileno(), base.size, base.path)
        return self._bases[base.path]

    def first(self, chunks: ChunkDigests) -> set[int]:
        return {len(chunks.digests) - 1} if chunks.digests else set()

    def target(
        self, fd: int, chunks: ChunkDigests, done: set[int], from_store: FromStore, url: str
    ) -> list[Entry] | None:
        from ..xnnpack.xpwc import FOOTER_SIZE

        size = chunks.length
        if size < FOOTER_SIZE:
            return None
        last = len(chunks.digests) - 1
        if last not in done:
            from_store([last])
        (index_start,) = struct.unpack("<Q", pread_all(fd, 8, size - FOOTER_SIZE))
        for i in chunks.covering(min(index_start, size), size):  # an index longer than
            if i not in done:  # the last chunk: each chunk it spans (a run is consecutive)
                from_store([i])
        return _entries(fd, size, url)

    def moves(self, target: list[Entry], base: list[Entry]) -> Moves | None:
        """None when no region pairs: another model's file (the names are its keys),
        not tried even at the same offsets."""
        by_name = {e.name: e for e in base}
        rows = []
        for t in sorted(target, key=lambda e: e.offset):
            b = by_name.get(t.name)
            found = b.offset if b is not None and b.size == t.size else None
            rows.append((t.offset, t.offset + t.size, found))
        if all(found is None for _, _, found in rows):
            return None
        return Moves(0, tuple(rows))


def _serves(path: str, artifact: str) -> bool:
    """Whether the record beside the packed-weight file ``path`` says it was installed
    for ``artifact`` (:mod:`ptestore.xnnpack.users`)."""
    from ..xnnpack.users import USERS

    try:
        with open(path + ".json", "rb") as f:
            record = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    users = record.get(USERS) if isinstance(record, dict) else None
    return isinstance(users, list) and artifact in users


def packed_bases(directories: Sequence[str], artifact: str | None = None) -> list[str]:
    """The packed-weight files (``xnnpack-<id>.xpwc``) in ``directories``, at most
    :data:`MAX_BASES`: those installed for ``artifact`` (an absolute .pte path: its
    earlier versions' files) first, then the newest."""
    found: dict[str, tuple[bool, float]] = {}
    for d in directories:
        for path in glob.glob(os.path.join(glob.escape(d), "xnnpack-*.xpwc")):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                mine = artifact is not None and _serves(path, artifact)
                found[os.path.realpath(path)] = (mine, st.st_mtime)
    return sorted(found, key=lambda p: (not found[p][0], -found[p][1]))[:MAX_BASES]


def download_whole(
    field: dict[str, Any],
    part: str,
    options: dict[str, Any],
    progress: Callable[[str, int, int], None] | None,
    chunk: int,
    events: Callable[[Any], None] | None = None,
) -> str:
    """``field``'s file downloaded whole into ``part`` (opened without following links,
    made durable; a file with no chunk record); its SHA-256 (hex), hashed as it arrived
    and checked with its size against the index. Every read holds the bytes it asks for
    (the loader's, :mod:`ptestore.storage.remote`: never a longer answer); an error names
    the URL as a report prints it (:func:`.index_bounds.names_shown`)."""
    from .index_bounds import names_shown

    with names_shown([field.get("url")]):
        return _download_whole(field, part, options, progress, chunk, events)


def _download_whole(
    field: dict[str, Any],
    part: str,
    options: dict[str, Any],
    progress: Callable[[str, int, int], None] | None,
    chunk: int,
    events: Callable[[Any], None] | None,
) -> str:
    import hashlib

    from .._io import pwrite_all
    from ..storage.atomic import sync_file
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader
    from .chunked import Sink
    from .download import open_part, refuse_link

    url = str(field["url"])
    refuse_link(part)
    loader = open_loader(url, **options_for_loader(url, options))
    try:
        size = loader.size()
        if size != field.get("size"):
            raise IntegrityError(
                f"{url}: {size} bytes, {named(field, field.get('size'))}", published=False
            )
        h = hashlib.sha256()
        sink = Sink(url, part[: -len(".part")], size, progress, events)
        fd = open_part(part, False)
        try:
            done = 0
            while done < size:
                data = loader.load(done, min(chunk, size - done))
                if not len(data):
                    raise StorageError(f"{url}: short read at offset {done}")
                h.update(data)
                with _local_writes(part, url):
                    pwrite_all(fd, memoryview(data), done)
                done += len(data)
                sink.add("store", len(data))
            with _local_writes(part, url):
                sync_file(fd)
        finally:
            os.close(fd)
        loader.check_unchanged()
    finally:
        loader.close()
    got = "sha256:" + h.hexdigest()
    if got != field.get("sha256"):
        raise IntegrityError(
            f"{url}: downloaded bytes have {got}, {named(field, field.get('sha256'))}",
            published=False,
        )
    return h.hexdigest()


@contextlib.contextmanager
def _local_writes(part: str, url: str) -> Iterator[None]:
    """A failure of the local file system while a whole download fills ``part`` (a full
    disk, an I/O error) as a :class:`~ptestore.errors.StorageError` naming the ``.part``
    and its ``errno``, never a raw ``OSError`` (a whole download starts again: it does
    not resume)."""
    from .._oserror import local_error
    from ..errors import PteStoreError

    try:
        yield
    except PteStoreError:
        raise
    except OSError as exc:
        raise local_error(
            exc,
            f"{part}: the download of {url} stopped: {_reason(exc)}; a fetch run again "
            "downloads it again",
        ) from exc


def _reason(exc: OSError) -> str:
    """The system's text for ``exc`` and its ``errno``'s name: ``"No space left on
    device (ENOSPC)"``."""
    import errno

    return f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, str(exc.errno))})"


def download_delta(
    field: dict[str, Any],
    dest: str,
    chunks: ChunkDigests,
    options: dict[str, Any],
    bases: Sequence[str],
    request_size: int,
    progress: Callable[[str, int, int], None] | None = None,
    events: Callable[[Any], None] | None = None,
) -> str:
    """Download the index's packed-weight file ``field`` into ``dest + ".part"``, each
    chunk checked against ``chunks`` (:func:`recorded_chunks`), those the ``bases``
    hold at the same offsets taken from them; returns its whole-file SHA-256 (hex),
    hashed from the file assembled and checked against the index's (an
    :class:`IntegrityError` naming both otherwise: the ``.part`` is not resumed from)."""
    from .chunked import Sink, download_chunks
    from .delta import open_bases
    from .ranged import pinned_attempts

    url = str(field["url"])

    def run(loader: Any, reader: Any, state: dict[str, Any]) -> dict[str, Any]:
        size = int(state["size"])
        if size != chunks.length:
            raise IntegrityError(
                f"{url}: {size} bytes, {named(field, chunks.length)}", published=False
            )
        opened = open_bases(list(bases), required=False)
        try:
            return download_chunks(
                url=url,
                dest=dest,
                size=size,
                state={**state, "chunks": {"size": chunks.chunk_size, "root": chunks.root}},
                chunks=chunks,
                trailer_bytes=b"",
                tail=(size, b""),
                reader=reader,
                bases=opened,
                request_size=request_size,
                sink=Sink(url, dest, size, progress, events),
                record_name=f"its chunk record (beside it, pinned by the index's "
                f"chunks_root {chunks.digest})",
                layouts=PackedLayouts(),
            )
        finally:
            for b in opened:
                b.close()

    got = pinned_attempts(url, options, dest, run)
    log.info(
        "%s: %d of %d bytes from the store, %d from %d earlier packed-weight file(s)",
        url,
        got["received"],
        chunks.length,
        got["from_base"],
        len(got["bases"]),
    )
    return _whole_digest(field, dest + ".part", chunks)


def _whole_digest(field: dict[str, Any], part: str, chunks: ChunkDigests) -> str:
    """The SHA-256 (hex) of the assembled ``part``, refused unless it is the index's
    ``sha256`` of ``field`` (every chunk matched the record ``chunks_root`` pins, so a
    mismatch is an index whose two digests name different files)."""
    from .._oserror import local_error
    from ..xnnpack.identity import file_sha256

    url = str(field["url"])
    try:
        got = file_sha256(part)
    except OSError as exc:
        raise local_error(
            exc, f"{part}: the download of {url} could not be read back to hash it: {_reason(exc)}"
        ) from exc
    if "sha256:" + got != field.get("sha256"):
        raise IntegrityError(
            f"{url}: the file assembled from its chunks has sha256:{got}, "
            f"{named(field, field.get('sha256'))} (its chunks match the chunks_root "
            f"{chunks.digest} pins: the two digests name different files)",
            published=False,
        )
    return got
