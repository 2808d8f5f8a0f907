"""DataLoaders: ranged, read-only access to a .pte/.ptd wherever it is stored.

``open_loader(url, **storage_options)`` returns a :class:`DataLoader` for local paths,
``file://``, ``memory://``, ``s3://`` and any other fsspec protocol. Every read is a
ranged read: parsing the metadata of a multi-GB object reads only its first bytes. A
remote object of at most :data:`WHOLE_READ_LIMIT` bytes (1 MiB) is the exception: its
second read fetches it whole, in one request, and every later read is served from that
copy (a small model's pipeline otherwise pays one round trip per range: about ten). A
single read (a trailer's, the planner's) stays one small ranged read. ``memory://`` (no
round trip to save) is always read by ranges.

Local files are read with ``os.pread`` (thread-safe, no shared file position). Remote
reads retry transient failures under :class:`ptestore._retry.RetryPolicy` (options
``retry_attempts``, ``retry_initial``, ``retry_max``), the one retry layer (on S3,
s3fs's and botocore's own retries are off: :func:`.filesystems.one_retry_layer`); permanent
failures are raised at once, mapped by :func:`ptestore._retry.to_storage_error` (missing object ->
:class:`~ptestore.errors.ObjectNotFound`, 401/403/EACCES ->
:class:`~ptestore.errors.PermissionDenied`, ...). An S3 loader reads through the
process's shared filesystem for its options and the credentials' current state (at most
8 kept, never fsspec's unbounded instance cache; ``skip_instance_cache=True``: one of its
own), which its ``close`` lets go (:mod:`.filesystems`).

Every loader implements :meth:`DataLoader.check_unchanged`, which the pipeline calls
before publishing anything derived from the source.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
from typing import TYPE_CHECKING, Any

from .._io import pread_all, preadinto_all
from .._oserror import local_error
from ..errors import (
    ConfigurationError,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
)
from ._options import check_options
from .base import LoaderBase, check_range
from .regular import file_kind
from .types import Buffer, DataLoader, StorageURL, redacted_url, split_url, strerror

if TYPE_CHECKING:
    from .remote import FsspecLoader, S3Source

__all__ = [
    "BytesLoader",
    "DataLoader",
    "FsspecLoader",
    "LocalFileLoader",
    "S3Source",
    "loader_options",
    "open_loader",
    "split_url",
]


class BytesLoader(LoaderBase):
    """A loader over bytes already in memory (zero-copy slices)."""

    def __init__(self, data: Buffer, name: str = "<bytes>") -> None:
        self._view = memoryview(data).cast("B")
        self.name = name

    def size(self) -> int:
        return self._view.nbytes

    def load(self, offset: int, size: int) -> memoryview:
        check_range(self.name, offset, size, self._view.nbytes)
        return self._view[offset : offset + size]

    def check_unchanged(self) -> None:
        """Nothing to check: the caller owns the buffer."""


def _kind_of(path: str) -> str:
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return "not a regular file"


def _not_regular(path: str, what: str) -> ConfigurationError:
    return ConfigurationError(f"{path}: is {what}, not a regular file; refusing to read it")


class LocalFileLoader(LoaderBase):
    """Positional reads (``os.pread``) from a local file.

    The file descriptor is opened once; ``load`` is safe from several threads.
    :meth:`view` returns zero-copy, read-only views of a mapping of the file.
    ``path`` and ``fileno()`` let local writers copy ranges in the kernel.
    """

    #: :meth:`readinto` may be called from several threads at once (``preadv``): a
    #: hasher reads a chunk per core.
    parallel_reads = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        # Set before the open: an interrupt anywhere below leaves close() able to run.
        self._lock = threading.Lock()
        self._no_map = False
        self._fd: int | None = None
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.path}: no such file") from exc
        except IsADirectoryError as exc:
            raise _not_regular(self.path, "a directory") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _not_regular(self.path, "a symbolic link loop") from exc
            if exc.errno == errno.ENXIO:  # a socket (or a FIFO/device without a peer)
                raise _not_regular(self.path, _kind_of(self.path)) from exc
            raise local_error(
                exc, f"{self.path}: cannot open for reading: {strerror(exc)}"
            ) from exc
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise _not_regular(self.path, file_kind(st.st_mode))
            os.set_blocking(self._fd, True)
        except BaseException:  # Ctrl-C too: the descriptor would stay open for good
            self.close()
            raise
        self._size = st.st_size
        # The size and both times: a same-size rewrite that keeps its modification time
        # (``cp -p``, an archive's fixed timestamps) still moves the change time. (The
        # device and inode need no place: the reads go to this descriptor's file.)
        self._stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def fileno(self) -> int:
        if self._fd is None:
            raise StorageError(f"{self.name}: loader is closed")
        return self._fd

    def size(self) -> int:
        return self._size

    def check_unchanged(self) -> None:
        """Raise :class:`~ptestore.errors.PreconditionFailed` if the file was modified in
        place since it was opened: its size, modification or change time differ (a
        ``chmod`` counts too: nothing tells it from a rewrite that restored the
        modification time). A file renamed over the path does not matter: reads go to
        the opened one."""
        st = os.fstat(self.fileno())
        now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if now != self._stamp:
            size, mtime, ctime = self._stamp
            raise PreconditionFailed(
                f"{self.name}: modified while being read (size {size} -> {st.st_size}, "
                f"modified {mtime} -> {st.st_mtime_ns} ns, changed {ctime} -> "
                f"{st.st_ctime_ns} ns); its content may be a mix of two versions",
                url=self.name,
                refused_by="ptestore",
            )

    def load(self, offset: int, size: int) -> bytes:
        check_range(self.name, offset, size, self._size)
        try:
            data = pread_all(self.fileno(), size, offset)
        except OSError as exc:
            raise local_error(
                exc, f"{self.name}: read of {size} bytes at offset {offset} failed: {strerror(exc)}"
            ) from exc
        if len(data) != size:
            raise StorageError(
                f"{self.name}: file shrank while reading: wanted {size} bytes at offset "
                f"{offset}, got {len(data)}"
            )
        return data

    def readinto(self, offset: int, buffer: memoryview) -> None:
        """Fill all of ``buffer`` (writable, bytes) with the file's bytes at ``offset``,
        read straight into it (``preadv``): no mapping, so the file's pages never count
        in this process's memory, and no intermediate copy."""
        size = buffer.nbytes
        check_range(self.name, offset, size, self._size)
        try:
            got = preadinto_all(self.fileno(), buffer, offset)
        except OSError as exc:
            raise local_error(
                exc, f"{self.name}: read of {size} bytes at offset {offset} failed: {strerror(exc)}"
            ) from exc
        if got != size:
            raise StorageError(
                f"{self.name}: file shrank while reading: wanted {size} bytes at offset "
                f"{offset}, got {got}"
            )

    def view(self, offset: int, size: int) -> memoryview | bytes:
        """Zero-copy, read-only view of ``size`` bytes at ``offset``, for reads that
        need not own their bytes (named data and delegate blobs handed to backends).

        Each view maps only its own range (``mmap``), and the mapping is released when
        the last reference to the view goes, so pages a backend has finished with leave
        the process, and closing the loader never invalidates a view. Falls back to
        :meth:`load` where the file cannot be mapped. A view of a file someone truncates
        in place while it is read faults (``SIGBUS``), as with any mapped file (the
        ExecuTorch runtime's mmap loader included); replacing the file by rename, as
        ptestore's writers do, is safe.
        """
        check_range(self.name, offset, size, self._size)
        if size == 0 or self._no_map:
            return self.load(offset, size)
        now = os.fstat(self.fileno()).st_size
        if now < offset + size:
            raise StorageError(
                f"{self.name}: file shrank while reading: wanted {size} bytes at offset "
                f"{offset}, the file now has {now} bytes"
            )
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapped = mmap.mmap(
                self.fileno(), offset + size - start, access=mmap.ACCESS_READ, offset=start
            )
        except (OSError, ValueError, OverflowError):
            self._no_map = True  # a file system or file that cannot be mapped: copy
            return self.load(offset, size)
        return memoryview(mapped)[offset - start : offset - start + size]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def loader_options(url: str | os.PathLike[str] | StorageURL) -> frozenset[str]:
    """The names of the storage options :func:`open_loader` accepts for ``url`` (the
    loader class comes from the scheme table, :mod:`ptestore.storage.schemes`)."""
    from .schemes import loader_options as names

    return names(url)


