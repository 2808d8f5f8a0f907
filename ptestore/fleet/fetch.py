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

The check: the size, and the SHA-256 the index names (for an artifact, of its bytes
before the provenance trailer, plus the trailer's own checksum; for a .ptd stored once
by content (:mod:`.shared`) and for the portable source, of the whole file); and the
pair's binding: a .pte whose record names its .ptd's SHA-256 is fetched only with that
.ptd. A download that was interrupted (killed, Ctrl-C, a network failure) resumes where
``DEST.part`` ends when the object is still the version it was pinned to, and the last
bytes of the ``.part`` are read again and compared first (a ``.part`` that does not end
where the object's bytes do restarts the download); the remaining bytes are ranged GETs
pinned to the ETag (``If-Match`` on S3), and an object that changed restarts the
download from the beginning. Every file is downloaded and checked before any is
published (a mismatch is an :class:`~ptestore.errors.IntegrityError` with
``published=False``); then the .ptd is published first, then the .pte: a failure between
the two is a :class:`~ptestore.errors.PartialPublish` naming the .ptd as published.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._io import pwrite_all
from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    ObjectNotFound,
    PartialPublish,
    StorageError,
)
from ..provenance.digest import content_digest
from ..provenance.trailer import read_trailer
from ..storage.atomic import put_bytes, rename, sync_file
from ..storage.loaders import DataLoader, LocalFileLoader, open_loader
from ..storage.routing import options_for_loader
from ..storage.types import StorageURL
from .download import open_part, pinned_version, read_state, refuse_link
from .job import ptd_beside
from .select import Choice, select
from .shared import SHARED_DIR

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile

__all__ = ["FetchResult", "fetch"]

_CHUNK = 8 << 20

Progress = Callable[[str, int, int], None]


@dataclass
class FetchResult:
    """What :func:`fetch` published: each ``(url, path, bytes downloaded, resumed
    from)`` and the selection that chose them."""

    choice: Choice | None
    files: list[dict[str, Any]] = field(default_factory=list)
    #: With ``xnnpack_cache=True``: the XNNPACK packed-weight file delivered beside the
    #: .pte (:func:`.packed.fetch_packed`: ``path`` None and ``reason`` when none).
    xnnpack: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "choice": None if self.choice is None else self.choice.to_dict(),
            "files": self.files,
        }
        if self.xnnpack is not None:
            out["xnnpack"] = self.xnnpack
        return out


class _Changed(Exception):
    """The object's ETag is not the one the download is pinned to."""


def _ranged(loader: DataLoader, etag: str | None) -> Callable[[int, int], bytes]:
    """A reader of ``size`` bytes at ``offset``, pinned to ``etag`` on S3."""
    fs: Any = getattr(loader, "fs", None)
    path = getattr(loader, "path", None)
    if etag and fs is not None and type(fs).__name__ == "S3FileSystem" and isinstance(path, str):
        import fsspec.asyn

        bucket, key, version = fs.split_path(path)

        async def get(offset: int, size: int) -> bytes:
            params: dict[str, Any] = {
                "Bucket": bucket,
                "Key": key,
                "Range": f"bytes={offset}-{offset + size - 1}",
                "IfMatch": etag,
            }
            if version:
                params["VersionId"] = version
            try:
                resp = await fs._call_s3("get_object", **params)
            except Exception as exc:
                text = str(exc)
                if "PreconditionFailed" in text or "412" in text:
                    raise _Changed(text) from exc
                raise
            body = resp["Body"]
            async with body:
                data: bytes = await body.read()
            return data

        def read(offset: int, size: int) -> bytes:
            data: bytes = fsspec.asyn.sync(fs.loop, get, offset, size)
            return data

        return read
    return lambda offset, size: bytes(loader.load(offset, size))


