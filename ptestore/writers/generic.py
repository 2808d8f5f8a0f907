"""Any other fsspec filesystem: stage locally, upload once at publish.

This writer exists so that every fsspec URL works; its guarantees are only those of the
filesystem's ``put_file``:

- **Atomic**: only if ``put_file`` is (a single-request upload to an object store such
  as GCS or Azure Blob is; FTP, SFTP, WebDAV, SMB and local-like filesystems are not, and
  a reader may see a partial object while the upload runs).
- **Durable**: whatever the filesystem promises once ``put_file`` returns.
- **Isolated**: yes until publish; nothing is sent before it.
- **No-clobber**: ``put_file(..., mode="create")``: native on some filesystems, an
  ``exists()`` check followed by the upload on others (a race between publishers can
  then let both "win").
- **Cleanup**: discard, garbage collection and interpreter exit remove the local staging
  file (``ptestore-generic-*.tmp`` in the system temp dir or ``spool_dir``). A crash can
  leave that file behind, and a crash *during* a non-atomic upload a partial object.

Prefer :class:`~ptestore.writers.LocalFileWriter`, :class:`~ptestore.writers.MemoryWriter`
or :class:`~ptestore.writers.S3Writer` where they apply.
"""

from __future__ import annotations

import inspect
import tempfile
from typing import Any, ClassVar

import fsspec

from .._io import pwrite_all
from .._options import fsspec_options
from .._retry import RETRY_OPTIONS, Category, RetryPolicy, classify, to_storage_error
from ..errors import AlreadyExists, ConfigurationError, StorageError
from ..loaders import split_url
from ._staging import FileStaging, strerror
from .base import DataWriter, PublishMode, PublishResult, WriterGuarantees

__all__ = ["FsspecWriter"]


class FsspecWriter(DataWriter):
    """Writer for fsspec protocols without a dedicated writer (see the module docstring).

    Parameters
    ----------
    url:
        Any fsspec URL (chained URLs such as ``dir::file:///tmp/x`` included).
    fs:
        An already-built filesystem to use instead of resolving ``url``.
    spool_dir:
        Where to put the local staging file (default: the system temp dir).
    retry_attempts, retry_initial, retry_max:
        The :class:`~ptestore._retry.RetryPolicy` of the upload at publish.
    storage_options:
        Passed to the filesystem constructor.
    """

    guarantees: ClassVar[WriterGuarantees] = WriterGuarantees(
        atomic_publish=False, exclusive_create=False, durable=False
    )
    options: ClassVar[frozenset[str]] = frozenset({"fs", "spool_dir", *RETRY_OPTIONS})

    @classmethod
    def accepted_options(cls, url: str) -> frozenset[str]:
        """:attr:`options` plus those of the URL's fsspec filesystem (and, for chained
        URLs such as ``simplecache::s3://...``, per-protocol option dicts)."""
        names = set(cls.options)
        for link in url.split("::"):
            protocol = split_url(link)[0] if "://" in link else link
            names.add(protocol)
            try:
                names |= fsspec_options(fsspec.get_filesystem_class(protocol))
            except (ImportError, ValueError):
                continue  # reported when the filesystem is opened
        return frozenset(names)

    def __init__(
        self,
        url: str,
        *,
        fs: Any = None,
        spool_dir: str | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(url)
        options = dict(storage_options)
        self.retry = RetryPolicy.from_options(url, options)
        storage_options = options
        if fs is None:
            try:
                fs, path = fsspec.core.url_to_fs(url, **storage_options)
            except (ImportError, ValueError, TypeError) as exc:
                raise ConfigurationError(f"{url}: cannot open the filesystem: {exc}") from exc
        else:
            if storage_options:
                raise ConfigurationError(
                    f"{url}: storage options {sorted(storage_options)} are ignored when fs= "
                    "is given"
                )
            path = fs._strip_protocol(url)
        self.fs = fs
        self.path: str = path
        try:
            fd, tmp = tempfile.mkstemp(prefix="ptestore-generic-", suffix=".tmp", dir=spool_dir)
        except OSError as exc:
            raise StorageError(
                f"{url}: cannot create a local staging file: {strerror(exc)}"
            ) from exc
        self._st = FileStaging(tmp, fd)
        self._track_staging(self._st)

    def _write(self, data: memoryview, offset: int) -> None:
        try:
            pwrite_all(self._st.fileno(), data, offset)
        except OSError as exc:
            raise StorageError(
                f"{self.url}: staging write of {data.nbytes} bytes at offset {offset} to "
                f"{self._st.path} failed: {strerror(exc)}"
            ) from exc

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        fs, path, tmp = self.fs, self.path, self._st.path
        exists = (
            f"{self.url}: already exists; publish(mode='create') never replaces an existing object"
        )
        kwargs = {"mode": mode} if "mode" in inspect.signature(fs.put_file).parameters else {}
        try:
            if mode == "create" and fs.exists(path):
                raise AlreadyExists(exists)
            self._commit_point()
            self.retry.call(
                lambda: fs.put_file(tmp, path, **kwargs), what=f"{self.url}: upload at publish"
            )
        except AlreadyExists:
            raise
        except Exception as exc:
            if classify(exc) is Category.ALREADY_EXISTS:
                raise AlreadyExists(exists) from exc
            raise to_storage_error(exc, self.url, "upload at publish") from exc
        self._st.cleanup()
        return PublishResult(url=self.url, size=size)
