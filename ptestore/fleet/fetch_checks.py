"""What :mod:`.fetch` checks before its first request, and how its errors name what an
entry says.

- the storage options (:func:`check_options`), before anything is read: an index's
  against the index (a local one's, once read, against the files it names:
  :func:`check_chosen_options`), a URL's fetched directly against it;
- ``DEST`` (:func:`check_dest`): a local path, not a directory (nor the ``.ptd`` path
  beside it, :func:`check_paths`): the download is renamed over it once checked, and a
  directory there would fail only then, after the ``.ptd`` was published;
- the bases (:func:`base_paths`, :func:`check_bases`): local files, each a regular file
  that exists, opened without waiting (a FIFO is refused, never read), before the
  index or the artifact is read;
- an artifact's entries in an index pin its trailer (:func:`check_pinned`), and an
  index entry's fields (:func:`check_entry`), and its size against the object's
  when the destination has no room for what it names (:func:`check_room_for`): an
  entry naming the wrong size is an :class:`EntryMismatch`, not a full disk;
- the destination's directory made and ``DEST.part.lock`` taken (:func:`dest_lock`):
  a failure there a :class:`~ptestore.errors.StorageError` naming the path.

Once every file is downloaded, before any is published: the pair's binding
(:func:`check_pair`).

An entry comes from an index, or, for a URL fetched directly, from what fetch read of
the object's trailer first (``want["named_by"]``: ``"trailer"``; ``"record"`` for a
``.ptd`` stored by content, which the ``.pte``'s record names): :func:`named` says which
in an error.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from .._oserror import local_error
from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    PteStoreError,
    StorageError,
)
from ..provenance.chunks import well_formed
from ..storage.loaders import LocalFileLoader
from ..storage.types import absolute_path, file_path, strerror
from .download import check_space, refuse_link

__all__ = [
    "EntryMismatch",
    "base_paths",
    "check_bases",
    "check_chosen_options",
    "check_dest",
    "check_entry",
    "check_options",
    "check_pair",
    "check_paths",
    "check_pinned",
    "check_room_for",
    "dest_lock",
    "named",
    "open_base",
]


class EntryMismatch(IntegrityError):
    """The object is not the one its entry names (its size, its trailer's checksum),
    found before any of its content is trusted: an index wrong or out of date, or a URL
    fetched directly whose object was replaced after fetch read its trailer (then
    :func:`.fetch.fetch` reads it again and starts over, once)."""


def named(want: dict[str, Any], value: object) -> str:
    """What the entry ``want`` says of a field (``value``), as an error shows it: ``the
    index names V``; for a URL fetched directly, what its trailer said when fetch read it
    first (the object replaced since), or what the ``.pte``'s record names, or (a
    packed-weight file of an artifact fetched by URL) the XNNPACK record beside it."""
    by = want.get("named_by")
    if by == "trailer":
        return f"it was {value} when fetch first read its trailer (the object was replaced since)"
    if by == "record":
        return f"the .pte's record names {value}"
    if by == "xnnpack record":
        return f"the XNNPACK record beside {want.get('named_in')} names {value}"
    return f"the index names {value}"


def check_dest(given: str) -> str:
    """The local path ``DEST`` (``given``) names: refused when it is a URL, ends in
    ``/`` or ``.ptd``, or is a directory."""
    target = file_path(given)  # file:///x/m.pte is /x/m.pte from here on
    if target is None:
        raise ConfigurationError(f"{given}: fetch writes to local disk, not to a URL")
    if target.endswith("/"):
        raise ConfigurationError(f"{given}: names a directory (it ends in '/'), not a file")
    if target.endswith(".ptd"):
        raise ConfigurationError(
            f"{given}: fetch writes the .pte to DEST (its .ptd, when it has one, beside "
            "it): a DEST ending in .ptd would name the .pte as external weights; give the "
            ".pte's path"
        )
    check_paths([target], target)
    return target


def check_paths(paths: Sequence[str], target: str) -> None:
    """None of ``paths`` (the files a fetch into ``target`` publishes) is a directory:
    the checked download would be renamed over it and fail only then."""
    for path in paths:
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            continue  # nothing there (or nothing to say yet: the download names it)
        if is_dir and path == target:
            raise ConfigurationError(
                f"{path}: is a directory; DEST is the path of the .pte fetch writes (its "
                ".ptd beside it), not a directory to put it in; nothing was downloaded"
            )
        if is_dir:
            raise ConfigurationError(
                f"{path}: is a directory; fetch publishes the .ptd of {target} there: "
                "remove it or give another DEST; nothing was downloaded"
            )


def base_paths(given: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The local paths of the bases ``given`` (a ``file://`` URL is its path); a base
    on a store is refused: fetch takes chunks from local files only."""
    out = []
    for b in given:
        path = file_path(b)
        if path is None:
            raise ConfigurationError(
                f"{os.fspath(b)}: a base must be a local file (fetch takes the chunks it "
                "holds from local disk), not a URL (--base)"
            )
        out.append(path)
    return out


