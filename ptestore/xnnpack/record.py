"""The record beside a packed-weight file, and the checks before one is handed out.

A file ``<dir>/xnnpack-<id>.xpwc`` is findable only through its record
``<dir>/xnnpack-<id>.xpwc.json`` (format :data:`RECORD_FORMAT`): the identity it was made
for, its size, SHA-256, number of entries and the stamp (device, inode, size, mtime,
ctime) of the inode published with it. :func:`check_file` is every check
:mod:`.cache` makes before it returns a :class:`CacheFile`; :func:`publish_read_only`
writes a small read-only file (a record, a refusal) through
:func:`ptestore.storage.atomic.put_bytes`.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from .._dataclass import dataclass
from .._io import read_bounded
from ..errors import FormatError, IntegrityError, PteStoreError
from ..storage.regular import NotRegular, open_regular
from .identity import Identity, file_sha256
from .native import ExecutorchBuild
from .xpwc import Entry, parse_index

__all__ = [
    "RECORD_FORMAT",
    "CacheFile",
    "PathLike",
    "check_file",
    "found_checked",
    "identity_of",
    "parse_file",
    "paths",
    "publish_file",
    "publish_read_only",
    "read_record",
    "read_small",
    "remove_stale",
    "stamp",
]

RECORD_FORMAT = "ptestore-xnnpack-cache/1"
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class CacheFile:
    """A verified packed-weight file and what it is bound to."""

    path: Path
    record_path: Path
    size: int
    sha256: str
    entries: int
    identity: Identity
    #: True when this call made it, False when it was found.
    made: bool = False
    #: Seconds the making took (children included), when this call made it.
    make_seconds: float | None = None

    @property
    def files(self) -> tuple[Path, Path]:
        """The two files that make it up (the packed weights and the record): what a
        cache that counts bytes or evicts (LRU) should account for and remove together,
        the record first."""
        return (self.record_path, self.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "entries": self.entries,
            "identity": self.identity.to_json(),
            "made": self.made,
        }


def identity_of(
    pte: PathLike,
    ptd: PathLike | None,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    build: ExecutorchBuild,
) -> Identity:
    """The identity of an artifact (its digests, hashed when not given) on ``build``."""
    pte_digest = pte_sha256 or file_sha256(pte)
    ptd_digest = None if ptd is None else (ptd_sha256 or file_sha256(ptd))
    return Identity.of(pte_digest, ptd_digest, build)


def paths(directory: Path, identity: Identity) -> tuple[Path, Path, Path, Path]:
    """The packed file, its record, its lock and the refusal record of ``identity``."""
    base = directory / f"{identity.name}.xpwc"
    return (
        base,
        base.with_name(base.name + ".json"),
        base.with_name(base.name + ".lock"),
        directory / f"{identity.name}.refused.json",
    )


def stamp(st: os.stat_result) -> dict[str, int]:
    """What identifies an inode unchanged since it was published."""
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def check_file(
    path: Path, record: dict[str, Any], identity: Identity, full: bool = True
) -> CacheFile:
    """The checks before a file is handed out; raises what is wrong (a symbolic link at
    ``path`` included: it is not followed). ``full=False``
    skips the SHA-256 when the file is still the inode published with the record, never
    changed since (device, inode, size, mtime and ctime as recorded: any write, chmod,
    copy or replacement changes one of them)."""
    source = str(path)
    if record.get("format") != RECORD_FORMAT:
        raise FormatError(source + ".json", "format", record.get("format"), repr(RECORD_FORMAT))
    recorded = record.get("identity")
    if not isinstance(recorded, dict):
        raise FormatError(source + ".json", "identity", recorded, "an object")
    diff = identity.differences(recorded)
    if diff:
        raise IntegrityError(
            f"{source}: made for another artifact, runtime or CPU ({'; '.join(diff)})",
            published=False,
        )
    size, digest = record.get("size"), record.get("sha256")
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise IntegrityError(f"{source}: recorded but missing", published=False) from None
    if stat.S_ISLNK(st.st_mode):  # load() opens it without following: refused everywhere
        raise IntegrityError(
            f"{source}: a symbolic link; a packed-weight file is handed out only as the "
            "file itself (give its real path)",
            published=False,
        )
    if st.st_size != size:
        raise IntegrityError(f"{source}: size {st.st_size} != recorded {size}", published=False)
    if st.st_mode & 0o222:
        raise IntegrityError(
            f"{source}: mode {oct(st.st_mode & 0o777)} is writable; published files are 0444",
            published=False,
        )
    if not full and record.get("stamp") == stamp(st) and isinstance(digest, str):
        actual = digest
    else:
        actual = file_sha256(path)
    if actual != digest:
        raise IntegrityError(f"{source}: SHA-256 {actual} != recorded {digest}", published=False)
    entries = parse_file(path)
    if len(entries) != record.get("entries"):
        raise IntegrityError(
            f"{source}: {len(entries)} entries != recorded {record.get('entries')}",
            published=False,
        )
    return CacheFile(
        path, path.with_name(path.name + ".json"), st.st_size, actual, len(entries), identity
    )


def parse_file(path: Path) -> list[Entry]:
    """The index of a file on disk, read through a read-only mapping."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return parse_index(b"", str(path))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                return parse_index(view, str(path))
            finally:
                view.release()


