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

Copies on the store: ranges copied from a loader on the *same* filesystem (equal fsspec
instances) are not read at once. If at publish the output turns out to be that whole
source object unchanged (every byte referenced at its own offset, or written with the
source's own bytes: at most :data:`VERIFY_LIMIT` of them, compared), the filesystem
copies it itself with ``fs.copy`` (server-side on object stores whose fsspec
implementation has one, e.g. GCS rewrite, Azure copy; in the kernel for local files);
the source is checked unchanged (size, ETag) just before and after. The copy is the commit
step (the commit hook runs before it): a source found changed after it, an interrupt
during it, or its attempts failing on a lost answer are
:class:`~ptestore.errors.PublishUncertain` (the destination may hold the changed source's
bytes), never "nothing was published". Otherwise, or when
the filesystem cannot copy (``NotImplementedError``), the referenced ranges are read into
the staging file, the source is checked unchanged, and the file is uploaded as usual.

Prefer :class:`~ptestore.writers.LocalFileWriter`, :class:`~ptestore.writers.MemoryWriter`
or :class:`~ptestore.writers.S3Writer` where they apply.
"""

from __future__ import annotations

import inspect
import tempfile
from typing import Any, ClassVar

import fsspec

from .._io import pread_all, pwrite_all
from .._retry import RETRY_OPTIONS, Category, RetryPolicy, classify, to_storage_error
from ..errors import (
    AlreadyExists,
    ConfigurationError,
    PreconditionFailed,
    PublishUncertain,
    StorageError,
    describe_exception,
)
from ..storage._options import fsspec_options
from ..storage.remote import FsspecLoader
from ..storage.types import DataLoader, split_url, strerror
from ._staging import FileStaging
from .base import DataWriter, PublishMode, PublishResult, WriterGuarantees, already_exists

__all__ = ["VERIFY_LIMIT", "FsspecWriter"]

#: Written bytes compared with the source before a whole-object ``fs.copy``.
VERIFY_LIMIT = 1 << 20
_CHUNK = 8 << 20


def _cut(ranges: list[tuple[int, int, int]], start: int, end: int) -> list[tuple[int, int, int]]:
    """``(dst_start, dst_end, src_start)`` ranges with ``[start, end)`` removed."""
    out: list[tuple[int, int, int]] = []
    for s, e, src in ranges:
        if s < start:
            out.append((s, min(e, start), src))
        if e > end:
            b = max(s, end)
            out.append((b, e, src + b - s))
    return out


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
        #: The loader on this filesystem whose ranges are referenced, not yet read.
        self._src: FsspecLoader | None = None
        self._refs: list[tuple[int, int, int]] = []
        #: True once published by the filesystem's own copy of the whole source.
        self.copied_whole = False

    def _same_fs(self, loader: DataLoader) -> FsspecLoader | None:
        if not isinstance(loader, FsspecLoader) or loader.fs != self.fs:
            return None
        if self._src is not None and self._src is not loader:
            return None
        return loader

    def _copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        same = self._same_fs(loader)
        if same is None:
            super()._copy_from(loader, src_offset, size, dst_offset)
            return
        self._src = same
        end = dst_offset + size
        self._refs = [*_cut(self._refs, dst_offset, end), (dst_offset, end, src_offset)]

    def _write(self, data: memoryview, offset: int) -> None:
        if self._refs:
            self._refs = _cut(self._refs, offset, offset + data.nbytes)
        try:
            pwrite_all(self._st.fileno(), data, offset)
        except OSError as exc:
            raise StorageError(
                f"{self.url}: staging write of {data.nbytes} bytes at offset {offset} to "
                f"{self._st.path} failed: {strerror(exc)}"
            ) from exc

    def _is_whole_source(self, src: FsspecLoader, size: int) -> bool:
        """Every byte of the output is the source's at the same offset."""
        if src.size() != size or any(s != d for d, _, s in self._refs):
            return False
        other: list[tuple[int, int]] = []
        pos = 0
        for d, e, _ in sorted(self._refs):
            if d > pos:
                other.append((pos, d))
            pos = max(pos, e)
        if pos < size:
            other.append((pos, size))
        if sum(e - s for s, e in other) > VERIFY_LIMIT:
            return False
        fd = self._st.fileno()
        return all(
            pread_all(fd, e - s, s).ljust(e - s, b"\0") == bytes(src.load(s, e - s))
            for s, e in other
        )

    def _materialize(self, src: FsspecLoader) -> None:
        """Read the referenced ranges into the staging file."""
        fd = self._st.fileno()
        for d, e, s in self._refs:
            for off in range(0, e - d, _CHUNK):
                n = min(_CHUNK, e - d - off)
                data = memoryview(src.load(s + off, n)).cast("B")
                try:
                    pwrite_all(fd, data, d + off)
                except OSError as exc:
                    raise StorageError(
                        f"{self.url}: staging write of {n} bytes at offset {d + off} to "
                        f"{self._st.path} failed: {strerror(exc)}"
                    ) from exc
        self._refs = []
        src.check_unchanged()

    def _copy_whole(self, src: FsspecLoader, mode: PublishMode, sent: list[int]) -> bool:
        """``fs.copy`` of the source, the commit step: the source checked unchanged and the
        commit point taken before it (``sent[0]`` counts its attempts); False, nothing
        copied and the commit point taken back, if the filesystem cannot copy. Once the
        copy ran, the source found changed is :class:`PublishUncertain`: the destination
        may hold the changed source's bytes."""
        fs, path = self.fs, self.path
        src.check_unchanged()
        if mode == "create" and fs.exists(path):
            raise already_exists(self.url)
        self._commit_point()

        def copy() -> None:
            sent[0] += 1
            fs.copy(src.path, path)

        try:
            self.retry.call(copy, what=f"{self.url}: copy of {src.name}")
        except NotImplementedError:
            self._committing = False  # nothing copied: the upload is the commit step
            sent[0] = 0
            return False
        try:
            src.check_unchanged()
        except Exception as exc:
            found = (
                f"changed while the filesystem copied it ({exc})"
                if isinstance(exc, PreconditionFailed)
                else f"could not be checked after the copy ({describe_exception(exc)})"
            )
            raise PublishUncertain(
                f"{self.url}: the source {src.name} {found}: the copy is done, so the "
                "destination may hold the changed source's bytes rather than this output; "
                "check it before relying on it"
            ) from exc
        return True

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        fs, path, tmp = self.fs, self.path, self._st.path
        kwargs = {"mode": mode} if "mode" in inspect.signature(fs.put_file).parameters else {}
        src = self._src
        sent = [0]  # copies or uploads at publish attempted
        what = "upload at publish"
        try:
            hooked = False  # the commit hook ran before a copy the filesystem refused
            if src is not None and self._is_whole_source(src, size):
                what = f"copy of {src.name} at publish"
                if self._copy_whole(src, mode, sent):
                    self.copied_whole = True
                    self._st.cleanup()
                    return PublishResult(url=self.url, size=size)
                what, hooked = "upload at publish", True
            if src is not None:
                self._materialize(src)
            if mode == "create" and fs.exists(path):
                raise already_exists(self.url)
            self._commit_point(hook=not hooked)

            def upload() -> None:
                sent[0] += 1
                fs.put_file(tmp, path, **kwargs)

            self.retry.call(upload, what=f"{self.url}: upload at publish")
        except (AlreadyExists, PublishUncertain):
            raise
        except Exception as exc:
            category = classify(exc)
            if category is Category.ALREADY_EXISTS and sent[0] <= 1:
                raise already_exists(self.url) from exc
            if sent[0] and category in (Category.TRANSIENT, Category.ALREADY_EXISTS):
                # an attempt whose answer was lost may have stored the upload (a retried
                # create then meets this writer's own object)
                raise PublishUncertain(
                    f"{self.url}: the {what} failed after {sent[0]} attempt(s) "
                    f"({describe_exception(exc)}): the destination holds either its "
                    "previous content or the complete new output; check it before relying "
                    "on either"
                ) from exc
            raise to_storage_error(exc, self.url, what) from exc
        self._st.cleanup()
        return PublishResult(url=self.url, size=size)
