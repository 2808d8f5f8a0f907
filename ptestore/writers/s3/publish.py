"""Publishing an S3 object: the conditional PutObject or CompleteMultipartUpload, the
reconciliation of lost answers, and the verifying HEAD.

- ``mode="create"`` sends ``If-None-Match: *``: the service refuses to replace.
- ``mode="if-match"`` sends ``If-Match: <ETag>``: the service replaces only that
  version; its refusal (412, 409 ``ConditionalRequestConflict``, 404 for no object) is
  :class:`~ptestore.errors.PreconditionFailed` with the ETag found by a ``HEAD``.
- A 200 answer carrying an ``<Error>`` is the error it is (retried when transient).
- A retried call meeting ``PreconditionFailed`` or ``NoSuchUpload`` (the first attempt
  succeeded, its answer was lost) is reconciled with a ``HEAD`` looking for this
  writer's token (``x-amz-meta-ptestore-writer``).
- Each attempt that failed in a way that may have taken effect (:func:`may_have_applied`:
  its answer lost to a timeout or a connection closed after sending, a 5xx other than
  503) is remembered. Once one did, however the call ends (a refusal: 412, 409, 404; a
  last attempt failing: 503, 500, the endpoint unreachable; one attempt answered 500) a
  ``HEAD`` looks for this writer's token: there, the publish succeeded; not there (or
  the ``HEAD`` failing), :class:`~ptestore.errors.PublishUncertain`, never "nothing was
  published": our object may have landed and been replaced since.
- Afterwards a ``HEAD`` with ``ChecksumMode=ENABLED`` checks size, checksum (the
  writer's algorithm, :mod:`.checksum`) and token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..._log import get_logger
from ..._retry import Category, classify, error_code, to_storage_error
from ..._retry.categories import NOT_FOUND_CODES, TRANSIENT_CODES, find_error_info
from ...errors import ConfigurationError, IntegrityError, PublishUncertain, StorageError
from ..base import PublishMode, PublishResult, already_exists, version_conflict
from .checksum import encode, param, part_checksum, published_checksum
from .config import S3Connection

__all__ = ["TOKEN_METADATA_KEY", "S3Publisher", "checked_metadata", "may_have_applied"]

log = get_logger("ptestore.writers.s3")

#: User-metadata key (``x-amz-meta-ptestore-writer``) holding the writer's token.
TOKEN_METADATA_KEY = "ptestore-writer"
_RECONCILABLE = ("PreconditionFailed", "NoSuchUpload", "ConditionalRequestConflict")
#: Codes of a 5xx answer that may come after the request was carried out.
_MAYBE_DONE_CODES = frozenset({"InternalError"})


class _Attempts:
    """The attempts of one publish call: the first failure that may have taken effect."""

    def __init__(self) -> None:
        self.retried = False
        #: The first attempt's failure that may have published (None: none may have).
        self.lost: BaseException | None = None

    def run(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return fn()
        except Exception as exc:
            if self.lost is None and may_have_applied(exc):
                self.lost = exc
            raise

    def note_retry(self) -> None:
        self.retried = True


class S3Publisher:
    """Makes one object visible and checks it (one per writer)."""

    def __init__(
        self,
        url: str,
        conn: S3Connection,
        bucket: str,
        key: str,
        *,
        metadata: dict[str, str],
        token: str,
        verify: bool,
        algorithm: str = "CRC32",
    ) -> None:
        self.url = url
        self.conn = conn
        self.bucket = bucket
        self.key = key
        self.where = f"s3://{bucket}/{key}"
        self.metadata = metadata
        self.token = token
        self.verify = verify
        self.algorithm = algorithm

    def put(
        self, mode: PublishMode, body: bytes, expected: str | None = None
    ) -> tuple[dict[str, Any], int]:
        """Publish a small output with one PutObject; ``(answer, checksum)``."""
        size, crc = len(body), part_checksum(self.algorithm, body)
        extra: dict[str, Any] = {**self.conn.create_extras, **_condition(mode, expected)}
        attempts = _Attempts()

        def put() -> dict[str, Any]:
            return self.conn.invoke(
                "put_object",
                Bucket=self.bucket,
                Key=self.key,
                Body=body,
                Metadata=self.metadata,
                # the algorithm named too: some servers (moto) keep a checksum only then
                ChecksumAlgorithm=self.algorithm,
                **param(self.algorithm, crc),
                **extra,
            )

        try:
            resp = self.conn.call(
                "PutObject", lambda: attempts.run(put), on_retry=attempts.note_retry
            )
        except Exception as exc:
            resp = self._reconcile(exc, "PutObject", mode, size, attempts, expected)
        return resp, crc

    def complete(
        self,
        mode: PublishMode,
        upload_id: str,
        size: int,
        parts: list[dict[str, Any]],
        crc: int | None,
        expected: str | None = None,
    ) -> dict[str, Any]:
        """Complete the multipart upload: ascending parts, full-object checksum (when
        every part's is known), size."""
        extra: dict[str, Any] = {**self.conn.extras, **_condition(mode, expected)}
        if crc is not None:
            extra.update(param(self.algorithm, crc))
        attempts = _Attempts()

        def complete() -> dict[str, Any]:
            resp = self.conn.invoke(
                "complete_multipart_upload",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                ChecksumType="FULL_OBJECT",
                MpuObjectSize=size,
                **extra,
            )
            if not resp.get("ETag"):  # a 200 whose body was an error botocore did not catch
                raise StorageError(f"{self.where}: CompleteMultipartUpload returned no ETag")
            return resp

        op = "CompleteMultipartUpload"
        try:
            resp = self.conn.call(op, lambda: attempts.run(complete), on_retry=attempts.note_retry)
        except Exception as exc:
            resp = self._reconcile(exc, op, mode, size, attempts, expected)
        return resp

    def head(self) -> dict[str, Any] | None:
        """``HEAD`` of the object with its checksum, or None if it does not exist."""
        try:
            return self.conn.request(
                "HeadObject",
                "head_object",
                Bucket=self.bucket,
                Key=self.key,
                ChecksumMode="ENABLED",
                **self.conn.extras,
            )
        except Exception as exc:
            if classify(exc) is Category.NOT_FOUND:
                return None
            raise

    def _ours(self, head: dict[str, Any] | None, size: int) -> bool:
        return (
            head is not None
            and head.get("Metadata", {}).get(TOKEN_METADATA_KEY) == self.token
            and int(head.get("ContentLength", -1)) == size
        )

    def _reconcile(
        self,
        exc: BaseException,
        operation: str,
        mode: PublishMode,
        size: int,
        attempts: _Attempts,
        expected: str | None = None,
    ) -> dict[str, Any]:
        """A publish call failed: find out whether our object is there anyway."""
        code = error_code(exc)
        where = self.where
        if code is None and _maybe_sent(exc):
            # The last attempt may have reached the service (connection closed or timed
            # out after sending): the object may exist. Ask, and never say "nothing".
            try:
                head = self.head()
            except Exception as head_exc:
                head, note = None, f"; the follow-up HEAD failed ({head_exc})"
            else:
                note = ""
            if self._ours(head, size):
                log.info("%s: %s failed (%s), but our object is in place", where, operation, exc)
                assert head is not None
                return head
            raise PublishUncertain(
                f"{where}: {operation} failed after its retries on a connection error "
                f"({type(exc).__name__}: {exc}){note}; the request may have reached the "
                "service: the destination holds the old object or this writer's"
            ) from exc
        conflict = mode == "if-match" and code in (*_RECONCILABLE, *NOT_FOUND_CODES)
        if code not in _RECONCILABLE and not conflict:
            if attempts.lost is None:  # every attempt turned away before doing anything
                raise to_storage_error(exc, where, operation) from exc
            return self._after_failure(exc, operation, size, attempts.lost)
        try:
            head = self.head()
        except Exception as head_exc:
            raise PublishUncertain(
                f"{where}: {operation} answered {code} and the follow-up HEAD failed "
                f"({head_exc}); the destination holds the old object or this writer's"
            ) from exc
        if self._ours(head, size):
            log.info("%s: %s answered %s, but our object is in place", where, operation, code)
            assert head is not None
            return head
        if code == "NoSuchUpload":
            raise PublishUncertain(
                f"{where}: the multipart upload is gone (NoSuchUpload) and the object does not "
                "carry this writer's token: either it completed and another writer replaced it "
                "since, or the upload was aborted (by gc or a lifecycle rule)"
                + (" after a retried Complete" if attempts.retried else "")
            ) from exc
        if attempts.lost is not None:  # a refusal of our retry, maybe of our own object
            lead = f"a retry of {operation} was refused ({_describe(exc)})"
            message = _lost_message(where, lead, exc, attempts.lost, _found(head))
            raise PublishUncertain(message) from exc
        if (
            code in ("PreconditionFailed", "ConditionalRequestConflict")
            and mode == "create"
            and (head is not None or code == "PreconditionFailed")
        ):
            raise already_exists(where) from exc
        if conflict:
            assert expected is not None
            found = None if head is None else str(head.get("ETag"))
            reason = (
                f"the service answered {code}: a concurrent write" if found == expected else None
            )
            raise version_conflict(where, expected, found, "storage", reason) from exc
        raise to_storage_error(exc, where, operation) from exc

    def _after_failure(
        self, exc: BaseException, operation: str, size: int, lost: BaseException
    ) -> dict[str, Any]:
        """The last attempt failed (``exc``: a 503, a 500, the endpoint unreachable...)
        after an attempt that may have published (``lost``, maybe ``exc`` itself): the
        last failure says nothing of that one, so ask. This writer's token there: the
        publish succeeded; else uncertain, never "nothing was published"."""
        try:
            head = self.head()
        except Exception as head_exc:
            found = f"the follow-up HEAD failed ({_describe(head_exc)})"
        else:
            if self._ours(head, size):
                log.info(
                    "%s: %s failed (%s), but our object is in place", self.where, operation, exc
                )
                assert head is not None
                return head
            found = _found(head)
        lead = f"{operation} failed ({_describe(exc)})"
        raise PublishUncertain(_lost_message(self.where, lead, exc, lost, found)) from exc

    def verify_published(
        self, resp: dict[str, Any], size: int, crc: int | None, mode: PublishMode = "overwrite"
    ) -> PublishResult:
        """The :class:`PublishResult`, after checking the stored object (``verify``);
        with ``crc`` None (unknown) only its size and token, and no checksum reported.
        An object replaced right after a conditional write (``create``, ``if-match``:
        the writers coordinate by compare-and-swap, the index's small objects) is logged
        at DEBUG: the next writer's swap, not a surprise; after an overwrite, a warning."""
        url, where = self.url, self.where
        etag = resp.get("ETag")
        version = resp.get("VersionId")
        if not self.verify:
            return PublishResult(url, size, etag, version, None)
        try:
            head = self.head()
        except Exception as exc:
            log.warning("%s: published, but the integrity check could not run: %s", where, exc)
            return PublishResult(url, size, etag, version, None)
        if head is None or head.get("Metadata", {}).get(TOKEN_METADATA_KEY) != self.token:
            log.log(
                logging.WARNING if mode == "overwrite" else logging.DEBUG,
                "%s: published, but replaced or deleted by someone else since%s",
                where,
                ""
                if mode == "overwrite"
                else f" (a conditional write, {mode}: another writer's came after it)",
            )
            return PublishResult(url, size, etag, version, None)
        actual_size = int(head.get("ContentLength", -1))
        if actual_size != size:
            raise IntegrityError(
                f"{where}: published object has {actual_size} bytes, but {size} were written"
            )
        if crc is None:
            return PublishResult(
                url, size, head.get("ETag", etag), head.get("VersionId", version), None
            )
        algorithm = self.algorithm
        stored = head.get(f"Checksum{algorithm}")
        if stored is not None and "-" not in str(stored) and stored != encode(algorithm, crc):
            raise IntegrityError(
                f"{where}: published object has {algorithm} {stored}, but the bytes written "
                f"have {encode(algorithm, crc)}"
            )
        return PublishResult(
            url,
            size,
            head.get("ETag", etag),
            head.get("VersionId", version),
            published_checksum(algorithm, crc),
        )


def _condition(mode: PublishMode, expected: str | None) -> dict[str, str]:
    """The conditional-write parameter of a publish in ``mode``."""
    if mode == "create":
        return {"IfNoneMatch": "*"}
    if mode == "if-match":
        assert expected is not None
        return {"IfMatch": expected}
    return {}


def may_have_applied(exc: BaseException) -> bool:
    """Whether a failed attempt of a publish call may have taken effect: its answer was
    lost after the request was sent (:func:`_maybe_sent`), or the service answered a
    server error that can come after the work was done (500 ``InternalError``, a 502 or
    504 of a proxy in front of it). Not a 503 (``SlowDown``, ``ServiceUnavailable``), a
    throttling code, 408/``RequestTimeout`` or any 4xx: the request was turned away
    before anything was done."""
    info = find_error_info(exc)
    if info is None or (info.code is None and info.status is None):
        return _maybe_sent(exc)
    if info.code in _MAYBE_DONE_CODES:
        return True
    if info.code in TRANSIENT_CODES:
        return False
    return info.status is not None and info.status >= 500 and info.status != 503


def _describe(exc: BaseException) -> str:
    info = find_error_info(exc)
    return info.describe() if info is not None else f"{type(exc).__name__}: {exc}"


def _found(head: dict[str, Any] | None) -> str:
    """What a ``HEAD`` that did not show this writer's token found, in words."""
    if head is None:
        return "there is no object there now"
    return f"the object there now (ETag {head.get('ETag')}) is not this writer's"


def _lost_message(
    where: str, lead: str, exc: BaseException, lost: BaseException, found: str
) -> str:
    """The :class:`PublishUncertain` of a publish call whose last attempt failed
    (``lead``: ``exc`` in words) after an attempt that may have published (``lost``,
    ``exc`` itself when its answer may come after the work was done): what the service
    answered, what was lost, what is there now (``found``)."""
    if lost is exc:
        cause = (
            "an answer the service may give after doing the write, so that attempt may have "
            "published this writer's output"
        )
    else:
        cause = (
            f"but an earlier attempt's answer was lost ({_describe(lost)}) and that attempt "
            "may have published this writer's output"
        )
    return (
        f"{where}: {lead}, {cause}; {found}: this writer's output may have been published and "
        "replaced or deleted since, or never published. Read the object before redoing "
        "the change (a blind retry could apply it twice)"
    )


def _maybe_sent(exc: BaseException) -> bool:
    """Whether a failed call may have reached the service: botocore's HTTP client errors
    (connection closed, read timeout, broken response) may have been sent; its
    connection errors (endpoint unreachable, connect timeout, proxy) were not."""
    try:
        from botocore.exceptions import ConnectionError as NotConnected
        from botocore.exceptions import HTTPClientError
    except ImportError:  # pragma: no cover - s3 extra missing
        return False
    if isinstance(exc, NotConnected):
        return False
    return isinstance(exc, (HTTPClientError, TimeoutError, ConnectionResetError))


def checked_metadata(url: str, metadata: Mapping[str, str]) -> dict[str, str]:
    """``metadata`` as a dict, after checking it is str to str and leaves the writer's
    token key alone."""
    meta = dict(metadata)
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ConfigurationError(f"{url}: metadata keys and values must be str: {k!r}")
    if TOKEN_METADATA_KEY in {k.lower() for k in meta}:
        raise ConfigurationError(f"{url}: metadata key {TOKEN_METADATA_KEY!r} is reserved")
    return meta
