"""S3: a multipart upload on a fixed part grid, completed atomically at publish.

Guarantees (AWS S3 and compatibles that implement conditional writes):

- **Atomic**: the object does not exist until ``CompleteMultipartUpload`` (or the single
  ``PutObject`` used for outputs of at most one part) succeeds; readers see the old or
  the complete new object.
- **Durable**: once publish returns, as durable as S3 makes it.
- **Isolated**: pending parts are invisible to readers and listings.
- **No-clobber**: ``mode="create"`` sends ``If-None-Match: *`` on Complete/PutObject, so
  the service refuses to replace an existing object, between any number of clients.
- **Integrity**: every part carries its CRC32; Complete asserts the full-object CRC32
  (``ChecksumType=FULL_OBJECT``) and ``MpuObjectSize``; after publishing, a ``HEAD``
  with ``ChecksumMode=ENABLED`` checks size, checksum and this writer's token.
- **Cleanup**: discard, garbage collection and interpreter exit abort the upload. A
  crash leaves it pending (billed, invisible): add a lifecycle rule
  ``AbortIncompleteMultipartUpload`` and/or run ``ptestore gc s3://bucket/prefix``,
  which aborts only uploads carrying ptestore's marker part.

Data path: byte ``o`` belongs to part ``o // part_size + 1``. A part is uploaded (in a
bounded thread pool, ``max_concurrency`` in flight) as soon as every byte of it has
been written, in any order; only partially written parts are buffered in memory.
Parts never written are uploaded as zeros at publish. A part rewritten after upload is
reloaded from a local spool file (an unlinked temp file holding uploaded parts; disable
with ``spool=False`` when outputs are written once) and re-uploaded. The largest object
is ``part_size * 9999`` bytes (part 10000 holds the gc marker); S3 requires every part
but the last to be at least 5 MiB.

Retries: one layer, tenacity with jittered exponential backoff, for 5xx, SlowDown,
throttling, timeouts and connection resets; botocore's own retries are off
(``total_max_attempts=1``) unless ``config_kwargs`` says otherwise. Other 4xx answers
(AccessDenied, NoSuchBucket, PreconditionFailed) are never retried.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import hashlib
import logging
import os
import tempfile
import threading
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec

from ..errors import (
    AlreadyExists,
    ConfigurationError,
    IntegrityError,
    ObjectNotFound,
    PreconditionFailed,
    PublishUncertain,
    StorageError,
)
from ..loaders import _client_error_info, call_with_retries, is_transient, split_url
from .base import DataWriter, PublishMode, PublishResult

__all__ = [
    "DEFAULT_PART_SIZE",
    "MARKER_PART_NUMBER",
    "TOKEN_METADATA_KEY",
    "S3Config",
    "S3Writer",
    "crc32_combine",
    "is_marker_part",
    "marker_bytes",
]

log = logging.getLogger("ptestore.writers.s3")
T = TypeVar("T")

DEFAULT_PART_SIZE = 8 << 20
MAX_PART_SIZE = 5 << 30
#: Part number of the gc marker; data parts use 1..9999.
MARKER_PART_NUMBER = 10000
MAX_DATA_PARTS = MARKER_PART_NUMBER - 1
#: User-metadata key (``x-amz-meta-ptestore-writer``) holding the writer's token.
TOKEN_METADATA_KEY = "ptestore-writer"

# -- checksums ------------------------------------------------------------------------

_POLY = 0xEDB88320  # reflected CRC-32 (zlib, S3 "CRC32")


def _multmodp(a: int, b: int) -> int:
    """Multiply two polynomials modulo the CRC-32 polynomial (reflected bit order)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial: the operator that shifts a CRC over n zero bytes."""
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's algorithm)."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


def _b64crc(value: int) -> str:
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def marker_bytes(key: str) -> bytes:
    """Content of the gc marker part for ``key``: recognisable, never part of an object."""
    return f"ptestore multipart upload marker v1\n{key}\n".encode()


def is_marker_part(key: str, part: dict[str, Any]) -> bool:
    """True if a ``ListParts`` entry is ptestore's marker part for ``key``.

    Compares the part's CRC32 and, as ETags are MD5s of the bytes unless SSE-KMS/SSE-C
    is used, its ETag.
    """
    if part.get("PartNumber") != MARKER_PART_NUMBER:
        return False
    body = marker_bytes(key)
    if part.get("ChecksumCRC32") == _b64crc(zlib.crc32(body)):
        return True
    etag = str(part.get("ETag", "")).strip('"')
    return bool(etag) and etag == hashlib.md5(body, usedforsecurity=False).hexdigest()


# -- configuration and client ---------------------------------------------------------

#: s3fs options that only affect s3fs's own caching/reading and have no meaning here.
_IGNORED_S3FS_OPTIONS = frozenset(
    {
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "version_aware",
        "cache_regions",
        "asynchronous",
        "loop",
        "listings_expiry_time",
        "skip_instance_cache",
        "use_listings_cache",
        "max_paths",
        "fixed_upload_size",
        "max_concurrency",
    }
)
_SSE_C_KEYS = ("SSECustomerAlgorithm", "SSECustomerKey", "SSECustomerKeyMD5")


def _error_code(exc: BaseException) -> str | None:
    info = _client_error_info(exc)
    return info[0] if info else None


def map_client_error(exc: BaseException, where: str, operation: str) -> StorageError:
    """Translate a botocore/transport failure into ptestore's error categories."""
    if isinstance(exc, StorageError):
        return exc
    info = _client_error_info(exc)
    code, status = info if info else (None, None)
    detail = f"{operation} failed"
    if code is not None:
        detail += f": {code}"
    if status is not None:
        detail += f" (HTTP {status})"
    message = getattr(exc, "response", {}).get("Error", {}).get("Message") if info else None
    text = f"{where}: {detail}: {message}" if message else f"{where}: {detail}: {exc}"
    if code in ("NoSuchBucket", "NoSuchKey", "NotFound") or status == 404:
        return ObjectNotFound(text)
    if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
        return PreconditionFailed(text)
    return StorageError(text)


