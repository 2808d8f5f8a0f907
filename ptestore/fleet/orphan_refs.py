"""What the indexes ``gc`` reads reference (:mod:`.orphans`): every live entry of an
index, read so that a part that is missing or malformed stops gc. Whatever an index names
that gc does not see, it removes: a reader that took a missing shard for "no entry", or
skipped an entry it could not make sense of, made gc remove the files of those entries.

- **an entry** that is not retired is held to what ``select`` holds it to
  (:func:`~.index_bounds.check_files`): its ``pte`` and ``source`` objects with a URL,
  its ``ptd`` and ``ptd_source`` the same or null, and its ``xnnpack`` an object (whose
  ``url`` is a URL or null) or null. Its ``.pte``, ``.ptd`` and packed-weight URLs are
  absolute (a relative one names a file under the directory of the run that wrote it),
  and its ``.pte`` is under the index's own directory (the run writes its index there;
  locally its path as written, so a device directory that is a symbolic link is):
  an index whose artifacts are elsewhere was moved, copied or mounted from another place
  and does not describe the files beside it, which it would leave unnamed, every one;
- **a version 3 index** (:mod:`.index_v3`), read as :mod:`.index_whole` reads one whole,
  strictly: its shard directory holds ``root.json`` (the copy of the root every writer
  leaves there: without it, the directory is gone or was never this root's); each
  model's catalog, read before its leaves, agrees with them (a catalog that lists live
  builds has a live entry in its leaves, and every device it lists has an entry in
  one); every split node has below it at least the two entries it split, and a half of
  it that does not exist has a split sibling. A leaf that does not exist reads as an
  empty one: these are what tell a lost one. They cannot tell a model's lost directory
  from a model never published, nor a lost leaf beside a split node, whose devices the
  catalog does not list, from an empty half: ``gc --job`` checks that every pair of the
  job has an entry (``pairs``, :func:`index_references`).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..coordinator.targets import target_identity
from ..errors import FormatError, ObjectNotFound
from ..storage.types import StorageURL, is_relative_local
from .index import INDEX_NAME, open_index
from .index_bounds import ENTRY_FILES, check_files
from .index_trie import ModelTrie
from .index_whole import model_nodes, model_segments
from .packed import record_url

if TYPE_CHECKING:
    from .index_v3 import ShardedIndex

__all__ = ["Identity", "index_references", "named", "referenced"]

#: A stored object as :func:`~ptestore.coordinator.targets.target_identity` names it.
Identity = tuple[str, str]

_ABSOLUTE = "an absolute path or URL (a relative one names a file under the directory of "
_ABSOLUTE += "the run that wrote it, unknown to gc)"


def referenced(index: dict[str, Any], source: str = "<index>") -> set[Identity]:
    """The identities of every file the live (not retired) entries of ``index`` (read
    from ``source``) name; :class:`FormatError` for an entry that does not say which
    (see :func:`named`)."""
    return named(index.get("entries", []), source)


def named(entries: Iterable[Any], source: str, base: str | None = None) -> set[Identity]:
    """The identities of every file the live entries of ``entries`` (read from the index
    ``source``, whose directory is ``base``: a URL ending with ``/``) name: its ``.pte``,
    ``.ptd``, source, ``.ptd`` source, packed-weight file and the record beside its
    ``.pte``. :class:`FormatError` for an entry that is not an object, a live one whose
    files are not named as ``select`` reads them, a relative ``.pte``/``.ptd``/
    packed-weight URL, or (with ``base``) a ``.pte`` outside ``base``."""
    out: set[Identity] = set()
    home = None if base is None else target_identity(base)
    resolved: dict[str, str] = {}  # a local ancestor as written -> as the kernel resolves it
    for e in entries:
        if not isinstance(e, dict):
            raise FormatError(source, "index entry", e, "an object")
        if e.get("retired"):
            continue
        name = f"entry {e.get('model')}/{e.get('device')}"
        check_files(e, source, name, ENTRY_FILES)
        packed = e.get("xnnpack")
        if packed is not None and not isinstance(packed, dict):
            raise FormatError(source, f"{name} xnnpack", packed, "an object or null")
        urls = {role: e[role]["url"] for role in ENTRY_FILES if e.get(role) is not None}
        if packed is not None:
            url = packed.get("url")
            if url is not None and (not isinstance(url, str) or not url):
                raise FormatError(source, f"{name} xnnpack.url", url, "a URL or path, or null")
            if url is not None:
                urls["xnnpack"] = url
        for role in ("pte", "ptd", "xnnpack"):
            if role in urls and is_relative_local(urls[role]):
                raise FormatError(source, f"{name} {role}.url", urls[role], _ABSOLUTE)
        pte = target_identity(urls["pte"])
        if home is not None and not _under(urls["pte"], pte, home, resolved):
            raise FormatError(
                source,
                f"{name} pte.url",
                urls["pte"],
                f"a file under {base} (the index's own directory)",
                "an index naming its artifacts elsewhere was moved, copied or mounted from "
                "another place: it does not describe the files beside it, and gc would "
                "remove every one",
            )
        out.update(target_identity(u) for u in urls.values())
        if packed is not None:
            out.add(target_identity(record_url(urls["pte"])))  # the record beside the .pte
    return out


def _under(url: str, ident: Identity, directory: Identity, resolved: dict[str, str]) -> bool:
    """Whether the object at ``url`` (``ident``) lies under ``directory`` (an identity:
    locally a real path). Locally by its path as written: one of its ancestors is the
    directory as the kernel resolves it, and no ``..`` follows that ancestor. A
    directory below it may be a symbolic link (``out/d1 -> /disk2/d1``: the run wrote
    its files through it, and gc never lists below a link); a tree moved or copied
    elsewhere names none of its ancestors. ``resolved`` caches the ancestors."""
    top = directory[1].rstrip("/")
    if ident[0] != directory[0]:
        return False
    u = StorageURL.of(url)
    if not u.local:
        return ident[1].startswith(top + "/")
    path = u.path
    up = os.path.dirname(path)
    while True:
        if ".." not in path[len(up) :].split(os.sep):
            real = resolved.get(up)
            if real is None:
                real = resolved[up] = os.path.realpath(up)
            if real == (top or os.sep):
                return True
        parent = os.path.dirname(up)
        if parent == up:
            return False
        up = parent


def index_references(
    url: str, options: dict[str, Any], pairs: set[tuple[str, str]] | None = None
) -> set[Identity] | None:
    """The identities the live entries of the index at ``url`` name (None: there is no
    index there), read whole (module docstring); a :class:`PteStoreError` when it cannot
    be. ``pairs``, when given, gets the ``(model, device)`` of every entry, retired ones
    included."""
    try:
        root, sharded, _ = open_index(url, options, whole=True)
    except ObjectNotFound:
        return None
    base = url[: -len(INDEX_NAME)]
    entries = root["entries"] if sharded is None else _sharded_entries(sharded, url)
    return named(entries if pairs is None else _noting(entries, pairs), url, base)


def _noting(entries: Iterable[Any], pairs: set[tuple[str, str]]) -> Iterator[Any]:
    for e in entries:
        if isinstance(e, dict):
            pairs.add((str(e.get("model")), str(e.get("device"))))
        yield e


def _sharded_entries(index: ShardedIndex, url: str) -> Iterator[dict[str, Any]]:
    """Every entry of the version 3 ``index`` (at ``url``), model by model, checked
    (:mod:`.index_whole`, strictly: gc removes what no entry it read names)."""
    segments = model_segments(index, strict=True)

    def one(segment: str) -> list[dict[str, Any]]:
        trie = ModelTrie(index.store, f"{index.directory}/m/{segment}", "", index.leaf_bytes)
        nodes = model_nodes(index, trie, strict=True)
        held = {d: e for node in nodes for d, e in node.entries.items()}
        return [held[d] for d in sorted(held)]

    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        for start in range(0, len(segments), 16):
            for entries in pool.map(one, segments[start : start + 16]):
                yield from entries
