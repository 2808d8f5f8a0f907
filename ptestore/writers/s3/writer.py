"""S3Writer: a multipart upload on a fixed part grid, completed atomically at publish.

A part is stored (in a bounded thread pool, ``max_concurrency`` in flight) as soon
as every byte of it has been written, in any order; only partially written parts are
held in memory. Parts never written are uploaded as zeros at publish. Outputs of
at most one part go up as a single PutObject. Rewriting a part that is already
uploaded needs ``spool=True`` (uploaded parts kept in an unlinked local temp file).

``copy_from`` a loader of an S3 object on the same endpoint with the same credentials
(:meth:`S3Writer.copy_source`) reads nothing: it records the range, and parts that are
one source range are copied by the service (:mod:`.transfer`).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..._log import get_logger
from ..._retry import RETRY_OPTIONS
from ...errors import ConfigurationError, StorageError, WriterStateError
from ...storage._s3source import S3Source, matching_source, s3_identity
from ...storage.types import DataLoader, split_url
from ..base import DataWriter, PublishMode, PublishResult, WriterGuarantees
from . import config
from .checksum import full_object, param, writer_algorithm
from .config import DEFAULT_PART_SIZE, S3Connection, check_part_size, largest_object
from .copies import check_copied_sources
from .marker import MAX_DATA_PARTS
from .parts import Part, PartContent, Ref, UploadedPart
from .publish import TOKEN_METADATA_KEY, S3Publisher, checked_metadata
from .staging import S3Staging
from .transfer import PartTransfer

log = get_logger("ptestore.writers.s3")

__all__ = ["S3Writer"]

#: Options of the writer itself (the rest are s3fs's).
WRITER_OPTIONS = frozenset(
    {
        "part_size",
        "max_concurrency",
        "metadata",
        "spool",
        "spool_dir",
        "verify",
        "checksum_algorithm",
        *RETRY_OPTIONS,
    }
)


class S3Writer(DataWriter):
    """Writer for ``s3://bucket/key`` (guarantees: see :mod:`ptestore.writers.s3`).

    Parameters
    ----------
    url:
        ``s3://bucket/key`` (or ``s3a://``).
    part_size:
        Multipart part size in bytes, 5 MiB to 5 GiB (default 8 MiB). The largest
        object is ``part_size * 9999``.
    max_concurrency:
        Parts uploaded in parallel (with partially written parts, what bounds memory).
    metadata:
        User metadata (``x-amz-meta-*``) attached to the object.
    spool:
        Keep uploaded parts in an unlinked local temp file so that a part can be
        rewritten after its upload (default false: no local disk used; such a rewrite
        raises :class:`~ptestore.errors.ConfigurationError`).
    spool_dir:
        Directory of the spool file (default: the system temp dir).
    verify:
        HEAD the object after publishing and check size, checksum and writer token.
    checksum_algorithm:
        The full-object checksum every part and the object carry: ``"CRC64NVME"``
        (the default where ``awscrt`` is installed: what S3 stores by default),
        ``"CRC32"`` (the default without it), or ``"CRC32C"``
        (:mod:`.checksum`).
    retry_attempts, retry_initial, retry_max:
        The :class:`~ptestore._retry.RetryPolicy` of every S3 call.
    storage_options:
        Passed to ``s3fs.S3FileSystem`` (``endpoint_url``, ``key``, ``secret``,
        ``token``, ``anon``, ``profile``, ``client_kwargs``, ``config_kwargs``,
        ``s3_additional_kwargs``, ``requester_pays``, ``use_ssl``, ``session``, ...).
        The writer makes a filesystem of its own (``skip_instance_cache=True`` unless
        given): its client, credentials and hooks are not shared with other writers.
    """

    guarantees: ClassVar[WriterGuarantees] = WriterGuarantees(
        atomic_publish=True,
        exclusive_create=True,
        durable=True,
        verified=True,
        conditional_update=True,
    )
    options: ClassVar[frozenset[str]] = WRITER_OPTIONS

    @classmethod
    def accepted_options(cls, url: str) -> frozenset[str]:
        """The writer's options and every ``s3fs.S3FileSystem`` option."""
        return cls.options | config.connection_options()

    def __init__(
        self,
        url: str,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        max_concurrency: int = 4,
        metadata: dict[str, str] | None = None,
        spool: bool = False,
        spool_dir: str | os.PathLike[str] | None = None,
        verify: bool = True,
        checksum_algorithm: str | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(url)
        protocol, rest = split_url(url)
        bucket, _, key = rest.partition("/")
        if protocol != "s3" or not bucket or not key or key.endswith("/"):
            raise ConfigurationError(f"{url}: expected s3://bucket/key")
        # The module attribute is read here so tests can lower it (ptestore.testing.moto).
        self.part_size = check_part_size(url, part_size, config.MIN_PART_SIZE)
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise ConfigurationError(
                f"{url}: option max_concurrency = {max_concurrency!r}: must be an int >= 1"
            )
        meta = checked_metadata(url, metadata or {})
        #: The checksum algorithm of every part and of the whole object.
        self.algorithm = writer_algorithm(url, checksum_algorithm)
        self.stored_checksum = self.algorithm
        self.bucket, self.key = bucket, key
        self.max_concurrency = max_concurrency
        self.spool = spool
        self.spool_dir = spool_dir
        self.verify = verify
        #: Random token stored as ``x-amz-meta-ptestore-writer`` to recognise our object.
        self.token = uuid.uuid4().hex
        self.metadata = {**meta, TOKEN_METADATA_KEY: self.token}
        self.conn = S3Connection(url, storage_options, pool_size=max_concurrency + 4)
        #: This writer's own botocore client, made by s3fs (event hooks registered on
        #: ``client.meta.events`` see this writer's requests only).
        self.client = self.conn.client
        self._publisher = S3Publisher(
            url,
            self.conn,
            bucket,
            key,
            metadata=self.metadata,
            token=self.token,
            verify=verify,
            algorithm=self.algorithm,
        )
        self._parts: dict[int, Part] = {}
        self._inflight: set[cf.Future[UploadedPart]] = set()
        self._held: dict[int, None] = {}  # re-dirtied complete parts awaiting upload (ordered)
        self._st = S3Staging(self.conn, bucket, key)
        self._track_staging(self._st)
        self._transfer = PartTransfer(self.conn, bucket, key, self.part_size, self.algorithm)
        self._identity: str | None = None

    def publish(
        self, mode: PublishMode = "overwrite", *, expected: str | None = None
    ) -> PublishResult:
        # docstring inherited; a published writer needs its client no more: close it (a
        # failed one closed it when the failure discarded it, its upload aborted)
        result = super().publish(mode, expected=expected)
        self.conn.close()
        return result

    def discard(self) -> None:
        # docstring inherited; the client is closed once the upload is aborted, on every
        # call (closing is idempotent), the abort failing too
        try:
            super().discard()
        finally:
            self.conn.close()

    def _abandon(self, why: str) -> None:
        # a failure discarded the writer (its upload aborted): nothing uses the client
        # again, so it is closed now rather than by whichever thread collects it
        try:
            super()._abandon(why)
        finally:
            self.conn.close()

    @property
    def upload_id(self) -> str | None:
        """Id of the pending multipart upload, once one was started."""
        return self._st.upload_id

    @property
    def parts(self) -> dict[int, Part]:
        """The part grid so far (index -> :class:`~ptestore.writers.s3.parts.Part`)."""
        return self._parts

    @property
    def in_flight(self) -> int:
        """Part uploads currently running."""
        return len(self._inflight)

    # -- the pending upload ---------------------------------------------------------------

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def add_object_metadata(self, metadata: Mapping[str, str]) -> bool:
        # docstring inherited
        self._check_open("add object metadata")
        if self._st.upload_id is not None or self.size:
            raise WriterStateError(f"{self.url}: object metadata must be added before writing")
        self.metadata.update(checked_metadata(self.url, metadata))
        return True

    def _ensure_upload(self) -> str:
        if self._st.upload_id is None:
            self._st.start(self.metadata, self.algorithm)
        assert self._st.upload_id is not None
        return self._st.upload_id

    def _ensure_pool(self) -> cf.ThreadPoolExecutor:
        if self._st.pool is None:
            self._st.pool = cf.ThreadPoolExecutor(
                max_workers=self.max_concurrency, thread_name_prefix=self._st.thread_prefix
            )
        return self._st.pool

    def _ensure_spool(self) -> int | None:
        return self._st.spool(self.url, self.spool_dir) if self.spool else None

    def _reap(self, futures: set[cf.Future[UploadedPart]] | None = None) -> None:
        """Record finished uploads; raise the first failure."""
        done = {f for f in (futures if futures is not None else self._inflight) if f.done()}
        error: BaseException | None = None
        for part in self._parts.values():
            fut = part.future
            if fut is not None and fut in done:
                self._inflight.discard(fut)
                exc = fut.exception()
                if exc is not None:
                    part.upload_failed()
                    error = error or exc
                else:
                    part.finish_upload(fut.result())
        if error is not None:
            raise error

    def _submit(self, part: Part, length: int) -> None:
        """Store the first ``length`` bytes of a complete part (upload or copy)."""
        upload_id = self._ensure_upload()
        pool = self._ensure_pool()
        spool_fd = self._ensure_spool()
        while len(self._inflight) >= self.max_concurrency:
            cf.wait(self._inflight, return_when=cf.FIRST_COMPLETED)
            self._reap()
        self._held.pop(part.index, None)
        content: PartContent = part.content(length)
        fut = pool.submit(self._transfer.store, upload_id, content, spool_fd)
        part.start_upload(fut)
        self._inflight.add(fut)

    def _reload(self, part: Part) -> None:
        """Bring an uploaded part back into memory so it can be rewritten."""
        if part.future is not None:
            cf.wait([part.future])
            self._reap({part.future})
        assert part.uploaded is not None and self._st.spool_fd is not None
        if part.uploaded.copied is not None:  # copied by the service: not in the spool
            part.rereference(part.uploaded.copied)
            return
        length = part.uploaded.length
        data = os.pread(self._st.spool_fd, length, part.index * self.part_size)
        if len(data) != length:  # pragma: no cover - the spool is ours alone
            raise StorageError(f"{self.url}: spool file is short for part {part.index + 1}")
        part.reload(data, self.part_size)

    def wait_uploads(self) -> None:
        """Block until every part upload in flight has finished; raise the first failure
        (which discards the writer, as any failure does)."""
        with self._lock:
            self._check_open("wait for uploads")
            try:
                cf.wait(self._inflight)
                self._reap()
            except BaseException as exc:
                self._abandon(f"a part upload failed: {exc}")
                raise

    # -- primitives -----------------------------------------------------------------------

    def _check_write(self, offset: int, end: int) -> None:
        """Refuse, before anything changes, what this writer cannot publish."""
        psize = self.part_size
        limit = largest_object(psize)
        if end > limit:
            raise ConfigurationError(
                f"{self.url}: write ending at byte {end} exceeds the largest object this writer "
                f"can publish, part_size * {MAX_DATA_PARTS} = {limit} bytes; "
                "use a larger part_size"
            )
        if self.spool:
            return
        for idx in range(offset // psize, (end - 1) // psize + 1):
            p = self._parts.get(idx)
            if p is not None and p.in_storage:
                raise ConfigurationError(
                    f"{self.url}: part {idx + 1} (bytes {idx * psize}..{(idx + 1) * psize}) "
                    "was already uploaded and cannot be rewritten with spool=False (open the "
                    "writer with spool=True to rewrite uploaded parts)"
                )

    def _each_part(self, offset: int, end: int, fill: Callable[[Part, int, int], None]) -> None:
        """``fill(part, rel, n)`` for each part piece of ``[offset, end)``, then store the
        parts it completed (a rewritten part waits: ``_held``)."""
        psize = self.part_size
        self._check_write(offset, end)
        self._reap()
        pos = offset
        while pos < end:
            idx, rel = divmod(pos, psize)
            n = min(psize - rel, end - pos)
            part = self._parts.setdefault(idx, Part(idx))
            rewrite = part.in_storage
            if rewrite:
                self._reload(part)
            fill(part, rel, n)
            if rewrite or part.index in self._held:
                self._held[part.index] = None
            elif part.covered() == psize:
                self._submit(part, psize)
            pos += n
        self._bound_held()

    def _write(self, data: memoryview, offset: int) -> None:
        def fill(part: Part, rel: int, n: int) -> None:
            pos = part.index * self.part_size + rel - offset
            part.write(rel, data[pos : pos + n], self.part_size)

        self._each_part(offset, offset + data.nbytes, fill)

    def _bound_held(self) -> None:
        while len(self._held) > self.max_concurrency:  # bound re-dirtied parts in memory
            self._submit(self._parts[next(iter(self._held))], self.part_size)

    # -- server-side copies ---------------------------------------------------------------

    def copy_source(self, loader: DataLoader) -> S3Source | None:
        """The object ``copy_from(loader, ...)`` lets the service copy, or None when the
        bytes must travel through the client: the loader is not an S3 object, or not on
        this writer's endpoint with the same credentials (see :mod:`ptestore._s3source`)."""
        if self._identity is None:
            self._identity = s3_identity(self.conn.fs)
        return matching_source(loader, self._identity)

    def _copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        # A range S3 could never copy (no part is one run of more than MIN_PART_SIZE
        # source bytes) of a source held in memory (a small object, read whole) is taken
        # from memory now rather than read again by a GET at upload time.
        in_memory = getattr(loader, "in_memory", False) and size <= config.MIN_PART_SIZE
        source = None if in_memory else self.copy_source(loader)
        if source is None:  # through the client, in pieces: refused whole, first
            self._check_write(dst_offset, dst_offset + size)
            super()._copy_from(loader, src_offset, size, dst_offset)
            return

        def fill(part: Part, rel: int, n: int) -> None:
            pos = part.index * self.part_size + rel
            part.reference(Ref(rel, rel + n, source, src_offset + pos - dst_offset))

        self._each_part(dst_offset, dst_offset + size, fill)

    @property
    def checksum_degraded(self) -> bool:
        """True when a part copied by the service came back without its checksum (moto,
        some S3-compatible servers): the object is then published without the
        full-object checksum, and the check after publishing covers its size and this
        writer's token only (``PublishResult.checksum`` is None)."""
        return any(p.uploaded is not None and p.uploaded.crc is None for p in self._parts.values())

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        self._reap()
        psize = self.part_size
        nparts = (size + psize - 1) // psize
        if self._st.upload_id is None and nparts <= 1:
            return self._publish_small(mode, size)
        for idx in range(nparts):
            part = self._parts.setdefault(idx, Part(idx))
            if not part.in_storage:  # held, or never written: zeros
                self._submit(part, min(psize, size - idx * psize))
        cf.wait(self._inflight)
        self._reap()
        parts: list[dict[str, Any]] = []
        stored: list[UploadedPart] = []
        for idx in range(nparts):
            up = self._parts[idx].uploaded
            assert up is not None
            entry: dict[str, Any] = {"PartNumber": idx + 1, "ETag": up.etag}
            if up.crc is not None:
                entry.update(param(self.algorithm, up.crc))
            parts.append(entry)
            stored.append(up)
        total = full_object(self.algorithm, [(up.crc, up.length) for up in stored])
        if total is None:
            log.warning(
                "%s: the service returned no %s for parts it copied; publishing without "
                "the full-object checksum (size and writer token are still checked)",
                self._where(),
                self.algorithm,
            )
        upload_id = self._st.upload_id
        assert upload_id is not None
        check_copied_sources(self.conn, self._parts.values())
        self._commit_point()
        resp = self._publisher.complete(mode, upload_id, size, parts, total, self._expected)
        self._st.completed()
        self._st.cleanup()
        return self._publisher.verify_published(resp, size, total, mode)

    def _publish_small(self, mode: PublishMode, size: int) -> PublishResult:
        """An output of at most one part: one PutObject (referenced bytes read first)."""
        part = self._parts.setdefault(0, Part(0))
        body = bytes(size)
        if part.held:
            body = bytes(self._transfer.materialize(part.content(size)))
        self._commit_point()
        resp, crc = self._publisher.put(mode, body, self._expected)
        self._st.cleanup()
        return self._publisher.verify_published(resp, size, crc, mode)