@dataclass
class S3Config:
    """Connection settings in s3fs's vocabulary (so existing storage options work)."""

    url: str
    endpoint_url: str | None = None
    key: str | None = None
    secret: str | None = None
    token: str | None = None
    anon: bool = False
    profile: str | None = None
    use_ssl: bool = True
    requester_pays: bool = False
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    s3_additional_kwargs: dict[str, Any] = field(default_factory=dict)
    retry_attempts: int = 6
    retry_initial: float = 0.1
    retry_max: float = 5.0

    @classmethod
    def from_options(cls, url: str, options: dict[str, Any]) -> S3Config:
        """Build from s3fs-style storage options (fsspec's ``s3`` config as defaults)."""
        merged: dict[str, Any] = dict(fsspec.config.conf.get("s3", {}))
        merged.update(options)
        if "username" in merged:
            merged.setdefault("key", merged.pop("username"))
        if "password" in merged:
            merged.setdefault("secret", merged.pop("password"))
        if merged.pop("session", None) is not None:
            raise ConfigurationError(
                f"{url}: the 'session' option (an aiobotocore session) is not supported; pass "
                "key/secret/token or profile instead"
            )
        for name in _IGNORED_S3FS_OPTIONS & set(merged):
            merged.pop(name)
        known = {f for f in cls.__dataclass_fields__ if f != "url"}
        unknown = set(merged) - known
        if unknown:
            raise ConfigurationError(
                f"{url}: unknown S3 storage options {sorted(unknown)} (accepted: "
                f"{sorted(known | {'part_size', 'metadata', 'spool', 'verify'})})"
            )
        return cls(url=url, **merged)

    def make_client(self, max_pool_connections: int = 10) -> Any:
        """A boto3 S3 client with botocore's retries off (tenacity is the retry layer)."""
        try:
            import boto3
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                f"{self.url}: S3 needs boto3: install ptestore[s3] ({exc})"
            ) from exc
        conf: dict[str, Any] = {
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "max_pool_connections": max_pool_connections,
        }
        conf.update(self.config_kwargs)
        if self.anon:
            conf["signature_version"] = UNSIGNED
        client_kwargs = dict(self.client_kwargs)
        if self.endpoint_url is not None:
            client_kwargs["endpoint_url"] = self.endpoint_url
        if not self.use_ssl:
            client_kwargs["use_ssl"] = False
        try:
            session = boto3.session.Session(profile_name=self.profile)
            return session.client(
                "s3",
                aws_access_key_id=self.key,
                aws_secret_access_key=self.secret,
                aws_session_token=self.token,
                config=Config(**conf),
                **client_kwargs,
            )
        except Exception as exc:
            raise ConfigurationError(f"{self.url}: cannot create an S3 client: {exc}") from exc

    def request_extras(self) -> dict[str, Any]:
        """Parameters every request on the object needs (requester pays, SSE-C)."""
        extras: dict[str, Any] = {
            k: v for k, v in self.s3_additional_kwargs.items() if k in _SSE_C_KEYS
        }
        if self.requester_pays:
            extras["RequestPayer"] = "requester"
        return extras


