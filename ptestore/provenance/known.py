"""What a process already knows of an object's bytes: the chunk digests (and per-chunk
CRCs) of a source, so that its digest and every output made from it cost what changed.

:func:`describe_content` gives the digest of a whole object (``sha256-tree:``, the root
of its chunk digests, :mod:`.chunks`). It reads only the chunks nothing names yet:

- a source that ends with a provenance trailer names the digests of the bytes before
  it. Trusted without reading those bytes: the trailer's checksum held when it was read,
  its record is version 2 or 3 and names exactly the bytes before the trailer (its
  content size is where the trailer starts), and the loader checks the object did not
  change during the run (``check_unchanged``). A byte damaged in the source since its
  record was made is then not caught by the run: its new record carries the digest of
  the byte as it was, so ``verify`` of the output reports that chunk. Only the chunks
  that hold the trailer are read;
- an object version this process has described already (same URL and ETag, or, for a
  local file, the same size, modification and change times and inode) is not read again: a fleet
  worker making one source for many devices reads it once.

:func:`known_chunks` then gives a run the digests and CRCs of a source's chunks, so the
output's digest reads only the chunks that differ
(:func:`~ptestore.coordinator.digest.planned_digest`, in place's final digest).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..errors import FormatError
from ..storage.types import loader_url, url_identity
from .chunks import Known

if TYPE_CHECKING:
    from ..storage.types import DataLoader
    from .record import ContentDigest

__all__ = ["Known", "describe_content", "forget", "known_chunks", "remember", "version_key"]

#: Object versions remembered per process (a digest of 1 GiB is 256 chunks: ~20 KB).
_MAX_ENTRIES = 256


_KNOWN: OrderedDict[tuple[Any, ...], Known] = OrderedDict()
_LOCK = threading.Lock()


def _object(loader: DataLoader) -> DataLoader:
    """The loader of the whole object (under a view that hides its trailer)."""
    from .trailer import ContentView

    while isinstance(loader, ContentView):
        loader = loader.inner
    return loader


def _innermost(loader: DataLoader) -> DataLoader:
    """The loader under every wrapper (a view without the trailer, a counting one)."""
    for _ in range(8):
        inner = getattr(loader, "inner", None)
        if inner is None or not hasattr(inner, "load"):
            break
        loader = inner
    return loader


def version_key(loader: DataLoader) -> tuple[Any, ...] | None:
    """What pins the bytes of the object behind ``loader``: its URL (without credentials:
    :func:`~ptestore.storage.types.url_identity` of the URL read, never the name shown,
    which two objects may share), size and ETag, or
    (a local file) its size, modification and change times, inode and device; None when
    nothing does."""
    obj = _innermost(loader)
    etag = getattr(obj, "etag", None)
    if isinstance(etag, str):
        return (url_identity(loader_url(obj)), obj.size(), "etag", etag)
    from ..storage.loaders import LocalFileLoader

    path = getattr(obj, "path", None)
    if isinstance(path, str) and isinstance(obj, LocalFileLoader):
        try:
            st = os.stat(path)
        except OSError:
            return None
        # ctime too: a rewrite that keeps the size and sets the mtime back changes it
        return (
            loader_url(obj),
            st.st_size,
            "stat",
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
            st.st_dev,
        )
    return None


def _remember(key: tuple[Any, ...], known: Known) -> None:
    with _LOCK:
        _KNOWN[key] = known
        _KNOWN.move_to_end(key)
        while len(_KNOWN) > _MAX_ENTRIES:
            _KNOWN.popitem(last=False)


def remember(loader: DataLoader, known: Known) -> None:
    """Remember ``known`` for the object version behind ``loader`` (described elsewhere:
    a fleet planner)."""
    key = version_key(loader)
    if key is not None and key[1] == known.chunks.length:
        _remember(key, known)


def forget(loader: DataLoader | None = None) -> None:
    """Forget the object version behind ``loader`` (a file rewritten in place), or
    every one (None)."""
    key = None if loader is None else version_key(loader)
    with _LOCK:
        if loader is None:
            _KNOWN.clear()
        else:
            for k in [k for k in _KNOWN if key is None or k[0] == key[0]]:
                del _KNOWN[k]


def _from_trailer(loader: DataLoader) -> tuple[ContentDigest, int] | None:
    """The content digest the object's own trailer records, and where the trailer
    starts; None without a usable one."""
    from .record import Provenance
    from .trailer import ContentView, read_trailer

    trailer = loader.trailer if isinstance(loader, ContentView) else None
    if trailer is None:
        try:
            trailer = read_trailer(_object(loader))
        except FormatError:
            return None
    if trailer is None:
        return None
    try:
        content = Provenance.of_trailer(trailer, loader.name).content
    except FormatError:
        return None  # damaged, or claims other bytes than precede it: described instead
    if content is None or content.chunks is None:
        return None
    return content, trailer.content_size


def _crc_rows(content: ContentDigest, indices: Any) -> dict[int, dict[str, int]]:
    from .crcs import known_crcs

    return known_crcs(content.crcs, indices)


def describe_content(
    loader: DataLoader,
    size: int | None = None,
    *,
    cancelled: threading.Event | None = None,
    trust_trailer: bool = True,
) -> Known:
    """The chunk digests (their root, ``.chunks.digest``, names the bytes) and per-chunk
    CRCs of the first ``size`` bytes (all by default) of the object behind ``loader``,
    reading only what neither its trailer nor this process already knows; remembered
    for the object's version. ``trust_trailer=False``: every byte is read and hashed,
    neither the object's own trailer nor what this process described before is taken
    (``verify --source``: the digest of exactly these bytes)."""
    from .chunks import chunk_size_for, reusable
    from .crcs import LOCAL_CRCS, STORE_CRCS
    from .digest import ContentHasher

    size = loader.size() if size is None else size
    key = version_key(loader)
    if key is not None and trust_trailer:
        with _LOCK:
            hit = _KNOWN.get(key)
        if hit is not None and hit.chunks.length == size:
            return hit
    known: dict[int, bytes] = {}
    known_crcs: dict[int, dict[str, int]] = {}
    algorithms: tuple[str, ...] = LOCAL_CRCS
    # An object of one chunk: that chunk holds the trailer, nothing to take from it
    got = _from_trailer(loader) if trust_trailer and size > chunk_size_for(size) else None
    if got is not None:
        content, end = got
        assert content.chunks is not None
        known = reusable(content.chunks, size, [(0, min(end, size))])
        known_crcs = _crc_rows(content, known)
        recorded = tuple(content.crcs.chunks) if content.crcs is not None else ()
        algorithms = recorded or LOCAL_CRCS
    elif getattr(_object(loader), "etag", None) is not None:
        algorithms = STORE_CRCS  # a remote source: its outputs go to a store that keeps them
    h = ContentHasher(size, known, algorithms, known_crcs=known_crcs)
    h.read(loader, 0, size, cancelled)
    digest = h.digest()
    assert digest.chunks is not None
    rows: dict[int, dict[str, int]] = {}
    if digest.crcs is not None:
        for a, values in digest.crcs.chunks.items():
            for i, v in enumerate(values):
                rows.setdefault(i, {})[a] = v
    described = Known(digest.chunks, rows)
    if key is not None:
        _remember(key, described)
    return described


def known_chunks(loader: DataLoader) -> Known | None:
    """The chunk digests and CRCs known for the source behind ``loader`` (a view
    without its trailer included): what its own trailer records, else what this
    process described of its object version; None when nothing is known."""
    got = _from_trailer(loader)  # first: it names the content's last (short) chunk too
    if got is not None:
        content, _ = got
        assert content.chunks is not None
        return Known(content.chunks, _crc_rows(content, range(len(content.chunks.digests))))
    key = version_key(loader)
    if key is None:
        return None
    with _LOCK:
        return _KNOWN.get(key)