def open_loader(url: str | os.PathLike[str] | StorageURL, **storage_options: Any) -> DataLoader:
    """Open a read-only :class:`DataLoader` for ``url``.

    Args:
        url: a local path, ``file://``, ``memory://``, ``s3://`` or any fsspec URL (or
            a :class:`~ptestore.storage.types.StorageURL`, split already).
        **storage_options: the fsspec filesystem's options (for S3, s3fs options such
            as ``endpoint_url``, ``key``, ``secret``, ``client_kwargs``, ``profile``)
            plus ``retry_attempts``, ``retry_initial`` and ``retry_max``. Local files
            take none.

    Returns:
        A :class:`DataLoader` (ranged reads, ``size``, ``check_unchanged``); close it
        when done (an S3 loader's filesystem is then released, or closed when it is
        its own: :mod:`.filesystems`).

    Raises:
        ConfigurationError: an unknown protocol, or options that do not apply (the
            message lists the accepted ones) or have the wrong type.
        ObjectNotFound: nothing at ``url`` (local files; remote objects may report it
            on the first read).
        PermissionDenied: access refused.
        StorageError: other I/O failures, after retries.
    """
    from .schemes import scheme_of

    u = StorageURL.of(url)
    row = scheme_of(u)
    cls = row.loader_class(u)
    if u.local:
        check_options(u.text, storage_options, (), row.applies_to)
        local: DataLoader = cls(u.path)
        return local
    from .filesystems import close_filesystem, open_filesystem

    check_options(redacted_url(u.text), storage_options, cls.accepted_options(u), row.applies_to)
    fs, fs_path, retry = open_filesystem(u, storage_options)  # the policy: one retry layer
    try:
        loader: FsspecLoader = cls(fs, fs_path, u.text, retry=retry, owns_fs=True)
    except BaseException:
        close_filesystem(fs)  # the object is missing, a directory, refused: no loader
        raise
    return loader


def __getattr__(name: str) -> Any:
    """``FsspecLoader``, ``S3Source`` and ``WHOLE_READ_LIMIT`` live in :mod:`.remote`
    (imported on first use: a local run never needs them)."""
    if name in ("FsspecLoader", "S3Source", "WHOLE_READ_LIMIT"):
        from . import remote

        return getattr(remote, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
