"""``ptestore fetch``: download the artifact an index selects for a device (and its
.ptd) to local disk, verified before anything is published.

Each file is downloaded into ``DEST.part`` (its source URL, size and ETag beside it in
``DEST.part.json``), checked and only then published to ``DEST`` through the local
writer (atomic: nothing partial is ever visible at ``DEST``). The check: the size,
and the SHA-256 the index names (for an artifact, of its bytes before the provenance
trailer, plus the trailer's own checksum; for a .ptd stored once by content
(:mod:`.shared`) and for the portable source, of the whole file). A download that
was interrupted (killed, Ctrl-C, a network failure) resumes where ``DEST.part`` ends
when the object still has the ETag it had; the remaining bytes are ranged GETs pinned
to that ETag (``If-Match`` on S3), and an object that changed restarts the download
from the beginning. Every file is downloaded and checked before any is published
(a mismatch is an :class:`~ptestore.errors.IntegrityError` with ``published=False``);
then the .ptd is published first, then the .pte.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    ObjectNotFound,
    StorageError,
)
from ..provenance.digest import content_digest
from ..provenance.trailer import read_trailer
from ..storage.atomic import put_bytes, sync_file
from ..storage.loaders import DataLoader, LocalFileLoader, open_loader
from ..storage.routing import options_for_loader
from ..storage.types import StorageURL
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": None if self.choice is None else self.choice.to_dict(),
            "files": self.files,
        }


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


def _check(path: str, want: dict[str, Any]) -> None:
    """The downloaded ``path`` is what ``want`` (an index file entry) names."""
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
    except FormatError as exc:
        raise IntegrityError(f"{want['url']}: {exc}", published=False) from exc
    finally:
        loader.close()


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
    for _attempt in range(3):
        loader = open_loader(url, **options_for_loader(url, options))
        try:
            size = loader.size()
            etag = getattr(loader, "etag", None)
            state = {"url": url, "size": size, "etag": etag}
            resumed = 0
            try:
                with open(meta_path) as f:
                    if json.load(f) == state and os.path.exists(part):
                        resumed = min(os.path.getsize(part), size)
            except (OSError, ValueError):
                pass
            put_bytes(meta_path, json.dumps(state).encode())
            read = _ranged(loader, etag if isinstance(etag, str) else None)
            done = resumed
            try:
                with open(part, "r+b" if resumed else "wb") as out:
                    out.truncate(resumed)
                    out.seek(resumed)
                    while done < size:
                        n = min(chunk_size, size - done)
                        data = read(done, n)
                        if len(data) != n:
                            raise StorageError(f"{url}: short read at offset {done}")
                        out.write(data)
                        out.flush()
                        done += n
                        if progress is not None:
                            progress(url, done, size)
                    out.flush()
                    # Written in place and resumed, never renamed: one fsync makes the
                    # finished download durable before it is checked and published.
                    sync_file(out.fileno())
            except _Changed:
                os.unlink(part)  # the object changed: start again from the beginning
                continue
            if loader_changed(loader):
                os.unlink(part)
                continue
        finally:
            loader.close()
        try:
            _check(part, want)
        except IntegrityError:
            os.unlink(part)
            os.unlink(meta_path)
            raise
        return {"url": url, "path": dest, "size": size, "resumed_from": resumed}
    raise StorageError(f"{url}: the object changed during every one of 3 downloads")


def _publish(got: dict[str, Any]) -> None:
    """Publish a checked download (``DEST.part``) to ``DEST`` through the local writer."""
    from ..writers import open_writer

    dest = str(got["path"])
    part = dest + ".part"
    writer = open_writer(dest)
    src = LocalFileLoader(part)
    try:
        writer.copy_from(src, 0, int(got["size"]), 0)
        writer.publish("overwrite")
    finally:
        src.close()
        writer.discard()
    os.unlink(part)
    os.unlink(dest + ".part.json")


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
) -> FetchResult:
    """Download what ``index_or_url`` selects for ``model`` on ``device`` (an index),
    or the artifact at ``index_or_url`` itself (a .pte: its .ptd beside it is fetched
    when its record names one), to ``dest`` (the .pte's path; a .ptd goes beside it).
    See the module docstring."""
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
    # IntegrityError with nothing published); then the .ptd, then the .pte.
    for want, path in sorted(files, key=lambda f: not f[1].endswith(".ptd")):
        result.files.append(_download(want, path, opts, chunk_size, progress))
    for got in result.files:
        _publish(got)
    return result


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
