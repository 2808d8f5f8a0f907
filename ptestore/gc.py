"""Garbage collection of ptestore's own leftovers after crashes.

Strictly scoped to what ptestore itself created:

- **Local**: staging files named ``.<name>.ptestore-<16 hex>.tmp`` (see
  :data:`~ptestore.writers.local.TEMP_NAME_RE`) whose mtime is older than
  ``older_than`` seconds *and* which no live writer holds: every local writer keeps an
  exclusive ``flock`` on its staging file, so a file we can lock belongs to a dead
  process. Nothing else is ever removed.
- **S3**: multipart uploads under the prefix, initiated more than ``older_than`` seconds
  ago, that carry ptestore's marker part: :class:`~ptestore.writers.S3Writer` uploads a
  tiny part number 10000 whose bytes are derived from the key (S3 offers no way to read
  metadata or tags of a pending upload, but ``ListParts`` returns each part's ETag and
  CRC32). The marker part is never listed at completion, so it is not part of any
  object. Uploads from other tools never carry it and are left alone.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import stat
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from ._dataclass import dataclass
from ._log import get_logger
from .errors import ConfigurationError
from .storage._options import check_options
from .storage.types import StorageURL, absolute_path, split_url, strerror
from .writers.local import TEMP_NAME_RE

if TYPE_CHECKING:
    from .writers.s3.config import S3Connection

__all__ = [
    "DEFAULT_OLDER_THAN",
    "GcEntry",
    "check_older_than",
    "collect_local",
    "collect_s3",
    "collect_stale",
    "server_now",
]

log = get_logger("ptestore.gc")

#: Beyond this many seconds between the client's clock and a response's ``Date``
#: header, ages of S3 uploads are measured against the server's clock.
CLOCK_SKEW_TOLERANCE = 5.0

#: Default minimum age (seconds) of a leftover before gc touches it: one day.
DEFAULT_OLDER_THAN = 86400.0


@dataclass(frozen=True)
class GcEntry:
    """One leftover found by gc and what was done with it."""

    #: Where it is: a file path, or ``s3://bucket/key?uploadId=...``.
    location: str
    #: ``"staging-file"``, ``"multipart-upload"``, ``"directory"`` (one gc could not
    #: list: always ``"failed: ..."``); for the fleet's orphans
    #: (:mod:`ptestore.fleet.orphans`) ``"shared-object"``, ``"artifact"``,
    #: ``"packed-weights"``, ``"packed-record"`` (:mod:`ptestore.fleet.packed`), ``"hold"``
    #: (:mod:`ptestore.fleet.holds`) or ``"index"`` (one that could not be read:
    #: ``"failed: ..."``, nothing removed).
    kind: str
    #: Age in seconds.
    age: float
    #: ``"removed"``, ``"would remove"`` (dry run), ``"skipped: ..."`` or ``"failed: ..."``.
    action: str
    #: Bytes held (file size, or total size of the upload's parts when known).
    size: int | None = None

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def check_older_than(older_than: object, name: str = "older_than") -> None:
    """Refuse an age limit that is not a finite number of seconds >= 0 (``name`` is the
    argument's name in the message)."""
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, (int, float))
        or not math.isfinite(older_than)
        or older_than < 0
    ):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds >= 0, got {older_than!r}"
        )


def _try_remove_local(path: str, dry_run: bool) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "skipped: already gone"
    except OSError as exc:
        return f"failed: cannot open: {strerror(exc)}"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return "skipped: in use by a live writer"
            return f"failed: cannot lock: {strerror(exc)}"
        if dry_run:
            return "would remove"
        try:
            os.unlink(path)
        except FileNotFoundError:
            return "skipped: already gone"
        except OSError as exc:
            return f"failed: {strerror(exc)}"
        return "removed"
    finally:
        os.close(fd)