#: A record is at most this many bytes (one names its entries' count, a few digests).
MAX_RECORD_BYTES = 1 << 20


def read_small(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``: opened without blocking
    and never through a symbolic link (a FIFO planted there would hang the reader).
    ``FileNotFoundError`` when there is none; :class:`FormatError` naming the file, the
    ``what`` and the limit for anything else (not a regular file, larger, unreadable)."""
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        raise
    except NotRegular as exc:
        raise FormatError(str(path), what, exc.kind, "a regular file") from None
    except OSError as exc:
        raise FormatError(str(path), what, exc.strerror, "a regular file") from None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = read_bounded(f, limit)
    except OSError as exc:
        raise FormatError(str(path), what, exc.strerror, "a readable file") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FormatError(str(path), what, f"more than {limit} bytes", f"at most {limit} bytes")
    return data


def read_record(record_path: Path) -> dict[str, Any]:
    """The JSON object at ``record_path`` (a regular file of at most
    :data:`MAX_RECORD_BYTES`: :func:`read_small`); ``FileNotFoundError`` when there is
    none, :class:`FormatError` when it is not a JSON object (nested too deeply to read
    included)."""
    raw = read_small(record_path, MAX_RECORD_BYTES, "record")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise FormatError(str(record_path), "record", type(exc).__name__, "a JSON object") from None
    if not isinstance(data, dict):
        raise FormatError(str(record_path), "record", type(data).__name__, "a JSON object")
    return data


def publish_read_only(data: bytes, target: Path) -> None:
    """Publish the small file ``target`` read-only (0444) and durably: a temporary file
    beside it, fsync, rename over it, fsync of the directory
    (:func:`ptestore.storage.atomic.put_bytes`)."""
    from ..storage.atomic import put_bytes

    put_bytes(os.fspath(target), data, mode="overwrite", durable=True, permissions=0o444)


def found_checked(
    path: Path, record_path: Path, identity: Identity, full: bool = True
) -> CacheFile | None:
    """The file at ``path`` when its record names ``identity`` and it passes every check
    (:func:`check_file`); None otherwise (nothing there, or something to make again)."""
    try:
        return check_file(path, read_record(record_path), identity, full)
    except FileNotFoundError:
        return None
    except PteStoreError:
        return None


def remove_stale(directory: Path, identity: Identity) -> None:
    """Under the lock: everything a previous maker of this identity left."""
    path, record_path, _, _ = paths(directory, identity)
    for p in (record_path, path):  # the record first: it is what makes a file findable
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for leftover in directory.glob(f".{identity.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def publish_file(
    tmp: Path,
    directory: Path,
    identity: Identity,
    size: int,
    digest: str,
    entries: int,
    artifacts: dict[str, Any] | None = None,
) -> CacheFile:
    """Under the lock: publish the checked, read-only file ``tmp`` as ``identity``'s in
    ``directory``: fsync, rename into the directory, fsync of both directories; then its
    record (what makes it findable) the same way, with the published inode's stamp and
    the artifact digests hashed for it (``artifacts``: see :mod:`.digests`)."""
    from ..storage.atomic import rename_synced

    path, record_path, _, _ = paths(directory, identity)
    rename_synced(str(tmp), str(path))
    record = {
        "format": RECORD_FORMAT,
        "file": path.name,
        "size": size,
        "sha256": digest,
        "entries": entries,
        "identity": identity.to_json(),
        "made_unix": int(time.time()),
        "stamp": stamp(path.stat()),
    }
    if artifacts:
        record["artifacts"] = artifacts
    publish_read_only(json.dumps(record, indent=1).encode(), record_path)
    return CacheFile(path, record_path, size, digest, entries, identity, made=True)