def open_base(path: str) -> LocalFileLoader:
    """The loader of the base at ``path``: a :class:`ConfigurationError` naming it when
    there is no such file, or when it is not a regular file ptestore reads (a directory;
    a FIFO, opened without waiting for a writer, then refused)."""
    try:
        return LocalFileLoader(path)
    except FileNotFoundError as exc:
        raise ConfigurationError(f"{path}: no such base file (--base)") from exc
    except (PteStoreError, OSError) as exc:
        raise ConfigurationError(f"{path}: cannot be used as a base: {exc}") from exc


def check_bases(paths: Sequence[str]) -> None:
    """Every base the user named can be used (:func:`open_base`), before the first
    request: a wrong one is not found only after the ``.ptd`` was downloaded."""
    for path in paths:
        open_base(path).close()


def check_options(src: str, target: str, bases: Sequence[str], options: Mapping[str, Any]) -> None:
    """Refuse a storage option that applies to none of the URLs a fetch is given (the
    one check, :meth:`~ptestore.storage.routing.StorageOptions.check`), before the first
    read: with an index (``src`` a ``.json``) the index, as it is read (options for a
    local one alone wait for the files it names: :func:`check_chosen_options`); else
    the URL fetched, ``DEST`` and the bases (options for local files only refused)."""
    if not options:
        return
    if src.endswith(".json"):
        from .index_store import check_index_options

        check_index_options(options, src, given=[target, *bases], local_ok=True)
    else:
        from ..storage.routing import StorageOptions

        StorageOptions(options).check([src, *bases], [target])


def check_chosen_options(src: str, files: Sequence[object], options: Mapping[str, Any]) -> None:
    """Once the local index ``src`` is read: refuse a storage option that applies to
    none of the remote ``files`` chosen there to fetch (their entries; None: no such
    file) (:func:`.index_store.check_named_options`; unused when they are all local)."""
    from .index_store import check_named_options

    urls = [str(f["url"]) for f in files if isinstance(f, dict) and f.get("url")]
    check_named_options(options, src, urls)


def check_pinned(index: str, kind: str, entry: str, pte: object, ptd: object) -> None:
    """The files ``pte`` and ``ptd`` of the ``entry`` (``model/device``) of ``index``
    that ``select`` chose (``kind``: ``"artifact"``; the portable source pins no
    trailer) name their trailer's checksum (``trailer_sha256``; null: a file without a
    trailer, a shared ``.ptd``), else :class:`~ptestore.errors.FormatError` naming the
    index, the entry and the field: an entry without the field was downloaded as a file
    without a trailer, whose whole bytes never have the content's digest ("downloaded
    bytes have ..."), exit 1, and fetching it again never helped."""
    if kind != "artifact":
        return
    for role, rec in (("pte", pte), ("ptd", ptd)):
        if isinstance(rec, dict) and "trailer_sha256" not in rec:
            raise FormatError(
                index,
                f"entry {entry} {role}.trailer_sha256",
                None,
                "present: null (a file without a trailer) or 'sha256:' and 64 lowercase hex",
                "the entry has none: its download was checked as a file without a trailer "
                "and said to be damaged",
            )


def check_entry(want: dict[str, Any]) -> None:
    """An index file entry (its object and ``url`` checked by :func:`.select.select`;
    what a direct URL's trailer gives) has the fields fetch relies on, in their form,
    before the first request: a malformed one is a
    :class:`~ptestore.errors.FormatError` naming the object and the field, never a
    download checked against it afterwards."""
    url = want["url"]
    size = want.get("size")
    if "size" in want and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise FormatError(url, "index entry size", size, "a byte count >= 0")
    sha = want.get("sha256")
    if not well_formed(sha):
        raise FormatError(
            url, "index entry sha256", sha, "'sha256-tree:' or 'sha256:' and 64 lowercase hex"
        )
    trailer = want.get("trailer_sha256")
    if trailer is not None and not well_formed(trailer, ("sha256",)):
        raise FormatError(
            url, "index entry trailer_sha256", trailer, "null or 'sha256:' and 64 lowercase hex"
        )


