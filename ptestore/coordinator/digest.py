"""The digest of an output before it is written (so its trailer and S3 metadata can
name the bytes they follow): the patched metadata, the copies and the zero padding in
destination order, read once from the sources and the spool."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..provenance.digest import ContentHasher
from ..storage.types import loader_url, url_identity
from .output import FileLayout, planned_copies

if TYPE_CHECKING:
    from ..provenance.pieces import Piece
    from ..provenance.record import ContentDigest
    from ..storage.types import DataLoader
    from .named import SourceFile
    from .run import Run

__all__ = ["planned_digest"]


#: Digests of outputs that reproduce their source, by the source object's version and
#: the CRCs recorded (``(name, ETag, size, whether the store keeps a checksum)``: a
#: record's CRCs follow its destination, never what ran before it in the process): a
#: fleet worker making one .ptd for many devices reads the source's bytes for it once,
#: not once per device. The oldest go past :data:`_MAX_IDENTITY` (a long-lived worker).
_IDENTITY: dict[tuple[str, str, int, bool], ContentDigest] = {}
_MAX_IDENTITY = 256
_LOCK = threading.Lock()


def planned_digest(
    run: Run, f: SourceFile, layout: FileLayout, cancelled: threading.Event | None = None
) -> ContentDigest:
    """The digest (chunk root), chunk digests and CRCs of the container
    :func:`~.output.write_file` will write, read from the sources and the spool (so it
    may run while the output is being written). ``cancelled``: stop between pieces
    once it is set."""
    from .output import is_identity

    etag = getattr(f.loader, "etag", None)
    if (
        isinstance(etag, str)
        and is_identity(f, layout)
        and not any(role == f.role for role, _ in run.replacements)
    ):
        # the object read (without credentials), not its shown name: two objects whose
        # URLs differ only in what is redacted are two entries
        where = url_identity(loader_url(f.loader))
        key = (where, etag, f.container.file_size, bool(f.writer.stored_checksum))
        with _LOCK:
            got = _IDENTITY.get(key)
            if got is None:
                got = _IDENTITY[key] = _digest(run, f, layout, cancelled)
                while len(_IDENTITY) > _MAX_IDENTITY:
                    del _IDENTITY[next(iter(_IDENTITY))]
        return got
    return _digest(run, f, layout, cancelled)


def _digest(
    run: Run, f: SourceFile, layout: FileLayout, cancelled: threading.Event | None
) -> ContentDigest:
    from ..provenance.chunks import reusable
    from ..provenance.crcs import LOCAL_CRCS, STORE_CRCS
    from ..provenance.known import known_chunks

    meta = bytes(layout.patched.metadata)
    copies = sorted(planned_copies(run, f, layout), key=lambda c: c.dst)
    end = layout.patched.file_size
    # Chunks copied unchanged to the same offsets from a source whose chunk digests are
    # known (its own trailer, or this process described it) keep their digests and,
    # where their CRCs are known too, are not read at all.
    source = known_chunks(f.loader)
    known: dict[int, bytes] = {}
    # (one chunk in all: it holds the new metadata, so nothing of it can be known)
    if source is not None and end > source.chunks.chunk_size:
        kept = [(x.dst, x.dst + x.size) for x in copies if x.source is f.loader and x.src == x.dst]
        if meta and len(meta) <= f.loader.size() and bytes(f.loader.load(0, len(meta))) == meta:
            kept.append((0, len(meta)))  # the metadata is the source's (a pass-through)
        known = reusable(source.chunks, end, _with_zero_gaps(f.loader, _merged(kept), end))
    known_crcs = {} if source is None else {i: source.crcs[i] for i in known if i in source.crcs}
    # An output whose store keeps a checksum (S3) records every CRC that checksum could
    # be (ptestore.provenance.crcs); a local one the per-chunk CRC-32 only.
    crcs = STORE_CRCS if f.writer.stored_checksum else LOCAL_CRCS
    h = ContentHasher(end, known, crcs, known_crcs=known_crcs)
    pieces: list[Piece] = [(meta, 0, len(meta))]
    cursor = len(meta)
    for x in copies:
        start = max(x.dst, cursor)
        if start > cursor:
            pieces.append((None, 0, start - cursor))
        skip = start - x.dst  # never expected: copies start after the metadata
        if x.size > skip:
            pieces.append((x.source, x.src + skip, x.size - skip))
        cursor = max(cursor, x.dst + x.size)
    if end > cursor:
        pieces.append((None, 0, end - cursor))
    h.feed_pieces(pieces, cancelled)
    return h.digest()


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges, sorted, those that touch or overlap joined (a chunk
    kept in two adjacent pieces is kept whole)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


#: Padding between kept pieces up to this size is compared with the source's bytes.
_GAP_MAX = 64 << 10


def _with_zero_gaps(
    loader: DataLoader, kept: list[tuple[int, int]], end: int
) -> list[tuple[int, int]]:
    """``kept`` with the small gaps between its pieces (the output writes zeros there:
    alignment padding) joined where the source holds zeros too, so a chunk that spans a
    segment boundary is still known."""
    if not kept:
        return kept
    size = loader.size()
    out = [kept[0]]
    for a, b in [*kept[1:], (end, end)]:
        gap_start = out[-1][1]
        gap = a - gap_start
        if 0 < gap <= _GAP_MAX and a <= size and not any(loader.load(gap_start, gap)):
            out[-1] = (out[-1][0], b)
        elif (a, b) != (end, end):
            out.append((a, b))
    return out
