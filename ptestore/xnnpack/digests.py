"""The artifact's digests a packed-weight file is bound to, hashed once per file version.

A file's identity names the SHA-256 of the whole ``.pte`` and ``.ptd``
(:class:`~ptestore.xnnpack.Identity`): without them given, every check hashed the
artifact again (0.6 s per GiB here), which cost a ``load`` with the file about half of
what the file saves. So the record of a file remembers the digests ptestore hashed
itself, by the artifact's absolute path, with what the artifact looked like before and
after it was hashed: its stamp (device, inode, size, mtime, ctime) and the SHA-256 of
its first and last 64 KiB (the header and, for a ptestore output, the provenance trailer
that names its content)::

    "artifacts": {"/abs/model.pte": {"sha256": "<hex>", "stamp": {...}, "ends": "<hex>"}}

A check with ``full=False`` takes a digest from there while the artifact still looks
the same (any write, ``chmod``, copy or replacement changes the stamp; the ends catch a
file whose times were set to fixed values, as images built reproducibly have them);
``full=True`` hashes everything, always. Not remembered: a digest the caller gives (its
word), one hashed while the file changed, and one of a file changed less than a clock
tick of its file system before it was hashed (a later change in the same tick would keep
its times: the "racy git" problem), which the next check hashes and remembers instead. A
record remembers at most :data:`MEMO_LIMIT` files, and drops those that changed or went.

What this cannot see, as the quick check of the packed-weight file itself: bytes changed
below the file system, or by someone who also restores the times and the ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ..errors import IntegrityError, ObjectNotFound, PteStoreError
from ..storage.flock import locked
from .identity import file_sha256
from .record import PathLike, publish_read_only, read_record, stamp

if TYPE_CHECKING:
    from .pinned import PinnedArtifact

__all__ = [
    "MEMO",
    "ArtifactDigests",
    "artifact_digests",
    "check_given",
    "memo_of",
    "remember",
    "remember_quietly",
    "remembered_in",
    "vouched",
]

#: The record's field remembering the artifact digests hashed here.
MEMO = "artifacts"
#: Bytes at each end of a file whose SHA-256 a remembered digest also requires: the
#: header and, for a ptestore output, the provenance trailer, which names the content.
ENDS = 64 << 10
#: A file changed less than this before it was hashed is not remembered (the kernel's
#: clock tick is at most 10 ms; see :func:`_racy`) ...
RACY_NS = 100_000_000
#: ... or this, on a file system that keeps whole seconds (FAT keeps 2 s).
RACY_COARSE_NS = 2_000_000_000
#: The wall clock the file times are compared with (a test may move it).
now_ns = time.time_ns
_HEX64 = re.compile("[0-9a-f]{64}")
#: At most this many files remembered per record (the most recent; a file whose stamp
#: changed or that went is dropped when a record is written anyway).
MEMO_LIMIT = 16


@dataclass(frozen=True)
class ArtifactDigests:
    """The ``.pte``'s and ``.ptd``'s SHA-256 (hex), and what of them this call hashed
    (``learned``: absolute path -> ``{"sha256", "stamp", "ends"}``, to remember)."""

    pte: str
    ptd: str | None
    learned: dict[str, dict[str, Any]]


def memo_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The digests a record remembers (empty when it has none, or not an object)."""
    memo = record.get(MEMO)
    return memo if isinstance(memo, dict) else {}


def _look(path: PathLike) -> tuple[dict[str, int], str]:
    """The file's stamp and the SHA-256 of its two ends (:data:`ENDS` bytes each), both
    through one open descriptor (an open revalidates what NFS caches of a file)."""
    with open(path, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(ENDS))
        if st.st_size > ENDS:
            f.seek(max(ENDS, st.st_size - ENDS))
            h.update(f.read(ENDS))
    return stamp(st), h.hexdigest()


def _racy(at: dict[str, int], started_ns: int) -> bool:
    """Whether the file's last change (``at``) is too close to when it was hashed for a
    later change to be sure to show in its times: a change in the same clock tick of the
    file system keeps them ("racy git"). Whole-second times get a file system's coarse
    granularity, others the kernel's tick."""
    changed = max(at["mtime_ns"], at["ctime_ns"])
    coarse = at["mtime_ns"] % 1_000_000_000 == 0 and at["ctime_ns"] % 1_000_000_000 == 0
    return started_ns - changed < (RACY_COARSE_NS if coarse else RACY_NS)


def _remembered(memo: Mapping[str, Any], path: PathLike, read: PathLike) -> str | None:
    entry = memo.get(os.path.abspath(os.fspath(path)))
    if not isinstance(entry, dict):
        return None
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        return None
    try:
        now, ends = _look(read)
    except OSError:
        return None
    return digest if (entry.get("stamp"), entry.get("ends")) == (now, ends) else None


def _hashed(path: PathLike, learned: dict[str, dict[str, Any]], read: PathLike) -> str:
    started = now_ns()
    try:
        before = _look(read)
    except FileNotFoundError:
        raise ObjectNotFound(f"{os.fspath(path)}: no such file (the artifact)") from None
    digest = file_sha256(read)
    after = _look(read)
    if before == after and not _racy(after[0], started):
        key = os.path.abspath(os.fspath(path))
        learned[key] = {"sha256": digest, "stamp": after[0], "ends": after[1]}
    return digest


