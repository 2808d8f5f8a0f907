"""S3: a multipart upload on a fixed part grid, completed atomically at publish.

Guarantees (AWS S3 and compatibles that implement conditional writes):

- **Atomic**: the object does not exist until ``CompleteMultipartUpload`` (or the single
  ``PutObject`` used for outputs of at most one part) succeeds; readers see the old or
  the complete new object.
- **Durable**: once publish returns, as durable as S3 makes it.
- **Isolated**: pending parts are invisible to readers and listings.
- **No-clobber**: ``mode="create"`` sends ``If-None-Match: *`` on Complete/PutObject, so
  the service refuses to replace an existing object, between any number of clients.
- **Integrity**: every part carries its checksum (CRC64NVME by default, what S3 stores
  for uploads without one; CRC-32 without ``awscrt``); Complete asserts the full-object
  checksum (``ChecksumType=FULL_OBJECT``, combined from the parts', copied ones
  included) and ``MpuObjectSize``; after publishing, a ``HEAD`` with
  ``ChecksumMode=ENABLED`` checks size, checksum and this writer's token.
- **Server-side copies**: ``copy_from`` a loader of an S3 object on the same endpoint
  with the same credentials records the range instead of reading it; each part that is
  one contiguous source range is copied by the service (``UploadPartCopy``) pinned with
  ``CopySourceIfMatch`` (the ETag read at the start) and the ``VersionId``; parts that
  mix sources or straddle written bytes read the unchanged bytes with pinned ranged GETs.
  A source replaced mid-run fails the run (:class:`~ptestore.errors.PreconditionFailed`).
- **Cleanup**: discard, garbage collection and interpreter exit abort the upload. A
  crash leaves it pending (billed, invisible): add a lifecycle rule
  ``AbortIncompleteMultipartUpload`` and/or run ``ptestore gc s3://bucket/prefix``,
  which aborts only uploads carrying ptestore's marker part.

Modules: :mod:`.config` (the s3fs connection, limits), :mod:`.checksum` (the writer's
checksum algorithm; the arithmetic is :mod:`ptestore.checksums`), :mod:`.marker` (the
gc marker), :mod:`.parts` (the part grid and its states), :mod:`.staging` (the pending
upload and its abort), :mod:`.strays` (the uploads a retried create left behind),
:mod:`.listing` (pending uploads page by page), :mod:`.publish` (publish, reconcile,
verify), :mod:`.transfer`
(storing a part: upload or server-side copy), :mod:`.writer` (:class:`S3Writer`).

Retries: one layer, :class:`ptestore._retry.RetryPolicy`; botocore's own retries are off
(``total_max_attempts=1``) unless ``config_kwargs`` sets ``retries``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_names

if TYPE_CHECKING:
    from .checksum import crc32_combine
    from .config import DEFAULT_PART_SIZE, MAX_PART_SIZE, MIN_PART_SIZE, S3Connection
    from .marker import MARKER_PART_NUMBER, MAX_DATA_PARTS, is_marker_part, marker_bytes
    from .parts import Part, PartContent, PartState, Ref, UploadedPart
    from .publish import TOKEN_METADATA_KEY
    from .writer import S3Writer


__all__ = [
    "DEFAULT_PART_SIZE",
    "MARKER_PART_NUMBER",
    "MAX_DATA_PARTS",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "TOKEN_METADATA_KEY",
    "Part",
    "PartContent",
    "PartState",
    "Ref",
    "S3Connection",
    "S3Writer",
    "UploadedPart",
    "crc32_combine",
    "is_marker_part",
    "marker_bytes",
]

#: Every public name imported on first use (PEP 562): importing the package takes
#: none of its submodules' import locks, so two threads' first imports of the
#: package and of one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    "crc32_combine": "checksum",
    "DEFAULT_PART_SIZE": "config",
    "MAX_PART_SIZE": "config",
    "MIN_PART_SIZE": "config",
    "S3Connection": "config",
    "MARKER_PART_NUMBER": "marker",
    "MAX_DATA_PARTS": "marker",
    "is_marker_part": "marker",
    "marker_bytes": "marker",
    "Part": "parts",
    "PartContent": "parts",
    "PartState": "parts",
    "Ref": "parts",
    "UploadedPart": "parts",
    "TOKEN_METADATA_KEY": "publish",
    "S3Writer": "writer",
}

__getattr__ = lazy_names(__name__, _LAZY)
