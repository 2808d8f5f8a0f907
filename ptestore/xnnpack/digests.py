"""The artifact's digests a packed-weight file is bound to, hashed once per file version.

A file's identity names the SHA-256 of the whole ``.pte`` and ``.ptd``
(:class:`~ptestore.xnnpack.Identity`): without them given, every check hashed the
artifact again (0.6 s per GiB here), which cost a ``load`` with the file about half of
what the file saves. So the record of a file remembers the digests ptestore hashed
itself, by the artifact's absolute path, with the stamp (device, inode, size, mtime,
ctime) the artifact had before and after it was hashed::

    "artifacts": {"/abs/model.pte": {"sha256": "<hex>", "stamp": {...}}, ...}

A check with ``full=False`` takes a digest from there while the artifact's stamp is
unchanged (any write, ``chmod``, copy or replacement changes it: the same quick check a
packed-weight file gets against its own stamp); ``full=True`` hashes everything, always.
A digest the caller gives is used and never remembered (it is the caller's word); one
hashed while the file changed (another stamp after than before) is used for this call
only.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .._dataclass import dataclass
from ..errors import PteStoreError
from .identity import file_sha256
from .record import PathLike, locked, publish_read_only, read_record, stamp

__all__ = [
    "MEMO",
    "ArtifactDigests",
    "artifact_digests",
    "memo_of",
    "remember",
    "remember_quietly",
    "remembered_in",
]

#: The record's field remembering the artifact digests hashed here.
MEMO = "artifacts"


@dataclass(frozen=True)
class ArtifactDigests:
    """The ``.pte``'s and ``.ptd``'s SHA-256 (hex), and what of them this call hashed
    (``learned``: absolute path -> ``{"sha256", "stamp"}``, to remember)."""

    pte: str
    ptd: str | None
    learned: dict[str, dict[str, Any]]


def memo_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The digests a record remembers (empty when it has none, or not an object)."""
    memo = record.get(MEMO)
    return memo if isinstance(memo, dict) else {}


def _remembered(memo: Mapping[str, Any], path: PathLike) -> str | None:
    entry = memo.get(os.path.abspath(os.fspath(path)))
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        return None
    try:
        now = stamp(os.stat(path))
    except OSError:
        return None
    return str(entry["sha256"]) if entry.get("stamp") == now else None


def _hashed(path: PathLike, learned: dict[str, dict[str, Any]]) -> str:
    before = stamp(os.stat(path))
    digest = file_sha256(path)
    after = stamp(os.stat(path))
    if before == after:
        learned[os.path.abspath(os.fspath(path))] = {"sha256": digest, "stamp": after}
    return digest


def artifact_digests(
    pte: PathLike,
    ptd: PathLike | None,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    memo: Mapping[str, Any] | None = None,
    *,
    hash_missing: bool = True,
) -> ArtifactDigests | None:
    """The artifact's digests: given, else remembered in ``memo`` for its current stamp,
    else (``hash_missing``) hashed now; None when one is missing and not hashed."""
    memo = memo or {}
    learned: dict[str, dict[str, Any]] = {}
    pte_digest = pte_sha256 or _remembered(memo, pte)
    if pte_digest is None:
        if not hash_missing:
            return None
        pte_digest = _hashed(pte, learned)
    ptd_digest = None
    if ptd is not None:
        ptd_digest = ptd_sha256 or _remembered(memo, ptd)
        if ptd_digest is None:
            if not hash_missing:
                return None
            ptd_digest = _hashed(ptd, learned)
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
    record[MEMO] = {**memo_of(record), **learned}
    publish_read_only(json.dumps(record, indent=1).encode(), record_path)


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
            remember(record_path, learned)