def collect_local(
    path: str | os.PathLike[str],
    *,
    older_than: float = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
) -> list[GcEntry]:
    """Remove ptestore's stale staging files under ``path``.

    ``path`` is a directory (searched recursively, symlinks not followed) or a
    destination file (only its own staging files are considered).
    """
    check_older_than(older_than)
    root = absolute_path(os.fspath(path))  # 'lnk/..' as the kernel resolves it
    only_name: str | None = None
    found: list[GcEntry] = []

    def unreadable(exc: OSError) -> None:
        # A directory gc cannot list may hold staging files: a failure, never silence.
        where = exc.filename if exc.filename is not None else root
        found.append(
            GcEntry(os.fspath(where), "directory", 0.0, f"failed: cannot list: {strerror(exc)}")
        )

    walk: Iterator[tuple[str, list[str], list[str]]]
    if os.path.isdir(root):
        walk = os.walk(root, onerror=unreadable)
    else:
        directory, only_name = os.path.split(root)
        if not os.path.isdir(directory):
            raise ConfigurationError(f"{root}: no such directory or file")
        try:
            walk = iter([(directory, [], os.listdir(directory))])
        except OSError as exc:
            unreadable(exc)
            walk = iter([])
    now = time.time()
    for dirpath, _dirs, files in walk:
        for fname in sorted(files):
            m = TEMP_NAME_RE.match(fname)
            if m is None or (only_name is not None and m["name"] != only_name[:200]):
                continue
            full = os.path.join(dirpath, fname)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            age = max(0.0, now - st.st_mtime)
            if age < older_than:
                action = f"skipped: younger than {older_than:g}s"
            else:
                action = _try_remove_local(full, dry_run)
            found.append(GcEntry(full, "staging-file", age, action, st.st_size))
    return found


def collect_s3(
    url: str,
    *,
    older_than: float = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
    **storage_options: Any,
) -> list[GcEntry]:
    """Abort ptestore's stale multipart uploads under ``s3://bucket/prefix``."""
    from .writers.s3.config import S3Connection, connection_options

    check_older_than(older_than)
    protocol, rest = split_url(url)
    if protocol != "s3":
        raise ConfigurationError(f"{url}: not an s3:// URL")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigurationError(f"{url}: no bucket name")
    check_options(url, storage_options, connection_options(), "gc of s3://")
    conn = S3Connection(url, storage_options)
    try:
        return _collect_uploads(conn, bucket, prefix, older_than, dry_run)
    finally:
        conn.close()  # its filesystem released (a long-running process calls gc again)


def _collect_uploads(
    conn: S3Connection, bucket: str, prefix: str, older_than: float, dry_run: bool
) -> list[GcEntry]:
    """:func:`collect_s3`'s listing and aborts through ``conn``."""
    from ._retry import error_code, to_storage_error
    from .writers.s3.listing import upload_pages
    from .writers.s3.marker import MARKER_PART_NUMBER, is_marker_part

    now = datetime.now(timezone.utc)
    found: list[GcEntry] = []
    pages = upload_pages(conn, bucket, prefix)
    while True:
        try:
            page, uploads = next(pages)
        except StopIteration:
            break
        except Exception as exc:
            raise to_storage_error(exc, f"s3://{bucket}/{prefix}", "ListMultipartUploads") from exc
        now = server_now(page, now)
        for up in uploads:
            key, upload_id = up["Key"], up["UploadId"]
            where = f"s3://{bucket}/{key}?uploadId={upload_id}"
            initiated = up.get("Initiated")
            age = (now - initiated).total_seconds() if initiated is not None else 0.0
            age = max(0.0, age)
            # Ownership first: another tool's upload is never touched nor reported,
            # whatever its age.
            try:
                parts = _list_all_parts(conn, bucket, key, upload_id)
            except Exception as exc:
                if error_code(exc) == "NoSuchUpload":
                    continue  # completed or aborted since the listing: nothing to report
                action = f"skipped: cannot list parts: {exc}"
                found.append(GcEntry(where, "multipart-upload", age, action))
                continue
            marker = [p for p in parts if p.get("PartNumber") == MARKER_PART_NUMBER]
            if not marker or not is_marker_part(key, marker[0]):
                continue  # not ours: never touched, not even reported
            size = sum(int(p.get("Size", 0)) for p in parts)
            if age < older_than:
                action = f"skipped: younger than {older_than:g}s"
                found.append(GcEntry(where, "multipart-upload", age, action, size))
                continue
            if dry_run:
                found.append(GcEntry(where, "multipart-upload", age, "would remove", size))
                continue
            action = _abort(conn, bucket, key, upload_id)
            found.append(GcEntry(where, "multipart-upload", age, action, size))
    return found