def _check(path: str, want: dict[str, Any]) -> str:
    """The downloaded ``path`` is what ``want`` (an index file entry) names; returns the
    SHA-256 of its content (before its trailer, when it has one)."""
    loader = LocalFileLoader(path)
    try:
        size = loader.size()
        if "size" in want and size != want["size"]:
            raise IntegrityError(
                f"{want['url']}: downloaded {size} bytes, the index names {want['size']}",
                published=False,
            )
        if want.get("trailer_sha256") is not None:
            trailer = read_trailer(loader)
            if trailer is None or "sha256:" + trailer.sha256 != want["trailer_sha256"]:
                have = None if trailer is None else "sha256:" + trailer.sha256
                raise IntegrityError(
                    f"{want['url']}: provenance trailer checksum {have}, the index names "
                    f"{want['trailer_sha256']}",
                    published=False,
                )
            got = content_digest(loader, trailer.content_size).sha256
        else:
            got = content_digest(loader, size).sha256
        if got != want["sha256"]:
            raise IntegrityError(
                f"{want['url']}: downloaded bytes have {got}, the index names {want['sha256']}",
                published=False,
            )
        return got
    except FormatError as exc:
        raise IntegrityError(f"{want['url']}: {exc}", published=False) from exc
    finally:
        loader.close()


#: Bytes at the end of a ``.part`` read again from the object and compared before a
#: download resumes: a ``.part`` that does not end where the object's bytes do (a byte
#: too many or too few, a torn last write) restarts instead of resuming.
_OVERLAP = 64 << 10


def _resume_point(fd: int, resumed: int, size: int, read: Callable[[int, int], bytes]) -> int:
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
    except _Changed:
        return 0
    return resumed if have == want else 0


def _download(
    want: dict[str, Any],
    dest: str,
    options: dict[str, Any],
    chunk_size: int,
    progress: Progress | None,
) -> dict[str, Any]:
    url = str(want["url"])
    part, meta_path = dest + ".part", dest + ".part.json"
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    for name in (part, meta_path):
        refuse_link(name)
    for _attempt in range(3):
        loader = open_loader(url, **options_for_loader(url, options))
        try:
            size = loader.size()
            etag = getattr(loader, "etag", None)
            state = {"url": url, "size": size, **pinned_version(url, loader)}
            on_disk = 0
            if read_state(meta_path) == state:
                try:
                    on_disk = os.lstat(part).st_size
                except FileNotFoundError:
                    on_disk = 0
            put_bytes(meta_path, json.dumps(state).encode())
            read = _ranged(loader, etag if isinstance(etag, str) else None)
            fd = open_part(part, on_disk > 0)
            try:
                resumed = _resume_point(fd, on_disk, size, read)
                os.ftruncate(fd, resumed)
                done = resumed
                while done < size:
                    n = min(chunk_size, size - done)
                    data = read(done, n)
                    if len(data) != n:
                        raise StorageError(f"{url}: short read at offset {done}")
                    pwrite_all(fd, memoryview(data), done)
                    done += n
                    if progress is not None:
                        progress(url, done, size)
                # Written in place and resumed; one fsync makes the finished download
                # durable before it is checked and renamed into place.
                sync_file(fd)
            except _Changed:
                os.unlink(part)  # the object changed: start again from the beginning
                continue
            finally:
                os.close(fd)
            if loader_changed(loader):
                os.unlink(part)
                continue
        finally:
            loader.close()
        try:
            digest = _check(part, want)
        except IntegrityError:
            os.unlink(part)
            os.unlink(meta_path)
            raise
        return {
            "url": url,
            "path": dest,
            "size": size,
            "resumed_from": resumed,
            "sha256": digest,
        }
    raise StorageError(f"{url}: the object changed during every one of 3 downloads")


def _publish(got: dict[str, Any]) -> None:
    """Publish a checked download: ``DEST.part`` (already durable) renamed over
    ``DEST``, the directory synced; then its resume marker removed."""
    dest = str(got["path"])
    rename(dest + ".part", dest)
    try:
        os.unlink(dest + ".part.json")
    except FileNotFoundError:
        pass


def _check_pair(files: list[dict[str, Any]]) -> None:
    """The .pte's record names its .ptd by SHA-256: the .ptd downloaded beside it must
    be that one (checked before either is published)."""
    from ..provenance import read_provenance

    pte = next(f for f in files if not f["path"].endswith(".ptd"))
    ptd = next((f for f in files if f["path"].endswith(".ptd")), None)
    loader = LocalFileLoader(pte["path"] + ".part")
    try:
        prov = read_provenance(loader)
    except FormatError as exc:
        raise IntegrityError(f"{pte['url']}: {exc}", published=False) from exc
    finally:
        loader.close()
    named = None if prov is None or prov.ptd_output is None else prov.ptd_output
    if named is None:
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