def call_s3(
    cfg: S3Config, fn: Callable[[], T], before_sleep: Callable[[Any], None] | None = None
) -> T:
    """Run one S3 call, retrying transient failures only."""
    return call_with_retries(
        fn,
        attempts=cfg.retry_attempts,
        initial=cfg.retry_initial,
        maximum=cfg.retry_max,
        before_sleep=before_sleep,
    )


# -- staging ----------------------------------------------------------------------------


class _S3Staging:
    """The pending upload, the part pool and the spool file. Knows nothing of the writer."""

    def __init__(self, cfg: S3Config, client: Any, bucket: str, key: str) -> None:
        self.cfg = cfg
        self.client = client
        self.bucket = bucket
        self.key = key
        self.upload_id: str | None = None
        self.pool: cf.ThreadPoolExecutor | None = None
        self.spool_fd: int | None = None
        self._lock = threading.Lock()

    def cleanup(self) -> None:
        with self._lock:
            pool, self.pool = self.pool, None
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if self.spool_fd is not None:
                fd, self.spool_fd = self.spool_fd, None
                os.close(fd)
            upload_id, self.upload_id = self.upload_id, None
        if upload_id is not None:
            self.abort(upload_id)

    def abort(self, upload_id: str) -> None:
        where = f"s3://{self.bucket}/{self.key}"
        extras = self.cfg.request_extras()
        for _ in range(3):  # parts still arriving when Abort ran may survive it: repeat
            try:
                call_s3(
                    self.cfg,
                    lambda: self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=self.key, UploadId=upload_id, **extras
                    ),
                )
            except Exception as exc:
                if _error_code(exc) != "NoSuchUpload":
                    detail = str(map_client_error(exc, where, "AbortMultipartUpload"))
                    raise StorageError(
                        f"{where}: cannot abort multipart upload {upload_id}: "
                        f"{detail.removeprefix(where + ': ')}; it stays pending until "
                        "`ptestore gc` or a lifecycle rule removes it"
                    ) from exc
            try:
                parts = call_s3(
                    self.cfg,
                    lambda: self.client.list_parts(
                        Bucket=self.bucket, Key=self.key, UploadId=upload_id, **extras
                    ),
                )
            except Exception as exc:
                if _error_code(exc) == "NoSuchUpload" or not is_transient(exc):
                    return
                raise StorageError(
                    f"{where}: cannot confirm that upload {upload_id} was aborted: {exc}"
                ) from exc
            if not parts.get("Parts"):
                return


@dataclass
class _Part:
    index: int
    buf: bytearray | None = None
    #: Written ranges relative to the part start: sorted, disjoint, merged.
    ranges: list[tuple[int, int]] = field(default_factory=list)
    #: (ETag, CRC32, length) of the uploaded copy.
    uploaded: tuple[str, int, int] | None = None
    future: cf.Future[tuple[str, int, int]] | None = None

    def add_range(self, start: int, end: int) -> None:
        out: list[tuple[int, int]] = []
        for s, e in self.ranges:
            if e < start or s > end:
                out.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        out.append((start, end))
        out.sort()
        self.ranges = out

    def covered(self) -> int:
        return sum(e - s for s, e in self.ranges)


