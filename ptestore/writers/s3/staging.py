"""What an S3 writer has staged: the pending multipart upload (created with its gc
marker part by ``start()``, which also aborts what a retried create left behind, and the
upload of a create interrupted while in flight), the upload pool and the local spool
file. ``cleanup()`` aborts the upload; it knows nothing of the writer (it runs from the
writer's finalizer)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import secrets
import tempfile
import threading
import time
from typing import Any

from ..._log import get_logger
from ..._retry import Category, classify, error_code, to_storage_error
from ...errors import StorageError
from ...storage.types import strerror
from .checksum import param, part_checksum
from .config import S3Connection
from .marker import MARKER_PART_NUMBER, marker_bytes
from .strays import abort_strays

__all__ = ["LATE_ANSWER", "S3Staging"]

log = get_logger("ptestore.writers.s3")

#: Abort rounds: parts still arriving when Abort ran may survive it.
_ABORT_ROUNDS = 3
#: Seconds an interrupted writer waits for the answer of the CreateMultipartUpload it
#: was waiting for, to abort the upload it made.
LATE_ANSWER = 10.0


class S3Staging:
    """The pending upload (``upload_id``), the part pool and the spool descriptor."""

    def __init__(self, conn: S3Connection, bucket: str, key: str) -> None:
        self.conn = conn
        self.bucket = bucket
        self.key = key
        self.upload_id: str | None = None
        self.pool: cf.ThreadPoolExecutor | None = None
        self.spool_fd: int | None = None
        #: Name prefix of this writer's upload threads.
        self.thread_prefix = f"ptestore-s3-{secrets.token_hex(4)}"
        self._lock = threading.Lock()

    def _request(self, what: str, operation: str, **params: Any) -> dict[str, Any]:
        try:
            return self.conn.request(what, operation, **params)
        except Exception as exc:
            raise to_storage_error(exc, f"s3://{self.bucket}/{self.key}", what) from exc

    def start(self, metadata: dict[str, str], algorithm: str) -> str:
        """Create the multipart upload (with the object's metadata and a FULL_OBJECT
        checksum of ``algorithm``) and upload its gc marker part. A create that needed
        more than one attempt may have left uploads the service made for an earlier
        attempt whose answer was lost: those are aborted (:mod:`.strays`)."""
        retried = False

        def note_retry() -> None:
            nonlocal retried
            retried = True

        params = {
            "Bucket": self.bucket,
            "Key": self.key,
            "Metadata": metadata,
            "ChecksumAlgorithm": algorithm,
            "ChecksumType": "FULL_OBJECT",
            **self.conn.create_extras,
        }

        def create() -> dict[str, Any]:
            future = self.conn.submit("create_multipart_upload", **params)
            try:
                return future.result()
            except BaseException as exc:
                if not isinstance(exc, Exception):  # interrupted while it was in flight
                    self._abort_late(future)
                raise

        started = time.monotonic()
        try:
            resp = self.conn.call("CreateMultipartUpload", create, on_retry=note_retry)
        except Exception as exc:
            where = f"s3://{self.bucket}/{self.key}"
            raise to_storage_error(exc, where, "CreateMultipartUpload") from exc
        took = time.monotonic() - started
        upload_id = resp.get("UploadId")
        if not isinstance(upload_id, str) or not upload_id:
            raise StorageError(
                f"s3://{self.bucket}/{self.key}: the CreateMultipartUpload answer has no "
                "UploadId: the upload cannot be used, nothing is published; an upload the "
                "service made stays pending (it has no gc marker part) until an "
                "AbortIncompleteMultipartUpload lifecycle rule removes it"
            )
        self.upload_id = upload_id
        body = marker_bytes(self.key)
        self._request(
            "UploadPart (gc marker)",
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=upload_id,
            PartNumber=MARKER_PART_NUMBER,
            Body=body,
            **param(algorithm, part_checksum(algorithm, body)),  # a part of the upload's kind
            **self.conn.extras,
        )
        if retried:  # after the marker: another writer's sweep never takes ours
            abort_strays(self.conn, self.bucket, self.key, upload_id, took)
        return upload_id

    def _abort_late(self, future: cf.Future[dict[str, Any]]) -> None:
        """An interrupt (Ctrl-C, or SIGTERM under ``termination_as_interrupt``) came
        while CreateMultipartUpload was in flight: s3fs's loop finishes the request, and
        the upload it makes would be named to nobody, with no gc marker part for
        ``ptestore gc`` to prove it ptestore's. Wait up to :data:`LATE_ANSWER` seconds
        for the answer and abort the upload it names (a second interrupt ends the wait)."""
        where = f"s3://{self.bucket}/{self.key}"
        try:
            resp = future.result(timeout=LATE_ANSWER)
        except cf.TimeoutError:
            log.warning(
                "%s: interrupted while CreateMultipartUpload was in flight, and its answer "
                "did not come within %gs: the upload it may have made stays pending (it has "
                "no gc marker part) until an AbortIncompleteMultipartUpload lifecycle rule "
                "removes it",
                where,
                LATE_ANSWER,
            )
            return
        except Exception:  # the create failed: there is no upload
            return
        upload_id = resp.get("UploadId")
        if not isinstance(upload_id, str):
            return
        try:
            self.abort(upload_id)
        except Exception as exc:
            log.warning("%s: interrupted while creating upload %s: %s", where, upload_id, exc)
        else:
            log.info("%s: interrupted; aborted upload %s, created meanwhile", where, upload_id)

    def spool(self, url: str, spool_dir: str | os.PathLike[str] | None) -> int:
        """The spool file's descriptor, created on first use (unlinked at once: it
        vanishes when closed or on a crash)."""
        if self.spool_fd is None:
            try:
                fd, name = tempfile.mkstemp(prefix="ptestore-s3-spool-", dir=spool_dir)
            except OSError as exc:
                raise StorageError(
                    f"{url}: cannot create the local spool file: {strerror(exc)}"
                ) from exc
            os.unlink(name)
            self.spool_fd = fd
        return self.spool_fd

    def completed(self) -> None:
        """The upload became the object: nothing left to abort."""
        self.upload_id = None

    def cleanup(self) -> None:
        with self._lock:
            pool, self.pool = self.pool, None
            if pool is not None:
                # The last reference to an abandoned writer may be dropped by one of its
                # own upload threads, which then runs this finalizer: it cannot wait for
                # itself (parts still landing after Abort are handled by the rounds below).
                own = threading.current_thread().name.startswith(self.thread_prefix)
                pool.shutdown(wait=not own, cancel_futures=True)
            if self.spool_fd is not None:
                fd, self.spool_fd = self.spool_fd, None
                os.close(fd)
            upload_id, self.upload_id = self.upload_id, None
        if upload_id is not None:
            self.abort(upload_id)

    def abort(self, upload_id: str) -> None:
        where = f"s3://{self.bucket}/{self.key}"
        params = {"Bucket": self.bucket, "Key": self.key, "UploadId": upload_id}
        # AbortMultipartUpload takes no SSE-C keys (botocore refuses them before sending);
        # ListParts of an SSE-C upload needs them.
        abort = {**params, **self.conn.plain_extras}
        params.update(self.conn.extras)
        for _ in range(_ABORT_ROUNDS):
            try:
                self.conn.request("AbortMultipartUpload", "abort_multipart_upload", **abort)
            except Exception as exc:
                if not _no_such_upload(exc):
                    detail = str(to_storage_error(exc, where, "AbortMultipartUpload"))
                    raise StorageError(
                        f"{where}: cannot abort multipart upload {upload_id}: "
                        f"{detail.removeprefix(where + ': ')}; it stays pending until "
                        "`ptestore gc` or a lifecycle rule removes it"
                    ) from exc
            try:
                parts = self.conn.request("ListParts", "list_parts", **params)
            except Exception as exc:
                if _no_such_upload(exc) or classify(exc) is not Category.TRANSIENT:
                    return
                raise StorageError(
                    f"{where}: cannot confirm that upload {upload_id} was aborted: {exc}"
                ) from exc
            if not parts.get("Parts"):
                return


def _no_such_upload(exc: BaseException) -> bool:
    return error_code(exc) == "NoSuchUpload"
