"""The S3 writer's own check of its copy sources, after the last part copy and before
Complete (the service's ``CopySourceIfMatch`` is the first line: :mod:`.transfer`).

Its refusal is :class:`~ptestore.errors.PreconditionFailed` with ``refused_by``
``"ptestore"``; a copy the service refused has ``refused_by`` ``"storage"`` and says
which call answered 412, so a test (and a log reader) can tell the two apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._retry import to_storage_error
from ...errors import ObjectNotFound, PreconditionFailed
from .config import S3Connection
from .parts import Part

__all__ = ["check_copied_sources"]


def check_copied_sources(conn: S3Connection, parts: Iterable[Part]) -> None:
    """Ask the service once more, after the last part copy and before Complete,
    whether every object it copied from is still the version read at the start.

    ``CopySourceIfMatch`` already makes AWS and SeaweedFS refuse a copy of a changed
    source; a service that ignores it (moto) would otherwise publish a mix of two
    versions when the source is replaced between the run's last check and a part
    copied at publish."""
    sources = {
        p.uploaded.copied.source
        for p in parts
        if p.uploaded is not None and p.uploaded.copied is not None
    }
    # A pinned version cannot change: every copy names it (``CopySource.VersionId``).
    unpinned = [s for s in sources if not s.version_id]
    for source in sorted(unpinned, key=lambda s: (s.bucket, s.key)):
        what = f"HEAD of the copy source {source.url}"
        try:
            head = conn.request(what, "head_object", Bucket=source.bucket, Key=source.key)
        except Exception as exc:
            error = to_storage_error(exc, source.url, "HEAD after the last part copy")
            if isinstance(error, ObjectNotFound):
                raise PreconditionFailed(
                    f"{source.url}: deleted since it was opened (ETag {source.etag}); parts "
                    "copied from it may mix two versions: the run stops before Complete",
                    url=source.url,
                    expected=source.etag,
                    refused_by="ptestore",
                ) from exc
            raise error from exc
        etag = head.get("ETag")
        if etag != source.etag:
            raise PreconditionFailed(
                f"{source.url}: replaced since it was opened (ETag {source.etag} -> "
                f"{etag}, checked after the last part copy): the run stops before "
                "Complete instead of publishing a mix of two versions",
                url=source.url,
                expected=source.etag,
                found=None if etag is None else str(etag),
                refused_by="ptestore",
            )
