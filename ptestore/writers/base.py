"""The DataWriter contract: staged writes at any offset, then one atomic publish.

Implementers subclass :class:`DataWriter` and provide four primitives, ``_write``,
``_publish``, an optional faster ``_copy_from``, and a *staging* object registered with
:meth:`DataWriter._track_staging` whose ``cleanup()`` removes everything staged. The base
class owns the life cycle, argument checking, locking and the discard-on-destroy
finalizer, so every writer enforces the contract identically. The records it takes and
returns (modes, guarantees, results, versions, the shared error wording) are in
:mod:`.records`, and importable from here too.
"""

from __future__ import annotations

import abc
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol, get_args

from .._log import get_logger
from ..errors import (
    ConfigurationError,
    PteStoreError,
    PublishUncertain,
    WriterStateError,
    describe_exception,
)
from ..storage.types import DataLoader
from .records import (
    PublishMode,
    PublishResult,
    Versioned,
    WriterGuarantees,
    WriterState,
    already_exists,
    version_conflict,
)

__all__ = [
    "MAX_OBJECT_SIZE",
    "DataWriter",
    "PublishMode",
    "PublishResult",
    "Staging",
    "Versioned",
    "WriterGuarantees",
    "WriterState",
    "already_exists",
    "discard_all",
    "version_conflict",
]

log = get_logger("ptestore.writers")

_MODES = get_args(PublishMode)
#: No output may end beyond this byte (the largest file offset POSIX can express).
MAX_OBJECT_SIZE = (1 << 63) - 1


class Staging(Protocol):
    """What a writer stages (temp file, buffers, a multipart upload).

    ``cleanup()`` removes all of it. It must be idempotent, must not refer back to the
    writer (it runs from a :func:`weakref.finalize` callback) and may raise
    :class:`~ptestore.errors.StorageError` when removal fails.
    """

    def cleanup(self) -> None: ...


class _OwnedStaging:
    """A staging that only the process which created it may clean up.

    A child forked by a backend (``os.fork``, ``multiprocessing`` with ``fork``) inherits
    the writer; whatever path it leaves by (``discard``, a ``with`` block, the
    coordinator's cleanup, the finalizer at exit), it must not remove its parent's
    staging file or abort its parent's multipart upload.
    """

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self.pid = os.getpid()

    def cleanup(self) -> None:
        if os.getpid() == self.pid:
            self.staging.cleanup()


def _finalize(staging: _OwnedStaging, url: str, dirty: list[bool]) -> None:
    """Discard-on-destroy: runs on garbage collection or at interpreter exit."""
    if os.getpid() != staging.pid:  # a forked child must not discard its parent's staging
        return
    try:
        staging.cleanup()
    except Exception as exc:  # never raise from a finalizer
        log.warning("%s: discarding an abandoned writer failed: %s", url, exc)
    if dirty[0]:
        warnings.warn(
            f"{url}: writer was destroyed without publish() or discard(); "
            "its staged data was discarded",
            ResourceWarning,
            stacklevel=2,
        )


def discard_all(writers: Iterable[DataWriter]) -> None:
    """Discard every writer after a failure (a no-op for a published one; it never
    publishes), the last opened first: a directory an earlier writer made for its
    destination (``auto_mkdir``) may hold a later one's staging file, and is removed by
    its maker only once empty. A failing discard is logged (debug), not raised: the
    original error matters more."""
    for w in reversed(list(writers)):
        try:
            w.discard()
        except Exception as exc:
            log.debug("%s: discarding after a failure failed: %s", w.url, exc)