def _discard_parts(files: list[dict[str, Any]]) -> None:
    for f in files:
        for name in (f["path"] + ".part", f["path"] + ".part.json"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


def loader_changed(loader: DataLoader) -> bool:
    try:
        loader.check_unchanged()
    except StorageError:
        return True
    return False


def fetch(
    index_or_url: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    model: str | None = None,
    device: DeviceProfile | str | None = None,
    storage_options: dict[str, Any] | None = None,
    chunk_size: int = _CHUNK,
    progress: Progress | None = None,
    xnnpack_cache: bool = False,
) -> FetchResult:
    """Download what ``index_or_url`` selects for ``model`` on ``device`` (an index),
    or the artifact at ``index_or_url`` itself (a .pte: its .ptd beside it is fetched
    when its record names one), to ``dest`` (the .pte's path; a .ptd goes beside it).
    See the module docstring. ``xnnpack_cache``: then also its XNNPACK packed-weight
    file for this CPU and ExecuTorch build, when the fleet made one
    (:func:`.packed.fetch_packed`: verified, beside ``dest``)."""
    src = os.fspath(index_or_url)
    target = os.fspath(dest)
    if not StorageURL.of(target).local:
        raise ConfigurationError(f"{target}: fetch writes to local disk, not to a URL")
    if chunk_size < 1:
        raise ConfigurationError(f"chunk_size must be >= 1, got {chunk_size}")
    opts = dict(storage_options or {})
    choice: Choice | None = None
    if src.endswith(".json"):
        if model is None or device is None:
            raise ConfigurationError(f"{src}: fetching from an index needs --model and --device")
        choice = select(src, model, device, storage_options=opts)
        files = [(choice.pte, target)]
        if choice.ptd is not None:
            files.append((choice.ptd, ptd_beside(target)))
    else:
        files = [(_describe(src, opts), target)]
        ptd_want = _ptd_of(src, opts)
        if ptd_want is not None:
            files.append((ptd_want, ptd_beside(target)))
    result = FetchResult(choice)
    # Every file is downloaded and checked before any is published (a mismatch is an
    # IntegrityError with nothing published), the pair's binding too; then the .ptd,
    # then the .pte.
    for want, path in sorted(files, key=lambda f: not f[1].endswith(".ptd")):
        result.files.append(_download(want, path, opts, chunk_size, progress))
    try:
        _check_pair(result.files)
    except IntegrityError:
        _discard_parts(result.files)
        raise
    _publish_all(result.files)
    if xnnpack_cache:
        from .packed import fetch_packed

        offered = None if choice is None or choice.kind != "artifact" else choice.xnnpack
        result.xnnpack = fetch_packed(
            src, offered, result.files, opts, chunk_size, progress, indexed=choice is not None
        )
    return result


def _publish_all(files: list[dict[str, Any]]) -> None:
    """Publish the checked downloads, .ptd first; a failure after the .ptd says so."""
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


def _ptd_of(url: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """What the .ptd of the artifact at ``url`` must be, when its record names one:
    the one beside it, else the one stored by content above it (:mod:`.shared`)."""
    from ..provenance import read_provenance

    loader = open_loader(url, **options_for_loader(url, options))
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    if prov is None or prov.ptd_output is None:
        return None
    beside = ptd_beside(url)
    if _exists(beside, options):
        return _describe(beside, options)
    from .index import shared_entry
    from .shared import locate_shared

    found = locate_shared(url, prov.ptd_output.sha256, lambda u: _exists(u, options))
    if found is None:
        raise ObjectNotFound(
            f"{url}: its record names a .ptd ({prov.ptd_output.sha256}); there is none at "
            f"{beside}, nor in a {SHARED_DIR}/sha256/ directory above it"
        )
    return shared_entry(found, prov.ptd_output)


def _exists(url: str, options: dict[str, Any]) -> bool:
    try:
        open_loader(url, **options_for_loader(url, options)).close()
    except ObjectNotFound:
        return False
    return True


def _describe(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """What a direct artifact URL must be: its trailer names its bytes."""
    from .index import artifact_entry

    return artifact_entry(url, options)[0]