def vouched(path: PathLike, digest: str) -> dict[str, dict[str, Any]]:
    """What to remember of ``path`` whose SHA-256 the caller hashed itself from the file
    as it is now (``{}`` when it changed too recently to tell: :func:`_racy`)."""
    at, ends = _look(path)
    if _racy(at, now_ns()):
        return {}
    return {os.path.abspath(os.fspath(path)): {"sha256": digest, "stamp": at, "ends": ends}}


def artifact_digests(
    pte: PathLike,
    ptd: PathLike | None,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    memo: Mapping[str, Any] | None = None,
    *,
    hash_missing: bool = True,
    pinned: PinnedArtifact | None = None,
) -> ArtifactDigests | None:
    """The artifact's digests: given, else remembered in ``memo`` for its current stamp,
    else (``hash_missing``) hashed now; None when one is missing and not hashed.
    ``pinned``: the artifact held open (:mod:`.pinned`, the same ``pte`` and ``ptd``):
    its files are looked at and hashed through the inodes held, not their paths."""
    memo = memo or {}
    learned: dict[str, dict[str, Any]] = {}
    pte_read = pte if pinned is None else pinned.pte_path
    pte_digest = pte_sha256 or _remembered(memo, pte, pte_read)
    if pte_digest is None:
        if not hash_missing:
            return None
        pte_digest = _hashed(pte, learned, pte_read)
    ptd_digest = None
    if ptd is not None:
        ptd_read = ptd if pinned is None or pinned.ptd_path is None else pinned.ptd_path
        ptd_digest = ptd_sha256 or _remembered(memo, ptd, ptd_read)
        if ptd_digest is None:
            if not hash_missing:
                return None
            ptd_digest = _hashed(ptd, learned, ptd_read)
    return ArtifactDigests(pte_digest, ptd_digest, learned)


def remembered_in(
    directory: Path,
    pte: PathLike,
    ptd: PathLike | None,
    pte_sha256: str | None,
    ptd_sha256: str | None,
) -> Iterator[ArtifactDigests]:
    """The artifact's digests as the records in ``directory`` remember them for its
    current stamps (one per record that knows them all, none hashed)."""
    for record_path in sorted(directory.glob("xnnpack-*.xpwc.json")):
        try:
            memo = memo_of(read_record(record_path))
        except (OSError, PteStoreError):
            continue
        if not memo:
            continue
        found = artifact_digests(pte, ptd, pte_sha256, ptd_sha256, memo, hash_missing=False)
        if found is not None:
            yield found


def _knows(record: Mapping[str, Any], learned: Mapping[str, dict[str, Any]]) -> bool:
    memo = memo_of(record)
    return all(memo.get(path) == entry for path, entry in learned.items())


def remember(record_path: Path, learned: Mapping[str, dict[str, Any]]) -> None:
    """Under the file's lock: ``learned`` added to its record (nothing when it has them)."""
    record = read_record(record_path)
    if _knows(record, learned):
        return
    kept = {p: e for p, e in memo_of(record).items() if p not in learned and _current(p, e)}
    merged = {**kept, **learned}
    record[MEMO] = dict(list(merged.items())[-MEMO_LIMIT:])
    publish_read_only(json.dumps(record, indent=1).encode(), record_path)


def _current(path: str, entry: object) -> bool:
    """Whether a remembered file is still there as it was (its stamp: one ``stat``)."""
    try:
        return isinstance(entry, dict) and entry.get("stamp") == stamp(os.stat(path))
    except (OSError, ValueError):  # gone, or a path no file can have (a NUL in it)
        return False


def remember_quietly(record_path: Path, learned: Mapping[str, dict[str, Any]]) -> None:
    """:func:`remember` under the file's lock, when this process may write there: a
    check in a read-only directory still passes, it only cannot spare the next one.
    A record that already knows them is only read."""
    if not learned:
        return
    lock = record_path.with_name(record_path.name[: -len(".json")] + ".lock")
    with contextlib.suppress(OSError, PteStoreError):
        if _knows(read_record(record_path), learned):
            return
        with locked(lock):
            if not record_path.exists():  # removed meanwhile, with its file: nothing to
                lock.unlink()  # remember; the lock this made goes too (held: see locked)
                return
            remember(record_path, learned)


def check_given(pinned: PinnedArtifact, given: ArtifactDigests) -> None:
    """Before a file is made under digests the caller gave (``ensure`` gives its
    entry's): the inodes held are those bytes, or :class:`IntegrityError` (a file
    replaced between the caller's hashing and this call's open), nothing made."""
    held = artifact_digests(pinned.pte, pinned.ptd, None, None, pinned=pinned)
    assert held is not None  # hashed
    for name, want, got in (
        (pinned.pte, given.pte, held.pte),
        (pinned.ptd, given.ptd, held.ptd),
    ):
        if name is not None and want != got:
            raise IntegrityError(
                f"{name}: its SHA-256 is {got}, not {want}, the digest the packed-weight "
                "file was asked for (replaced since it was hashed?); nothing made"
            )