def _as_view(data: bytes | bytearray | memoryview, url: str) -> memoryview:
    try:
        view = memoryview(data)
    except TypeError:
        raise ConfigurationError(
            f"{url}: write() needs a bytes-like object, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ConfigurationError(f"{url}: write() needs a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _check_offset(url: str, what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{url}: {what} must be a non-negative int, got {value!r}")
    return value


def _check_end(url: str, what: str, offset: int, size: int) -> None:
    if size and offset + size > MAX_OBJECT_SIZE:
        raise ConfigurationError(
            f"{url}: {what} of {size} bytes at offset {offset} ends at byte {offset + size}, "
            f"beyond the largest object size {MAX_OBJECT_SIZE} (2**63 - 1)"
        )


class DataWriter(abc.ABC):
    """A transactional output object.

    Life cycle: ``OPEN`` -> ``PUBLISHED`` or ``DISCARDED`` (both terminal).

    - :meth:`write` copies bytes into the unpublished output at any offset, in any
      order; overlapping writes are allowed (the later one wins); gaps read as zeros.
      The published object is ``[0, max end)``; a zero-length write changes nothing.
    - :meth:`copy_from` is equivalent to ``write(loader.load(src_offset, size),
      dst_offset)`` but may avoid moving the bytes through Python.
    - :meth:`publish` makes the output visible atomically; ``mode="create"`` refuses to
      replace an existing object (:class:`~ptestore.errors.AlreadyExists`);
      ``mode="if-match"`` replaces only the version given as ``expected``
      (:class:`~ptestore.errors.PreconditionFailed`). One publish per writer.
    - :meth:`discard` is idempotent and removes everything staged. Leaving a ``with``
      block without publishing, garbage collection and interpreter exit discard;
      nothing ever publishes implicitly.

    Any failure of ``write``, ``copy_from`` or ``publish`` other than a
    :class:`~ptestore.errors.ConfigurationError` (a bad argument, detected before
    anything changed) discards the writer before the error propagates. Calls are
    thread-safe: they are serialized by a per-writer lock.
    """

    #: The destination path or URL, used in messages.
    url: str
    #: What this writer class promises (see :class:`WriterGuarantees`).
    guarantees: ClassVar[WriterGuarantees]
    #: Storage options the constructor takes (``open_writer`` refuses all others).
    options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def accepted_options(cls, url: str) -> frozenset[str]:
        """Storage options that apply to this writer for ``url`` (default:
        :attr:`options`; writers over an arbitrary fsspec filesystem add its own)."""
        return cls.options

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()
        self._state = WriterState.OPEN
        self._why_closed = ""
        self._size = 0
        self._dirty = [False]
        self._staging: _OwnedStaging | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._committing = False
        #: The version ``publish(mode="if-match")`` expects (set for ``_publish``).
        self._expected: str | None = None
        #: Test hook: called with the writer right before its commit step (the rename or
        #: link, the store assignment, the PutObject or CompleteMultipartUpload, the
        #: generic writer's upload or fs.copy), after
        #: every check the writer makes. Race tests pause one writer here to force an
        #: interleaving (see docs/testing.md).
        self.commit_hook: Callable[[DataWriter], None] | None = None

    # -- for implementers -------------------------------------------------------------

    def _track_staging(self, staging: Staging) -> None:
        """Register what must be removed on discard, destruction or interpreter exit."""
        self._staging = _OwnedStaging(staging)
        self._finalizer = weakref.finalize(self, _finalize, self._staging, self.url, self._dirty)

    def _commit_point(self, *, hook: bool = True) -> None:
        """Call right before the step that may make the output visible.

        From here on, a failure the writer did not classify itself (an interrupt such as
        ``KeyboardInterrupt``, an unexpected exception) may come after the output became
        visible: :meth:`publish` raises :class:`~ptestore.errors.PublishUncertain` for it,
        never an error that says nothing was published. ``hook=False``: the writer ran
        :attr:`commit_hook` itself, earlier (before a lock that its last checks need).
        """
        if hook and self.commit_hook is not None:
            self.commit_hook(self)
        self._committing = True

    @abc.abstractmethod
    def _write(self, data: memoryview, offset: int) -> None:
        """Store ``data`` at ``offset`` (arguments already checked, lock held)."""

    def _copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        """Default copy: through Python in 8 MiB chunks. Override for a faster path."""
        chunk = 8 << 20
        done = 0
        while done < size:
            n = min(chunk, size - done)
            data = loader.load(src_offset + done, n)
            self._write(_as_view(data, self.url), dst_offset + done)
            done += n

    #: Bytes that :meth:`copy_from` shared with its source (copy-on-write clones)
    #: instead of copying; writers that clone keep it up to date.
    bytes_cloned: int = 0

    def add_object_metadata(self, metadata: Mapping[str, str]) -> bool:
        """Store ``metadata`` (str to str) with the published object, where the storage
        keeps user metadata beside an object (S3's ``x-amz-meta-*``). Returns False when
        it has nowhere to keep it (the default). Call before the first write."""
        return False

    def ensure_space(self, size: int, *, end: int | None = None) -> None:
        """Fail now, before anything more is written, if the storage says an output of
        ``size`` new bytes (``end``: its size, where clones share the rest; ``size`` if
        None) cannot fit: :class:`~ptestore.errors.StorageError` with ``errno`` ``ENOSPC``
        naming the bytes needed, the bytes free and where. A no-op where the storage
        tells nothing (the default; local files check ``statvfs``). The writer stays
        open either way: the caller decides (discard, or free space and go on)."""
        _check_offset(self.url, "size", size)
        with self._lock:
            self._check_open("check free space")
            self._ensure_space(size, size if end is None else max(end, size))

    def _ensure_space(self, size: int, end: int) -> None:
        """Override: raise if ``size`` new bytes of an output of ``end`` bytes cannot
        fit (arguments checked, lock held)."""
        return None

    @property
    def keeps_object_metadata(self) -> bool:
        """Whether :meth:`add_object_metadata` keeps anything (it must then be called
        before the first write): True for a writer that overrides it (S3)."""
        return type(self).add_object_metadata is not DataWriter.add_object_metadata

    #: The checksum the store keeps of what this writer publishes (S3's algorithm name,
    #: e.g. ``"CRC64NVME"``), or None: the provenance digest then records the CRCs a
    #: check of the store's checksum needs (:mod:`ptestore.provenance.crcs`).
    stored_checksum: str | None = None

    def clone_block_size(self, loader: DataLoader) -> int | None:
        """The block size in which :meth:`copy_from` from ``loader`` can share extents
        instead of copying (copy-on-write clones), or None when it cannot.

        A range is shared only where source and destination offsets agree modulo this
        size; the coordinator then keeps unchanged segments congruent to their source
        offsets. Default: None (no clones). Override in writers that clone."""
        return None

    @abc.abstractmethod
    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        """Make ``[0, size)`` visible and release the staging (lock held)."""

    # -- the contract -----------------------------------------------------------------

    @property
    def state(self) -> WriterState:
        """Current life-cycle state."""
        return self._state

    @property
    def size(self) -> int:
        """Size the object would have if published now: the maximum end written."""
        return self._size

    def _check_open(self, action: str) -> None:
        if self._state is WriterState.PUBLISHED:
            raise WriterStateError(f"{self.url}: cannot {action}: the writer was already published")
        if self._state is WriterState.DISCARDED:
            raise WriterStateError(
                f"{self.url}: cannot {action}: the writer was discarded ({self._why_closed})"
            )

    def _abandon(self, why: str) -> None:
        """Discard after a failure, without masking the error being raised."""
        self._state = WriterState.DISCARDED
        self._why_closed = why
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._staging is not None:
            try:
                self._staging.cleanup()
            except Exception as exc:
                log.warning("%s: discarding after a failure also failed: %s", self.url, exc)

    def write(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Copy ``data`` into the unpublished output at ``offset``."""
        view = _as_view(data, self.url)
        _check_offset(self.url, "offset", offset)
        _check_end(self.url, "write", offset, view.nbytes)
        with self._lock:
            self._check_open("write")
            if view.nbytes == 0:
                return
            self._dirty[0] = True
            try:
                self._write(view, offset)
            except ConfigurationError:
                raise
            except BaseException as exc:
                self._abandon(f"a write failed: {exc}")
                raise
            self._size = max(self._size, offset + view.nbytes)

    def copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        """Copy ``size`` bytes of ``loader`` at ``src_offset`` to ``dst_offset``."""
        _check_offset(self.url, "src_offset", src_offset)
        _check_offset(self.url, "size", size)
        _check_offset(self.url, "dst_offset", dst_offset)
        _check_end(self.url, "copy_from", dst_offset, size)
        total = loader.size()
        if src_offset + size > total:
            raise ConfigurationError(
                f"{self.url}: copy_from({loader.name}): range [{src_offset}, "
                f"{src_offset + size}) is outside the source (size {total})"
            )
        with self._lock:
            self._check_open("copy_from")
            if size == 0:
                return
            self._dirty[0] = True
            try:
                self._copy_from(loader, src_offset, size, dst_offset)
            except ConfigurationError:
                raise
            except BaseException as exc:
                self._abandon(f"a copy failed: {exc}")
                raise
            self._size = max(self._size, dst_offset + size)

    def publish(
        self, mode: PublishMode = "overwrite", *, expected: str | None = None
    ) -> PublishResult:
        """Make the output visible atomically (see the class docstring).

        ``mode="if-match"`` publishes only if the destination is still the version
        ``expected`` (a token from :func:`~ptestore.writers.versions.read_versioned` or
        :func:`~ptestore.writers.versions.current_version`); otherwise nothing is
        published and :class:`~ptestore.errors.PreconditionFailed` names the expected and
        the found version. "Must not exist" is ``mode="create"``.
        """
        if mode not in _MODES:
            raise ConfigurationError(
                f"{self.url}: publish mode must be 'overwrite', 'create' or 'if-match', "
                f"got {mode!r}"
            )
        if mode == "if-match":
            if not isinstance(expected, str) or not expected:
                raise ConfigurationError(
                    f"{self.url}: publish(mode='if-match') needs expected=<version token> "
                    f"(a non-empty str), got {expected!r}; for 'must not exist' use "
                    "mode='create'"
                )
            if not type(self).guarantees.conditional_update:
                raise ConfigurationError(
                    f"{self.url}: {type(self).__name__} cannot publish conditionally "
                    "(mode='if-match'); its storage offers no compare-and-swap"
                )
        elif expected is not None:
            raise ConfigurationError(
                f"{self.url}: expected={expected!r} is only for mode='if-match', not {mode!r}"
            )
        with self._lock:
            self._check_open("publish")
            self._expected = expected
            try:
                result = self._publish(mode, self._size)
            except BaseException as exc:
                if self._committing and not isinstance(exc, PteStoreError):
                    self._abandon(f"publish uncertain: {describe_exception(exc)}")
                    raise PublishUncertain(
                        f"{self.url}: publishing was interrupted after its commit step began "
                        f"({describe_exception(exc)}): the destination holds either its "
                        "previous content or the complete new output; check it before "
                        "relying on either"
                    ) from exc
                if isinstance(exc, ConfigurationError) and not self._committing:
                    raise  # bad input found before the commit step: the writer stays open
                self._abandon(f"publish failed: {exc}")
                raise
            self._state = WriterState.PUBLISHED
            if self._finalizer is not None:
                self._finalizer.detach()
            return result

    def discard(self) -> None:
        """Remove everything staged. Idempotent; a no-op after publish."""
        with self._lock:
            if self._state is not WriterState.OPEN:
                return
            self._state = WriterState.DISCARDED
            self._why_closed = "discard() was called"
            if self._finalizer is not None:
                self._finalizer.detach()
            if self._staging is not None:
                self._staging.cleanup()

    def __enter__(self) -> DataWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.discard()
            return
        with self._lock:
            if self._state is WriterState.OPEN:
                self._abandon("an exception left the with block")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} {self._state.value} size={self._size}>"