class S3Writer(DataWriter):
    """Writer for ``s3://bucket/key`` (see the module docstring for guarantees).

    Parameters
    ----------
    url:
        ``s3://bucket/key``.
    part_size:
        Multipart part size in bytes (default 8 MiB; S3 needs >= 5 MiB for all parts but
        the last). The largest object is ``part_size * 9999``.
    max_concurrency:
        Parts uploaded in parallel (and so, with partially written parts, what bounds
        memory).
    metadata:
        User metadata (``x-amz-meta-*``) attached to the object.
    spool:
        Keep uploaded parts in an unlinked local temp file so that rewriting an uploaded
        part works (default true). With ``spool=False`` such a rewrite raises
        :class:`~ptestore.errors.ConfigurationError`.
    spool_dir:
        Directory of the spool file (default: the system temp dir).
    verify:
        HEAD the object after publishing and check size, CRC32 and writer token.
    storage_options:
        s3fs-style options: ``endpoint_url``, ``key``, ``secret``, ``token``, ``anon``,
        ``profile``, ``client_kwargs``, ``config_kwargs``, ``s3_additional_kwargs``
        (e.g. ``ContentType``, ``ServerSideEncryption``), ``requester_pays``,
        ``use_ssl``; and ``retry_attempts``. Credentials not given come from boto3's
        usual chain (environment, profile, instance role).
    """

    def __init__(
        self,
        url: str,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        max_concurrency: int = 4,
        metadata: dict[str, str] | None = None,
        spool: bool = True,
        spool_dir: str | None = None,
        verify: bool = True,
        **storage_options: Any,
    ) -> None:
        super().__init__(url)
        protocol, rest = split_url(url)
        bucket, _, key = rest.partition("/")
        if protocol != "s3" or not bucket or not key or key.endswith("/"):
            raise ConfigurationError(f"{url}: expected s3://bucket/key")
        if (
            isinstance(part_size, bool)
            or not isinstance(part_size, int)
            or not (1 <= part_size <= MAX_PART_SIZE)
        ):
            raise ConfigurationError(
                f"{url}: part_size must be an int in [1, {MAX_PART_SIZE}], got {part_size!r}"
            )
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or (max_concurrency < 1)
        ):
            raise ConfigurationError(
                f"{url}: max_concurrency must be an int >= 1, got {max_concurrency!r}"
            )
        meta = dict(metadata or {})
        for k, v in meta.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigurationError(f"{url}: metadata keys and values must be str: {k!r}")
        if TOKEN_METADATA_KEY in {k.lower() for k in meta}:
            raise ConfigurationError(f"{url}: metadata key {TOKEN_METADATA_KEY!r} is reserved")
        self.bucket, self.key = bucket, key
        self.part_size = part_size
        self.max_concurrency = max_concurrency
        self.spool = spool
        self.spool_dir = spool_dir
        self.verify = verify
        #: Random token stored as ``x-amz-meta-ptestore-writer`` to recognise our object.
        self.token = uuid.uuid4().hex
        self.metadata = {**meta, TOKEN_METADATA_KEY: self.token}
        self.cfg = S3Config.from_options(url, storage_options)
        self.client = self.cfg.make_client(max_pool_connections=max_concurrency + 4)
        self._extras = self.cfg.request_extras()
        self._parts: dict[int, _Part] = {}
        self._inflight: set[cf.Future[tuple[str, int, int]]] = set()
        self._held: dict[int, None] = {}  # re-dirtied complete parts awaiting upload (ordered)
        self._st = _S3Staging(self.cfg, self.client, bucket, key)
        self._track_staging(self._st)

    @property
    def upload_id(self) -> str | None:
        """Id of the pending multipart upload, once one was started."""
        return self._st.upload_id

    # -- helpers --------------------------------------------------------------------------

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        try:
            return call_s3(self.cfg, fn)
        except Exception as exc:
            raise map_client_error(exc, self._where(), operation) from exc

    def _ensure_upload(self) -> str:
        if self._st.upload_id is not None:
            return self._st.upload_id
        extra = {k: v for k, v in self.cfg.s3_additional_kwargs.items()}
        extra.update(self._extras)
        resp = self._call(
            "CreateMultipartUpload",
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket,
                Key=self.key,
                Metadata=self.metadata,
                ChecksumAlgorithm="CRC32",
                ChecksumType="FULL_OBJECT",
                **extra,
            ),
        )
        upload_id: str = resp["UploadId"]
        self._st.upload_id = upload_id
        body = marker_bytes(self.key)
        self._call(
            "UploadPart (gc marker)",
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                PartNumber=MARKER_PART_NUMBER,
                Body=body,
                ChecksumCRC32=_b64crc(zlib.crc32(body)),
                **self._extras,
            ),
        )
        return upload_id

    def _ensure_pool(self) -> cf.ThreadPoolExecutor:
        if self._st.pool is None:
            self._st.pool = cf.ThreadPoolExecutor(
                max_workers=self.max_concurrency, thread_name_prefix="ptestore-s3"
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
    ) -> tuple[str, int, int]:
        length = len(data)
        crc = zlib.crc32(data)
        if spool_fd is not None:
            view = memoryview(data)
            done = 0
            while done < length:
                done += os.pwrite(spool_fd, view[done:], index * self.part_size + done)
        resp = self._call(
            f"UploadPart {index + 1}",
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                PartNumber=index + 1,
                Body=data,
                ChecksumCRC32=_b64crc(crc),
                **self._extras,
            ),
        )
        return str(resp["ETag"]), crc, length

    def _reap(self, futures: set[cf.Future[tuple[str, int, int]]] | None = None) -> None:
        """Record finished uploads; raise the first failure."""
        done = {f for f in (futures if futures is not None else self._inflight) if f.done()}
        error: BaseException | None = None
        for part in self._parts.values():
            fut = part.future
            if fut is not None and fut in done:
                part.future = None
                self._inflight.discard(fut)
                exc = fut.exception()
                if exc is not None:
                    error = error or exc
                else:
                    part.uploaded = fut.result()
        if error is not None:
            raise error

    def _submit(self, part: _Part, data: bytearray) -> None:
        upload_id = self._ensure_upload()
        pool = self._ensure_pool()
        spool_fd = self._ensure_spool()
        while len(self._inflight) >= self.max_concurrency:
            cf.wait(self._inflight, return_when=cf.FIRST_COMPLETED)
            self._reap()
        part.buf = None
        part.uploaded = None
        self._held.pop(part.index, None)
        fut = pool.submit(self._upload_task, upload_id, part.index, data, spool_fd)
        part.future = fut
        self._inflight.add(fut)

    def _wait_part(self, part: _Part) -> None:
        if part.future is not None:
            cf.wait([part.future])
            self._reap({part.future})

    def _reload(self, part: _Part) -> None:
        """Bring an uploaded part back into memory so it can be rewritten."""
        self._wait_part(part)
        assert part.uploaded is not None
        assert self._st.spool_fd is not None
        length = part.uploaded[2]
        data = os.pread(self._st.spool_fd, length, part.index * self.part_size)
        if len(data) != length:  # pragma: no cover - the spool is ours alone
            raise StorageError(f"{self.url}: spool file is short for part {part.index + 1}")
        part.buf = bytearray(self.part_size)
        part.buf[:length] = data
        part.ranges = [(0, length)]

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

    def _write(self, data: memoryview, offset: int) -> None:
        psize = self.part_size
        end = offset + data.nbytes
        if end > psize * MAX_DATA_PARTS:
            raise ConfigurationError(
                f"{self.url}: write ending at byte {end} exceeds the largest object this writer "
                f"can publish, part_size * {MAX_DATA_PARTS} = {psize * MAX_DATA_PARTS} bytes; "
                "use a larger part_size"
            )
        first, last = offset // psize, (end - 1) // psize
        if not self.spool:
            for idx in range(first, last + 1):
                p = self._parts.get(idx)
                if p is not None and p.buf is None and (p.uploaded or p.future):
                    raise ConfigurationError(
                        f"{self.url}: part {idx + 1} (bytes {idx * psize}..{(idx + 1) * psize}) "
                        "was already uploaded and cannot be rewritten with spool=False"
                    )
        self._reap()
        pos = 0
        n = data.nbytes
        while pos < n:
            at = offset + pos
            idx, rel = divmod(at, psize)
            m = min(psize - rel, n - pos)
            part = self._parts.get(idx)
            if part is None:
                part = self._parts[idx] = _Part(idx)
            rewrite = part.buf is None and (part.uploaded is not None or part.future is not None)
            if rewrite:
                self._reload(part)
            elif part.buf is None:
                part.buf = bytearray(psize)
            assert part.buf is not None
            part.buf[rel : rel + m] = data[pos : pos + m]
            part.add_range(rel, rel + m)
            if rewrite or part.index in self._held:
                self._held[part.index] = None
            elif part.covered() == psize:
                self._submit(part, part.buf)
            pos += m
        while len(self._held) > self.max_concurrency:  # bound re-dirtied parts in memory
            idx = next(iter(self._held))
            p = self._parts[idx]
            assert p.buf is not None
            self._submit(p, p.buf)

    def _publish(self, mode: PublishMode, size: int) -> PublishResult:
        self._reap()
        psize = self.part_size
        nparts = (size + psize - 1) // psize
        if self._st.upload_id is None and nparts <= 1:
            return self._put_single(mode, size)
        for idx in range(nparts):
            length = min(psize, size - idx * psize)
            part = self._parts.get(idx)
            if part is None:
                part = self._parts[idx] = _Part(idx)
            if part.buf is not None:
                buf = part.buf
                del buf[length:]
                self._submit(part, buf)
            elif part.uploaded is None and part.future is None:
                self._submit(part, bytearray(length))
        cf.wait(self._inflight)
        self._reap()
        parts: list[dict[str, Any]] = []
        crc = 0
        for idx in range(nparts):
            up = self._parts[idx].uploaded
            assert up is not None
            etag, pcrc, length = up
            parts.append({"PartNumber": idx + 1, "ETag": etag, "ChecksumCRC32": _b64crc(pcrc)})
            crc = crc32_combine(crc, pcrc, length) if idx else pcrc
        return self._complete(mode, size, parts, crc)

    # -- publish paths --------------------------------------------------------------------

    def _put_single(self, mode: PublishMode, size: int) -> PublishResult:
        part = self._parts.get(0)
        body = bytes(part.buf[:size]) if part is not None and part.buf is not None else bytes(size)
        crc = zlib.crc32(body)
        extra: dict[str, Any] = dict(self.cfg.s3_additional_kwargs)
        extra.update(self._extras)
        if mode == "create":
            extra["IfNoneMatch"] = "*"
        retried = [False]

        def put() -> Any:
            return self.client.put_object(
                Bucket=self.bucket,
                Key=self.key,
                Body=body,
                Metadata=self.metadata,
                ChecksumCRC32=_b64crc(crc),
                **extra,
            )

        try:
            resp = call_s3(self.cfg, put, before_sleep=lambda _s: retried.__setitem__(0, True))
        except Exception as exc:
            resp = self._reconcile(exc, "PutObject", mode, size, retried[0])
        self._st.cleanup()
        return self._verify(resp, size, crc)

    def _complete(
        self, mode: PublishMode, size: int, parts: list[dict[str, Any]], crc: int
    ) -> PublishResult:
        upload_id = self._st.upload_id
        assert upload_id is not None
        extra: dict[str, Any] = dict(self._extras)
        if mode == "create":
            extra["IfNoneMatch"] = "*"
        retried = [False]

        def complete() -> Any:
            resp = self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                ChecksumType="FULL_OBJECT",
                ChecksumCRC32=_b64crc(crc),
                MpuObjectSize=size,
                **extra,
            )
            if not resp.get("ETag"):  # a 200 whose body was an error botocore did not catch
                raise StorageError(f"{self._where()}: CompleteMultipartUpload returned no ETag")
            return resp

        try:
            resp = call_s3(self.cfg, complete, before_sleep=lambda _s: retried.__setitem__(0, True))
        except Exception as exc:
            resp = self._reconcile(exc, "CompleteMultipartUpload", mode, size, retried[0])
        self._st.upload_id = None  # completed: nothing left to abort
        self._st.cleanup()
        return self._verify(resp, size, crc)

    def _head(self) -> dict[str, Any] | None:
        try:
            resp: dict[str, Any] = call_s3(
                self.cfg,
                lambda: self.client.head_object(
                    Bucket=self.bucket, Key=self.key, ChecksumMode="ENABLED", **self._extras
                ),
            )
        except Exception as exc:
            info = _client_error_info(exc)
            if info is not None and (info[0] in ("404", "NoSuchKey", "NotFound") or info[1] == 404):
                return None
            raise
        return resp

    def _reconcile(
        self, exc: BaseException, operation: str, mode: PublishMode, size: int, retried: bool
    ) -> dict[str, Any]:
        """A publish call failed: find out whether our object is there anyway."""
        code = _error_code(exc)
        where = self._where()
        if code not in ("PreconditionFailed", "NoSuchUpload", "ConditionalRequestConflict"):
            raise map_client_error(exc, where, operation) from exc
        try:
            head = self._head()
        except Exception as head_exc:
            raise PublishUncertain(
                f"{where}: {operation} answered {code} and the follow-up HEAD failed "
                f"({head_exc}); the destination holds the old object or this writer's"
            ) from exc
        if (
            head is not None
            and head.get("Metadata", {}).get(TOKEN_METADATA_KEY) == self.token
            and int(head.get("ContentLength", -1)) == size
        ):
            log.info("%s: %s answered %s, but our object is in place", where, operation, code)
            return head
        if (
            code in ("PreconditionFailed", "ConditionalRequestConflict")
            and mode == "create"
            and (head is not None or code == "PreconditionFailed")
        ):
            raise AlreadyExists(
                f"{where}: already exists; publish(mode='create') never replaces an existing object"
            ) from exc
        if code == "NoSuchUpload":
            raise PublishUncertain(
                f"{where}: the multipart upload is gone (NoSuchUpload) and the object does not "
                "carry this writer's token: either it completed and another writer replaced it "
                "since, or the upload was aborted (by gc or a lifecycle rule)"
                + (" after a retried Complete" if retried else "")
            ) from exc
        raise map_client_error(exc, where, operation) from exc

    def _verify(self, resp: dict[str, Any], size: int, crc: int) -> PublishResult:
        where = self._where()
        etag = resp.get("ETag")
        version = resp.get("VersionId")
        checksum = f"crc32:{_b64crc(crc)}"
        if not self.verify:
            return PublishResult(self.url, size, etag, version, None)
        try:
            head = self._head()
        except Exception as exc:
            log.warning("%s: published, but the integrity check could not run: %s", where, exc)
            return PublishResult(self.url, size, etag, version, None)
        if head is None or head.get("Metadata", {}).get(TOKEN_METADATA_KEY) != self.token:
            log.warning("%s: published, but replaced or deleted by someone else since", where)
            return PublishResult(self.url, size, etag, version, None)
        actual_size = int(head.get("ContentLength", -1))
        if actual_size != size:
            raise IntegrityError(
                f"{where}: published object has {actual_size} bytes, but {size} were written"
            )
        stored = head.get("ChecksumCRC32")
        if stored is not None and "-" not in str(stored) and stored != _b64crc(crc):
            raise IntegrityError(
                f"{where}: published object has CRC32 {stored}, but the bytes written have "
                f"{_b64crc(crc)}"
            )
        return PublishResult(
            self.url, size, head.get("ETag", etag), head.get("VersionId", version), checksum
        )