def _abort(conn: S3Connection, bucket: str, key: str, upload_id: str) -> str:
    """Abort the upload; the action: ``"removed"``, ``"skipped: already gone"``
    (``NoSuchUpload``: completed or aborted by another since the listing) or ``"failed:
    ..."``. ``NoSuchUpload`` answering a retry after an attempt whose answer was lost once
    sent (a read timeout, a closed connection, a 500: it may have aborted the upload,
    :func:`~ptestore.writers.s3.publish.may_have_applied`) is ``"removed"``."""
    from ._retry import error_code
    from .writers.s3.publish import may_have_applied

    lost: list[BaseException] = []

    def attempt() -> dict[str, Any]:
        try:
            return conn.invoke(
                "abort_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                **conn.plain_extras,
            )
        except Exception as exc:
            if may_have_applied(exc):
                lost.append(exc)
            raise

    try:
        conn.call("AbortMultipartUpload", attempt)
    except Exception as exc:
        if error_code(exc) != "NoSuchUpload":
            return f"failed: {exc}"
        return "removed" if lost else "skipped: already gone"  # by our lost answer, or another
    return "removed"


def server_now(page: dict[str, Any], client_now: datetime) -> datetime:
    """The server's clock from a response's ``Date`` header when it disagrees with the
    client's by more than :data:`CLOCK_SKEW_TOLERANCE` (upload ages and ``LastModified``
    are server times), else the client's."""
    headers = page.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    try:
        server_now = parsedate_to_datetime(str(headers["date"]))
    except (KeyError, TypeError, ValueError, IndexError):
        return client_now
    if server_now.tzinfo is None:
        server_now = server_now.replace(tzinfo=timezone.utc)
    skew = (server_now - client_now).total_seconds()
    if abs(skew) <= CLOCK_SKEW_TOLERANCE:
        return client_now
    log.info("the server's clock differs from ours by %+.0f s: ages use the server's", skew)
    return server_now


def _list_all_parts(
    conn: S3Connection, bucket: str, key: str, upload_id: str
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    marker = 0
    while True:
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id, **conn.extras}
        if marker:
            kw["PartNumberMarker"] = marker
        page = conn.request("ListParts", "list_parts", **kw)
        parts.extend(page.get("Parts", []))
        nxt = int(page.get("NextPartNumberMarker") or 0)
        if not page.get("IsTruncated") or nxt <= marker:
            return parts
        marker = nxt


def collect_stale(
    target: str | os.PathLike[str],
    *,
    older_than: float = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
    **storage_options: Any,
) -> list[GcEntry]:
    """Dispatch on ``target``: a local path/``file://`` URL or an ``s3://bucket/prefix``."""
    check_older_than(older_than)
    url = StorageURL.of(target)
    path = url.path
    if url.local:
        if storage_options:
            raise ConfigurationError(
                f"{path}: storage options {sorted(storage_options)} do not apply to local paths"
            )
        return collect_local(path, older_than=older_than, dry_run=dry_run)
    if url.protocol == "s3":
        return collect_s3(
            os.fspath(target), older_than=older_than, dry_run=dry_run, **storage_options
        )
    raise ConfigurationError(
        f"{os.fspath(target)}: gc supports local paths and s3:// prefixes, not {url.protocol}://"
    )
