"""The listings and removals of a fleet index's store (:class:`~.index_store.IndexStore`
asks them): the entries directly under a directory, and a directory's tree removed.

A remote store's are made through a filesystem made by
:func:`~ptestore.storage.filesystems.open_filesystem` from the read side's options
(memory://: its ``retry_*`` alone), s3fs's and botocore's retries off, each request
retried by the policy of the ``retry_*`` options. On S3 it is the process's shared one
for those options and the credentials' current state
(:func:`~ptestore.storage.filesystems.s3_filesystem`: at most 8 kept, never fsspec's
unbounded instance cache), held for each listing or removal: a credentials file
rewritten by a sidecar, or an ``AWS_*`` variable changed, gives the next listing a
client that reads them (one made once per store kept the key it first read for the
store's life), and stores with equal options share one client. Before that, each listing made a
filesystem of its own: an S3 client (about 0.1 s, most of a listing's time), an aiohttp
session and, where the server keeps connections alive, a socket, none closed until the
garbage collector's next pass found the filesystem. Its cached listings are dropped
before each listing: a listing sees what is stored now. memory://'s filesystem is the
store's own, made on its first listing (in this process).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from ..storage.types import StorageURL

if TYPE_CHECKING:
    from .._retry import RetryPolicy

__all__ = ["StoreListing"]


class StoreListing:
    """Listings and removals under the directories of one store (``protocol``, its
    read side's ``options``)."""

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        self.protocol = protocol
        self.options = options
        #: ``(process id, filesystem, policy)`` once the first remote listing made them.
        self._made: tuple[int, Any, RetryPolicy] | None = None
        self._lock = threading.Lock()

    def names(self, url: str, prefix: str = "") -> list[str]:
        """The names of the entries (files and directories) directly under the
        directory ``url`` that begin with ``prefix`` (none when it does not exist; on S3
        the listing asks for that prefix alone). A remote listing is retried by the
        policy of the ``retry_*`` options alone; its failure is a
        :class:`~ptestore.errors.StorageError` naming the directory and the request."""
        u = StorageURL.of(url)
        if u.local:
            try:
                return sorted(n for n in os.listdir(u.path or ".") if n.startswith(prefix))
            except FileNotFoundError:
                return []
        from .._retry import to_storage_error
        from ..errors import ObjectNotFound
        from ..storage.filesystems import close_filesystem

        fs, path, retry = self.filesystem(url)
        path = path.rstrip("/")
        request = "ListObjectsV2" if self.protocol == "s3" else "list"

        def listing() -> list[Any]:
            fs.invalidate_cache()  # what is stored now, never a listing kept from before
            if prefix and self.protocol == "s3":
                return list(fs.find(path, maxdepth=1, withdirs=True, prefix=prefix))
            return list(fs.ls(path, detail=False))

        where = f"{url.rstrip('/')}/"
        try:
            found = retry.call(listing, what=f"{where}: {request}")
        except Exception as exc:
            error = to_storage_error(exc, where, request)
            if isinstance(error, ObjectNotFound):
                return []
            raise error from exc
        finally:
            close_filesystem(fs)  # S3: the shared one released (memory://: kept)
        names = {str(p).rstrip("/").rsplit("/", 1)[-1] for p in found}
        return sorted(n for n in names if n.startswith(prefix))

    def remove_tree(self, url: str) -> None:
        """Remove everything under the directory ``url`` (best effort, after the policy's
        attempts: a migration that lost leaves its private copy behind when this fails)."""
        u = StorageURL.of(url)
        try:
            if u.local:
                import shutil

                shutil.rmtree(u.path, ignore_errors=True)
                return
            from ..storage.filesystems import close_filesystem

            fs, path, retry = self.filesystem(url)

            def remove() -> None:
                try:
                    fs.rm(path.rstrip("/"), recursive=True)
                except FileNotFoundError:  # nothing (left) there: a retry's lost answer
                    pass

            request = "DeleteObjects" if self.protocol == "s3" else "remove"
            try:
                retry.call(remove, what=f"{url.rstrip('/')}/: {request}")
            finally:
                close_filesystem(fs)
        except Exception:  # best effort: what is left is never read
            return

    def filesystem(self, url: str) -> tuple[Any, str, RetryPolicy]:
        """``(filesystem, path of url, RetryPolicy)`` of the remote ``url``: on S3 the
        process's shared filesystem for the store's options and the credentials' state
        now, held until :func:`~ptestore.storage.filesystems.close_filesystem`;
        memory://'s the store's own, made by the first call (in this process)."""
        from ..storage.filesystems import open_filesystem

        u = StorageURL.of(url)
        if self.protocol == "s3":
            opts = {**self.options, "skip_instance_cache": False}
            return open_filesystem(u, opts)
        made = self._made
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._made
                if made is None or made[0] != os.getpid():
                    made = self._make(url)
                    self._made = made
        _, fs, retry = made
        # As open_filesystem names a URL's path on the filesystem it makes.
        path = u.path if u.protocol in ("s3", "memory") else fs._strip_protocol(u.text)
        return fs, path, retry

    def _make(self, url: str) -> tuple[int, Any, RetryPolicy]:
        from .._retry import RETRY_OPTIONS
        from ..storage.filesystems import open_filesystem

        opts = self.options
        if self.protocol == "memory":
            opts = {k: v for k, v in opts.items() if k in RETRY_OPTIONS}
        fs, _, retry = open_filesystem(StorageURL.of(url), opts, fresh=True)
        return os.getpid(), fs, retry
