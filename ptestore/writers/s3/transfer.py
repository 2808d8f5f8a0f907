"""Storing one complete part: an upload of its bytes, or a copy by the service.

A part whose bytes are all one contiguous range of one source object larger than 5 MiB
(S3 copies ranges only from such sources) is copied by S3
(``UploadPartCopy`` with ``CopySourceRange``), pinned to the version read at the start:
``CopySourceIfMatch`` is the source's ETag (and ``CopySource`` carries its ``VersionId``
in a versioned bucket), so a source replaced during the run fails the run with
:class:`~ptestore.errors.PreconditionFailed` instead of mixing two versions.

A part that is such a range except for a few small written runs (the zero padding
between segments, at most :data:`VERIFY_LIMIT` bytes in :data:`VERIFY_RUNS` runs) reads
those source bytes back (pinned) and is copied when they are equal. Every other part
travels through the client: its referenced ranges are read with pinned ranged GETs
(``IfMatch``, ``VersionId``) and the assembled bytes uploaded with their CRC-32.

Answers are checked as the loader checks its own (:mod:`ptestore.storage.pinned`): an
``UploadPart`` answer names the part's ETag (:data:`PART_NOT_NAMED`, else a
:class:`~ptestore.errors.StorageError` naming the object, the part and the header); a
source's ranged GET is read no further than the range and one byte, holds the range
asked for, and names the ETag the source was opened with (else
:class:`~ptestore.errors.IntegrityError`, a StorageError, or
:class:`~ptestore.errors.PreconditionFailed`), none of them retried.

Checksums (of the writer's algorithm, :mod:`.checksum`): an uploaded part's is computed
here. A copied part's is the ``CopyPartResult.Checksum<algorithm>`` of the answer, which
S3 returns because the upload was created with that ``ChecksumAlgorithm``; a server that
returns none (moto) leaves it unknown, and the writer then publishes without the
full-object checksum (see :meth:`ptestore.writers.s3.S3Writer.checksum_degraded`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..._retry import to_storage_error
from ...errors import IntegrityError, PreconditionFailed, StorageError
from ...storage.pinned import answer_etag, answered_range, longer_body_message, other_range_message
from . import config
from .checksum import answer_checksum, param, part_checksum
from .config import S3Connection
from .parts import PartContent, Ref, UploadedPart

if TYPE_CHECKING:
    from ...storage._s3source import S3Source

__all__ = ["PART_NOT_NAMED", "VERIFY_LIMIT", "VERIFY_RUNS", "PartTransfer"]

#: Written bytes of a part that are compared with the source to let it be copied.
VERIFY_LIMIT = 64 << 10
#: Written runs of a part that are compared with the source (one ranged GET each).
VERIFY_RUNS = 16
#: What follows from a part's answer without a usable ETag.
PART_NOT_NAMED = "the part cannot be named in CompleteMultipartUpload, nothing is published"


class PartTransfer:
    """Stores complete parts into one pending upload (runs in the writer's pool)."""

    def __init__(
        self, conn: S3Connection, bucket: str, key: str, part_size: int, algorithm: str = "CRC32"
    ) -> None:
        self.conn = conn
        self.algorithm = algorithm
        self.bucket = bucket
        self.key = key
        self.part_size = part_size
        self.where = f"s3://{bucket}/{key}"
        #: Parameters of reads from a source (requester pays; never the destination's
        #: SSE-C keys).
        self.read_extras: dict[str, Any] = conn.plain_extras

    def _request(self, what: str, operation: str, **params: Any) -> dict[str, Any]:
        try:
            return self.conn.request(what, operation, **params)
        except Exception as exc:
            raise to_storage_error(exc, self.where, what) from exc

    # -- entry point ----------------------------------------------------------------------

    def store(self, upload_id: str, content: PartContent, spool_fd: int | None) -> UploadedPart:
        """Copy the part server-side if it is one source range, else upload it."""
        run = content.one_run()
        # S3 copies a range only from a source larger than 5 MB (AWS: InvalidRequest).
        if run is not None and run[0].size > config.MIN_PART_SIZE:
            source, delta = run
            if not content.written or self._written_match(content, source, delta):
                return self.copy(upload_id, content.index, source, delta, content.length)
        return self.upload(upload_id, content.index, self.materialize(content), spool_fd)

    def materialize(self, content: PartContent) -> bytearray:
        """The part's bytes: the written ones, and the referenced ones read (pinned)."""
        data = content.assemble()
        for ref in _merged(content.refs):
            data[ref.start : ref.end] = self.read(ref.source, ref.src_offset, ref.end - ref.start)
        return data

    # -- the three requests ---------------------------------------------------------------

    def upload(
        self, upload_id: str, index: int, data: bytearray, spool_fd: int | None
    ) -> UploadedPart:
        """UploadPart with the bytes' checksum (kept in the spool when there is one)."""
        length = len(data)
        crc = part_checksum(self.algorithm, data)
        if spool_fd is not None:
            view = memoryview(data)
            done = 0
            while done < length:
                done += os.pwrite(spool_fd, view[done:], index * self.part_size + done)
        what = f"UploadPart {index + 1}"
        resp = self._request(
            what,
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=upload_id,
            PartNumber=index + 1,
            Body=data,
            **param(self.algorithm, crc),
            **self.conn.extras,
        )
        return UploadedPart(answer_etag(resp, self.where, what, PART_NOT_NAMED), crc, length)

    def copy(
        self, upload_id: str, index: int, source: S3Source, first: int, length: int
    ) -> UploadedPart:
        """UploadPartCopy of source bytes ``[first, first + length)``, pinned."""
        what = f"UploadPartCopy {index + 1} from {source.url}"
        try:
            resp = self.conn.request(
                what,
                "upload_part_copy",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                PartNumber=index + 1,
                CopySource=source.copy_source(),
                CopySourceRange=f"bytes={first}-{first + length - 1}",
                CopySourceIfMatch=source.etag,
                **self.conn.extras,
            )
        except Exception as exc:
            raise self._source_error(exc, source, what) from exc
        version = resp.get("CopySourceVersionId")
        if source.version_id and version and version != source.version_id:
            raise IntegrityError(  # before Complete: the upload is aborted, nothing published
                f"{self.where}: part {index + 1} was copied from version {version} of "
                f"{source.url}, not from the version read at the start ({source.version_id})",
                published=False,
            )
        result = resp.get("CopyPartResult") or {}
        etag = answer_etag(
            result, self.where, f"UploadPartCopy {index + 1}", PART_NOT_NAMED, "CopyPartResult.ETag"
        )
        crc = answer_checksum(self.algorithm, result)
        return UploadedPart(etag, crc, length, Ref(0, length, source, first))

    def read(self, source: S3Source, offset: int, size: int) -> bytes:
        """Ranged GET of the source version read at the start (``IfMatch``,
        ``VersionId``), its body read no further than ``size`` bytes and one; the answer
        must hold that range and name the source's ETag."""
        what = f"read of {size} bytes at offset {offset} of {source.url}"
        end = offset + size
        params = {
            "Bucket": source.bucket,
            "Key": source.key,
            "Range": f"bytes={offset}-{end - 1}",
            **source.pin(),
            **self.read_extras,
        }
        try:
            resp, data = self.conn.call(
                what, lambda: self.conn.invoke_read("get_object", max_bytes=size, **params)
            )
        except Exception as exc:
            raise self._source_error(exc, source, what) from exc
        etag = answer_etag(resp, source.url, "GetObject")
        if etag != source.etag:  # a server that ignored If-Match
            raise _replaced(source, what, f"answered ETag {etag}", etag)
        other = answered_range(resp, offset, end)
        if other is not None:
            raise IntegrityError(
                other_range_message(source.url, offset, end, other), published=False
            )
        if len(data) > size:
            raise IntegrityError(longer_body_message(source.url, offset, end), published=False)
        if len(data) != size:
            raise StorageError(
                f"{source.url}: short read: wanted {size} bytes at offset {offset}, got {len(data)}"
            )
        return data

    # -- helpers --------------------------------------------------------------------------

    def _written_match(self, content: PartContent, source: S3Source, delta: int) -> bool:
        """True if the few written bytes equal the source's at the same offsets."""
        if content.written_bytes() > VERIFY_LIMIT:
            return False
        pieces = content.pieces()
        if len(pieces) > VERIFY_RUNS:
            return False
        return all(
            data == self.read(source, start + delta, len(data)) for start, data in pieces if data
        )

    def _source_error(self, exc: BaseException, source: S3Source, what: str) -> StorageError:
        error = to_storage_error(exc, self.where, what)
        if isinstance(error, PreconditionFailed):
            return _replaced(source, what, "answered 412", None)
        return error


def _replaced(source: S3Source, what: str, answer: str, found: str | None) -> PreconditionFailed:
    """``source`` replaced since it was opened: the storage refused ``what`` (412), or
    its answer named another ETag (``found``: a server that ignored the pin)."""
    return PreconditionFailed(
        f"{source.url}: replaced since it was opened (ETag {source.etag} no longer matches; "
        f"{what} {answer}): the run stops instead of mixing two versions",
        url=source.url,
        expected=source.etag,
        found=found,
        refused_by="storage" if found is None else "ptestore",
    )


def _merged(refs: tuple[Ref, ...]) -> list[Ref]:
    """Adjacent references of one contiguous source range, joined (one GET each)."""
    out: list[Ref] = []
    for r in sorted(refs, key=lambda r: r.start):
        last = out[-1] if out else None
        if (
            last is not None
            and last.end == r.start
            and last.source == r.source
            and last.delta == r.delta
        ):
            out[-1] = Ref(last.start, r.end, last.source, last.src_offset)
        else:
            out.append(r)
    return out
