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
    "FUTURE_SLACK",
    "PLAUSIBLE_SINCE",
    "GcEntry",
    "check_older_than",
    "collect_local",
    "collect_s3",
    "collect_stale",
    "implausible",
    "server_now",
    "utc",
]

log = get_logger("ptestore.gc")

#: Beyond this many seconds between the client's clock and a response's ``Date``
#: header, ages of S3 uploads are measured against the server's clock.
CLOCK_SKEW_TOLERANCE = 5.0

#: Default minimum age (seconds) of a leftover before gc touches it: one day.
DEFAULT_OLDER_THAN = 86400.0

#: The earliest plausible time of a leftover, an orphan or a hold (2000-01-01 UTC): one
#: before it was stamped by a clock that read 1970 (a host without a real-time clock
#: before its time was set), and says nothing of when it was made (:func:`implausible`).
PLAUSIBLE_SINCE = 946_684_800.0

#: How far after gc's now (the server's, on S3) a time may be and still be taken as
#: now: a writer's clock a little ahead. Beyond it the time was stamped by a clock
#: ahead, and says nothing of when it was made (:func:`implausible`).
FUTURE_SLACK = 86400.0


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


def utc(when: datetime) -> datetime:
    """``when`` with its zone; one without (an S3 time written without ``Z``, which
    botocore makes a naive datetime) is UTC, as S3 times are: never the local zone."""
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _shown_time(when: float) -> str:
    """``when`` (seconds since the epoch) as UTC, ``2026-12-06T04:00:00Z``."""
    try:
        return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond what datetime holds
        return f"{when!r} s since the epoch"


def implausible(when: float, now: float, what: str = "modification time") -> str | None:
    """Why ``when`` (seconds since the epoch: ``what``, a file's or an object's time) is
    not a time an age can be measured from, against ``now`` (gc's clock; on S3 the
    server's): before :data:`PLAUSIBLE_SINCE`, or more than :data:`FUTURE_SLACK` after
    ``now``; None when it is plausible. Such a time was stamped by a clock that was
    wrong (the writer's, or ours): the age is unknown, and gc never takes an unknown
    age for an old one."""
    if not math.isfinite(when) or when < PLAUSIBLE_SINCE:
        limit = f"before {_shown_time(PLAUSIBLE_SINCE)}"
    elif when > now + FUTURE_SLACK:
        limit = f"more than {FUTURE_SLACK:g}s after now, {_shown_time(now)}"
    else:
        return None
    return f"its {what} {_shown_time(when)} is not plausible ({limit})"


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
            why = implausible(st.st_mtime, now)
            age = 0.0 if why is not None else max(0.0, now - st.st_mtime)
            if why is not None and older_than > 0:
                # Unknown age: kept. Its lock alone cannot vouch (an earlier ptestore's
                # put_bytes never locked its temporary file; on NFS a lock may be seen by
                # this client only): --older-than 0 asks for any age, and then it decides.
                action = f"skipped: {why}: its age is unknown (--older-than 0: its lock decides)"
            elif age < older_than:
                action = f"skipped: younger than {older_than:g}s"
            else:  # old (or any age asked for): its lock decides (free: no writer is alive)
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
            age, why = _upload_age(up.get("Initiated"), now)
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
            if why is not None:  # no lock tells a live writer here: an unknown age is kept
                action = f"skipped: {why}: its age is unknown"
                found.append(GcEntry(where, "multipart-upload", age, action, size))
                continue
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


def _upload_age(initiated: datetime | None, now: datetime) -> tuple[float, str | None]:
    """An upload's age at ``now`` (the server's clock) from its ``Initiated`` (one
    without a zone is UTC, :func:`utc`), and why it is unknown (:func:`implausible`:
    the age is then 0.0), or None. No ``Initiated``: 0.0, as young."""
    if initiated is None:
        return 0.0, None
    when = utc(initiated).timestamp()
    why = implausible(when, now.timestamp(), "initiation time")
    return (0.0, why) if why is not None else (max(0.0, now.timestamp() - when), None)


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
    server_now = utc(server_now)
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