def check_room_for(
    files: Sequence[tuple[dict[str, Any], str]],
    bases: Mapping[str, Sequence[str]],
    options: dict[str, Any],
) -> None:
    """:func:`.download.check_space`; when it finds no room, the sizes the entries name
    are compared with their objects' first (one size request each): an entry naming
    another size than its object's is an :class:`EntryMismatch` ("URL: the object is N
    bytes, the index names M"), never a full disk the offline fallback of ``ensure``
    would take for a local problem."""
    try:
        check_space(files, bases)
    except StorageError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        for want, _ in files:
            check_size(want, options)
        raise


def check_size(want: dict[str, Any], options: dict[str, Any]) -> None:
    """The object ``want`` names is the size it names (when it names one)."""
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader

    if "size" not in want:
        return
    url = str(want["url"])
    loader = open_loader(url, **options_for_loader(url, options))
    try:
        size = loader.size()
    finally:
        loader.close()
    if size != want["size"]:
        raise EntryMismatch(
            f"{url}: the object is {size} bytes, {named(want, want['size'])}", published=False
        )


@contextmanager
def dest_lock(target: str, others: Iterable[str] = ()) -> Iterator[None]:
    """``target``'s directory made and the fetch's ``DEST.part.lock`` held (one fetch
    into a destination at a time; :func:`ptestore.storage.flock.locked`, removed on the
    way out), then ``PATH.part.lock`` of every other file it writes (``others``: its
    ``.ptd``, which the fetch into ``/x/m`` and the one into ``/x/m.pte`` share; no two
    fetches wait for each other's: a ``.ptd`` beside a destination is never the
    destination of the fetch whose ``.ptd`` would be that destination); a directory that
    cannot be made or a lock that cannot be taken (a read-only directory, a file where a
    directory should be) is a :class:`~ptestore.errors.StorageError` naming the path,
    never a raw ``OSError``."""
    from ..storage.flock import locked

    directory = os.path.dirname(absolute_path(target))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        reason = "a file is there" if isinstance(exc, FileExistsError) else strerror(exc)
        raise local_error(
            exc, f"{target}: cannot make its directory {directory}: {reason}"
        ) from exc
    paths = [target, *sorted(set(others) - {target})]
    with ExitStack() as stack:
        for path in paths:
            lock = path + ".part.lock"
            refuse_link(lock)
            try:
                stack.enter_context(locked(lock, remove=True))
            except PteStoreError:
                raise
            except OSError as exc:
                raise local_error(
                    exc, f"{lock}: cannot lock the fetch into {target}: {strerror(exc)}"
                ) from exc
        yield


def check_pair(files: list[dict[str, Any]], target: str) -> None:
    """The .pte's record names its .ptd by SHA-256: the .ptd downloaded beside it must
    be that one, and a .pte whose record names none takes none (checked before either
    is published). The .pte is the file at ``target``, the .ptd the other (by role, not
    by how the names end). A .pte without a record (the portable source) is taken with
    the .ptd the index names."""
    from ..provenance import read_provenance

    pte = next(f for f in files if f["path"] == target)
    ptd = next((f for f in files if f["path"] != target), None)
    # A file already current (:mod:`.current`) is read where it is, not downloaded.
    loader = LocalFileLoader(pte["path"] + ("" if pte.get("current") else ".part"))
    try:
        prov = read_provenance(loader)
    except FormatError as exc:
        raise IntegrityError(f"{pte['url']}: {exc}", published=False) from exc
    finally:
        loader.close()
    named = None if prov is None or prov.ptd_output is None else prov.ptd_output
    if named is None:
        if prov is not None and ptd is not None:
            raise IntegrityError(
                f"{ptd['url']}: is not a .ptd {pte['url']} was made with: the .pte's record "
                "names no .ptd (it was made without one); not published",
                published=False,
            )
        return
    if ptd is None:
        raise IntegrityError(
            f"{pte['url']}: its record names a .ptd ({named.sha256}) and none was given",
            published=False,
        )
    if ptd["sha256"] != named.sha256:
        raise IntegrityError(
            f"{ptd['url']}: is not the .ptd {pte['url']} was made with: its bytes have "
            f"{ptd['sha256']}, the .pte's record names {named.sha256}",
            published=False,
        )
