"""What ``gc`` of a fleet's orphans (:mod:`.orphans`) asks of the store under its prefix:
the files there with their age and stamp, the server's clock, an object looked at again
and removed only if it is still the one listed (on S3 a conditional delete).

A remote store's requests go through one s3fs filesystem and client of the store's own,
made by :func:`~ptestore.storage.filesystems.open_filesystem` from the read side's
options (its session the process's shared one for the credentials' current state),
each request retried by the policy of the ``retry_*`` options alone; the store closes
the client when the collection ends (before, each collection's client was left to the
garbage collector).
"""

from __future__ import annotations

import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import PreconditionFailed, PteStoreError
from ..gc import utc
from ..storage.types import StorageURL
from .index import INDEX_NAME

if TYPE_CHECKING:
    from .._retry import RetryPolicy

__all__ = ["OrphanStore", "Stamp", "local_stamp"]

#: What tells an object from another stored at its URL since (:meth:`OrphanStore.stamp`).
Stamp = tuple[Any, ...]
T = TypeVar("T")


class OrphanStore:
    """The files under a local directory or an S3 prefix: list, age, remove. On S3 each
    request (the listing, a ``HEAD``, the server's clock, a delete) goes through the
    :class:`~ptestore._retry.RetryPolicy` of the ``retry_*`` options, the one retry
    layer, on a filesystem and client of the store's own
    (:func:`~ptestore.storage.filesystems.open_filesystem`), which :meth:`close` (or
    ``with``) closes."""

    def __init__(self, target: str, options: dict[str, Any]) -> None:
        self.url = StorageURL.of(target)
        self.options = options
        self.fs: Any = None
        self.retry: RetryPolicy | None = None
        self.odd: list[str] = []  # index names here not regular files (:meth:`files`)
        if not self.url.local:
            from ..storage.filesystems import open_filesystem
            from ..storage.routing import options_for_loader

            opts = options_for_loader(target, options)
            self.fs, _, self.retry = open_filesystem(self.url, opts, fresh=True)

    def close(self) -> None:
        """Close the client's connections (a remote store's); a second call does nothing."""
        if self.fs is not None:
            from ..storage.filesystems import close_filesystem

            fs, self.fs = self.fs, None
            close_filesystem(fs)

    def __enter__(self) -> OrphanStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, where: str, request: str, call: Callable[[], T]) -> T:
        """``call`` (one S3 request) retried by the policy when its failure is transient;
        a failure raised as :func:`~ptestore._retry.to_storage_error` maps it, naming
        ``where`` and ``request`` (``ObjectNotFound``, ``PreconditionFailed``: what the
        callers answer, as before)."""
        from .._retry import to_storage_error

        assert self.retry is not None
        try:
            return self.retry.call(call, what=f"{where}: {request}")
        except Exception as exc:
            raise to_storage_error(exc, where, request) from exc

    def root(self) -> str:
        """The prefix as a directory URL without its trailing separator."""
        if self.url.local:  # 'lnk/..' as the kernel resolves it, as the staging gc
            path = self.url.path  # absolute, never normalized (storage.types)
            if os.path.basename(path) == INDEX_NAME:
                path = os.path.dirname(path)
            return os.path.realpath(path)
        rest = self.url.path.rstrip("/")
        if rest.endswith("/" + INDEX_NAME):
            rest = rest[: -len(INDEX_NAME) - 1]
        return f"{self.url.protocol}://{rest}"

    def join(self, directory: str, name: str) -> str:
        return os.path.join(directory, name) if self.url.local else f"{directory}/{name}"

    def parent(self, directory: str) -> str | None:
        if self.url.local:
            up = os.path.dirname(directory)
            return None if up == directory else up
        scheme, _, rest = directory.partition("://")
        if "/" not in rest:
            return None  # the bucket
        return f"{scheme}://{posixpath.dirname(rest)}"

    def files(self, root: str) -> Iterator[tuple[str, float, int, Stamp]]:
        """``(url, modification time, size, stamp)`` of every file under ``root``; the
        stamp (:meth:`stamp`) tells a file replaced since from the one listed."""
        if self.url.local:
            for dirpath, dirs, names in os.walk(root):  # (an index name may be a directory)
                for name in names + [d for d in dirs if d == INDEX_NAME]:
                    full = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(full)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):  # a symlink is never one of ours
                        yield full, st.st_mtime, st.st_size, local_stamp(st)
                    elif name == INDEX_NAME:  # an index all the same: read, or refused
                        self.odd.append(full)
            return
        scheme = self.url.protocol
        prefix = root.partition("://")[2]
        try:  # the network, the credentials: one StorageError, exit 1
            found = self._request(
                root + "/", "ListObjectsV2", lambda: self.fs.find(prefix, detail=True)
            )
        except FileNotFoundError:  # ObjectNotFound: no bucket
            return
        for path, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            when = info.get("LastModified") or info.get("mtime")
            if isinstance(when, datetime):  # one without a zone is UTC, never local time
                when = utc(when)
            ts = when.timestamp() if hasattr(when, "timestamp") else float(when or 0.0)
            size = int(info.get("size") or 0)
            yield f"{scheme}://{path}", ts, size, (info.get("ETag"), int(ts), size)

    def stamp(self, url: str) -> Stamp | None:
        """What tells this object from another stored at ``url`` since (None: none is
        there): locally device, inode, size and ``mtime_ns`` (not following a link); on
        S3 the ETag, ``LastModified`` (whole seconds: what a listing and a ``HEAD`` both
        give) and size."""
        if self.url.local:
            try:
                st = os.lstat(url)
            except FileNotFoundError:
                return None
            return local_stamp(st) if stat.S_ISREG(st.st_mode) else ("not a file",)
        bucket, _, key = url.partition("://")[2].partition("/")
        try:
            head = self._request(
                url, "HeadObject", lambda: self.fs.call_s3("head_object", Bucket=bucket, Key=key)
            )
        except FileNotFoundError:  # ObjectNotFound
            return None
        when = utc(head["LastModified"])
        return (head.get("ETag"), int(when.timestamp()), int(head.get("ContentLength") or 0))

    def now(self, root: str) -> float:
        """The time to measure ages against: on S3 the server's (``LastModified`` is
        its clock), from the ``Date`` of a listing when it differs from ours by more
        than :data:`~ptestore.gc.CLOCK_SKEW_TOLERANCE`; locally ours."""
        client = time.time()
        if self.url.local:
            return client
        from datetime import timezone

        from ..gc import server_now

        bucket, _, prefix = root.partition("://")[2].partition("/")
        page = self._request(
            root + "/",
            "ListObjectsV2",
            lambda: self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1),
        )
        return server_now(page, datetime.fromtimestamp(client, timezone.utc)).timestamp()

    def remove(self, url: str, listed: Stamp) -> str:
        """Remove the object at ``url`` if it is still the one listed with stamp
        ``listed``; the action: ``"removed"``, ``"skipped: changed since listed"`` (a run
        stored a new object there meanwhile: never removed) or ``"skipped: already
        gone"``. On S3 the delete carries ``If-Match: <ETag>``: an object of other bytes
        stored between the check and the delete is refused by the service (412), and
        the object looked at again (SeaweedFS's 412 is also for a key not there). Found
        gone by a retry after an attempt whose answer was lost (it may have deleted it:
        :func:`~ptestore.writers.s3.publish.may_have_applied`): ``"removed"``."""
        now = self.stamp(url)
        if now is None:
            return "skipped: already gone"
        if now != listed:
            return "skipped: changed since listed"
        if self.url.local:
            try:
                os.unlink(url)
            except FileNotFoundError:
                return "skipped: already gone"
            return "removed"
        from ..writers.s3.publish import may_have_applied

        bucket, _, key = url.partition("://")[2].partition("/")
        cond = {} if listed[0] is None else {"IfMatch": listed[0]}
        lost: list[BaseException] = []  # attempts that may have deleted it, answer lost

        def delete() -> Any:
            try:
                return self.fs.call_s3("delete_object", Bucket=bucket, Key=key, **cond)
            except Exception as exc:
                if may_have_applied(exc):
                    lost.append(exc)
                raise

        try:
            self._request(url, "DeleteObject", delete)
        except PreconditionFailed:  # another object there, or (SeaweedFS) none at all
            try:
                if self.stamp(url) is not None:
                    return "skipped: changed since listed"
            except PteStoreError:  # cannot look: kept, as a refused delete leaves it
                return "skipped: changed since listed"
        except FileNotFoundError:  # ObjectNotFound
            pass
        else:
            return "removed"
        return "removed" if lost else "skipped: already gone"  # by our lost answer, or another


def local_stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
