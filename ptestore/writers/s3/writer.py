"""S3Writer: a multipart upload on a fixed part grid, completed atomically at publish.

A part is uploaded (in a bounded thread pool, ``max_concurrency`` in flight) as soon
as every byte of it has been written, in any order; only partially written parts are
buffered in memory. Parts never written are uploaded as zeros at publish. Outputs of
at most one part go up as a single PutObject. Rewriting a part that is already
uploaded needs ``spool=True`` (uploaded parts kept in an unlinked local temp file).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import tempfile
import uuid
import zlib
from typing import Any, ClassVar

from ..._retry import RETRY_OPTIONS, to_storage_error
from ...errors import ConfigurationError, StorageError
from ...loaders import split_url
from ..base import DataWriter, PublishMode, PublishResult, WriterGuarantees
from . import config
from .checksum import b64crc, crc32_combine
from .config import DEFAULT_PART_SIZE, S3Connection, check_part_size, largest_object
from .marker import MARKER_PART_NUMBER, MAX_DATA_PARTS, marker_bytes
from .parts import Part, PartState, UploadedPart
from .publish import TOKEN_METADATA_KEY, S3Publisher
from .staging import S3Staging

__all__ = ["S3Writer"]

#: Options of the writer itself (the rest are s3fs's).
WRITER_OPTIONS = frozenset(
    {"part_size", "max_concurrency", "metadata", "spool", "spool_dir", "verify", *RETRY_OPTIONS}
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
        HEAD the object after publishing and check size, CRC32 and writer token.
    retry_attempts, retry_initial, retry_max:
        The :class:`~ptestore._retry.RetryPolicy` of every S3 call.
    storage_options:
        Passed to ``s3fs.S3FileSystem`` (``endpoint_url``, ``key``, ``secret``,
        ``token``, ``anon``, ``profile``, ``client_kwargs``, ``config_kwargs``,
        ``s3_additional_kwargs``, ``requester_pays``, ``use_ssl``, ``session``, ...).
    """

    guarantees: ClassVar[WriterGuarantees] = WriterGuarantees(
        atomic_publish=True, exclusive_create=True, durable=True, verified=True
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
        meta = dict(metadata or {})
        for k, v in meta.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigurationError(f"{url}: metadata keys and values must be str: {k!r}")
        if TOKEN_METADATA_KEY in {k.lower() for k in meta}:
            raise ConfigurationError(f"{url}: metadata key {TOKEN_METADATA_KEY!r} is reserved")
        self.bucket, self.key = bucket, key
        self.max_concurrency = max_concurrency
        self.spool = spool
        self.spool_dir = spool_dir
        self.verify = verify
        #: Random token stored as ``x-amz-meta-ptestore-writer`` to recognise our object.
        self.token = uuid.uuid4().hex
        self.metadata = {**meta, TOKEN_METADATA_KEY: self.token}
        self.conn = S3Connection(url, storage_options, pool_size=max_concurrency + 4)
        #: s3fs's botocore client (register event hooks on ``client.meta.events``).
        self.client = self.conn.client
        self._publisher = S3Publisher(
            url, self.conn, bucket, key, metadata=self.metadata, token=self.token, verify=verify
        )
        self._parts: dict[int, Part] = {}
        self._inflight: set[cf.Future[UploadedPart]] = set()
        self._held: dict[int, None] = {}  # re-dirtied complete parts awaiting upload (ordered)
        self._st = S3Staging(self.conn, bucket, key)
        self._track_staging(self._st)

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

    def _request(self, what: str, operation: str, **params: Any) -> dict[str, Any]:
        try:
            return self.conn.request(what, operation, **params)
        except Exception as exc:
            raise to_storage_error(exc, self._where(), what) from exc

    def _ensure_upload(self) -> str:
        if self._st.upload_id is not None:
            return self._st.upload_id
        resp = self._request(
            "CreateMultipartUpload",
            "create_multipart_upload",
            Bucket=self.bucket,
            Key=self.key,
            Metadata=self.metadata,
            ChecksumAlgorithm="CRC32",
            ChecksumType="FULL_OBJECT",
            **self.conn.create_extras,
        )
        upload_id: str = resp["UploadId"]
        self._st.upload_id = upload_id
        body = marker_bytes(self.key)
        self._request(
            "UploadPart (gc marker)",
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=upload_id,
            PartNumber=MARKER_PART_NUMBER,
            Body=body,
            ChecksumCRC32=b64crc(zlib.crc32(body)),
            **self.conn.extras,
        )
        return upload_id

    def _ensure_pool(self) -> cf.ThreadPoolExecutor:
        if self._st.pool is None:
            self._st.pool = cf.ThreadPoolExecutor(
                max_workers=self.max_concurrency, thread_name_prefix=self._st.thread_prefix
            )
        return self._st.pool

    def _ensure_spool(self) -> int | None:
        if not self.spool:
            return None
        if self._st.spool_fd is None:
            try:
                fd, name = tempfile.mkstemp(prefix="ptestore-s3-spool-", dir=self.spool_dir)
            except OSError as exc:
                raise StorageError(
                    f"{self.url}: cannot create the local spool file: {exc.strerror or exc}"
                ) from exc
            os.unlink(name)  # anonymous: vanishes when closed or on a crash
            self._st.spool_fd = fd
        return self._st.spool_fd

    def _upload_task(
        self, upload_id: str, index: int, data: bytearray, spool_fd: int | None
    ) -> UploadedPart:
        length = len(data)
        crc = zlib.crc32(data)
        if spool_fd is not None:
            view = memoryview(data)
            done = 0
            while done < length:
                done += os.pwrite(spool_fd, view[done:], index * self.part_size + done)
        resp = self._request(
            f"UploadPart {index + 1}",
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=upload_id,
            PartNumber=index + 1,
            Body=data,
            ChecksumCRC32=b64crc(crc),
            **self.conn.extras,
        )
        return UploadedPart(str(resp["ETag"]), crc, length)

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

    def _submit(self, part: Part, data: bytearray) -> None:
        upload_id = self._ensure_upload()
        pool = self._ensure_pool()
        spool_fd = self._ensure_spool()
        while len(self._inflight) >= self.max_concurrency:
            cf.wait(self._inflight, return_when=cf.FIRST_COMPLETED)
            self._reap()
        self._held.pop(part.index, None)
        fut = pool.submit(self._upload_task, upload_id, part.index, data, spool_fd)
        part.start_upload(fut)
        self._inflight.add(fut)

    def _reload(self, part: Part) -> None:
        """Bring an uploaded part back into memory so it can be rewritten."""
        if part.future is not None:
            cf.wait([part.future])
            self._reap({part.future})
        assert part.uploaded is not None and self._st.spool_fd is not None
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

    def _write(self, data: memoryview, offset: int) -> None:
        psize = self.part_size
        self._check_write(offset, offset + data.nbytes)
        self._reap()
        pos, n = 0, data.nbytes
        while pos < n:
            idx, rel = divmod(offset + pos, psize)
            m = min(psize - rel, n - pos)
            part = self._parts.setdefault(idx, Part(idx))
            rewrite = part.in_storage
            if rewrite:
                self._reload(part)
            buf = part.buffer(psize)
            buf[rel : rel + m] = data[pos : pos + m]
            part.add_range(rel, rel + m)
            if rewrite or part.index in self._held:
                self._held[part.index] = None
            elif part.covered() == psize:
                self._submit(part, buf)
            pos += m
        while len(self._held) > self.max_concurrency:  # bound re-dirtied parts in memory
            p = self._parts[next(iter(self._held))]
            self._submit(p, p.buffer(psize))

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        self._reap()
        psize = self.part_size
        nparts = (size + psize - 1) // psize
        if self._st.upload_id is None and nparts <= 1:
            part = self._parts.get(0)
            buf = part.buf if part is not None and part.state is PartState.BUFFERED else None
            body = bytes(buf[:size]) if buf is not None else bytes(size)
            self._commit_point()
            resp, crc = self._publisher.put(mode, body)
            self._st.cleanup()
            return self._publisher.verify_published(resp, size, crc)
        for idx in range(nparts):
            length = min(psize, size - idx * psize)
            part = self._parts.setdefault(idx, Part(idx))
            if part.state is PartState.BUFFERED:
                buf = part.buffer(psize)
                del buf[length:]
                self._submit(part, buf)
            elif part.state is PartState.EMPTY:
                self._submit(part, bytearray(length))
        cf.wait(self._inflight)
        self._reap()
        parts: list[dict[str, Any]] = []
        crc = 0
        for idx in range(nparts):
            up = self._parts[idx].uploaded
            assert up is not None
            parts.append({"PartNumber": idx + 1, "ETag": up.etag, "ChecksumCRC32": b64crc(up.crc)})
            crc = crc32_combine(crc, up.crc, up.length) if idx else up.crc
        upload_id = self._st.upload_id
        assert upload_id is not None
        self._commit_point()
        resp = self._publisher.complete(mode, upload_id, size, parts, crc)
        self._st.completed()
        self._st.cleanup()
        return self._publisher.verify_published(resp, size, crc)
