"""The in-place journal as a file (:mod:`ptestore.journal`): its names beside the file
(:func:`journal_path`, :func:`find_journal`, :func:`target_of`), its format's
constants, and reading it: :func:`check_journal` (its commit record and its plan,
through one descriptor of a regular file, never a link or a FIFO) after
:func:`check_owner` (the journal is this user's or the file owner's, writable by its
owner only)."""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from ._io import pread_all
from .errors import PermissionDenied, StorageError
from .journal_check import plan_problem

__all__ = [
    "COMMIT",
    "COMMIT_RECORD",
    "COMMIT_V2",
    "FOOTER",
    "MAGIC",
    "OLD_SUFFIX",
    "SUFFIX",
    "check_journal",
    "check_owner",
    "find_journal",
    "journal_path",
    "journal_paths",
    "read_plan",
    "target_of",
]

MAGIC = b"PTESTORE-JRNL-v1"
#: The commit record of older journals (``PTESTORE-COMMIT!``): the SHA-256 of all before it.
COMMIT = b"PTESTORE-COMMIT!"
#: The commit record: the SHA-256 of the plan and the footer (the plan checks the rest).
COMMIT_V2 = b"PTESTORE-COMMIT2"
FOOTER = struct.Struct("<16sQQ")
COMMIT_RECORD = struct.Struct("<16s32s")
_CHUNK = 8 << 20
#: The journal's name: ``.<name>.ptestore-jrnl2`` beside the file. A journal ending in
#: :data:`COMMIT_V2` has a name of its own: a ptestore older than that record looks for
#: ``.<name>.ptestore-journal`` only, so it refuses the file an interrupted run left
#: marked instead of taking the record for no commit and deleting the journal. (Two
#: bytes shorter than the older name: a model name of up to 239 bytes has its journal.)
SUFFIX = ".ptestore-jrnl2"
#: The name the journals of the versions before had (``COMMIT``, and ``COMMIT_V2`` for a
#: while): still found, recovered and verified.
OLD_SUFFIX = ".ptestore-journal"


def journal_path(path: str) -> str:
    """Where a run writes the journal of the file at ``path``:
    ``.<name>.ptestore-jrnl2`` beside it."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}{SUFFIX}")


def journal_paths(path: str) -> tuple[str, str]:
    """Both names a journal of the file at ``path`` may have: today's
    (:func:`journal_path`) and the one of the versions before."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}{SUFFIX}"), os.path.join(d, f".{name}{OLD_SUFFIX}")


def find_journal(path: str) -> str | None:
    """The journal beside the file at ``path`` under either name, None when there is
    none (two ``lstat``). Both there: a :class:`StorageError` (neither is applied nor
    removed: which one is the file's cannot be told from their names)."""
    found = [j for j in journal_paths(path) if os.path.lexists(j)]
    if len(found) == 2:
        raise StorageError(
            f"{path}: two in-place journals are beside it, {found[0]} and {found[1]} (the "
            "latter of an older ptestore); neither is applied nor removed, and the file is "
            "left as it is. Keep the one of the run that was interrupted last, remove the "
            "other, and recover again; if the file's identifier is PTJ~ and neither "
            "completes it, restore the model from its portable source",
            errno=errno.EEXIST,
        )
    return found[0] if found else None


def target_of(journal: str) -> str | None:
    """The file a journal at ``journal`` is beside (None: not a journal's name)."""
    d, name = os.path.split(os.path.abspath(journal))
    for suffix in (SUFFIX, OLD_SUFFIX):
        if name.startswith(".") and name.endswith(suffix) and len(name) > len(suffix) + 1:
            return os.path.join(d, name[1 : -len(suffix)])
    return None


def read_plan(path: str) -> dict[str, Any] | None:
    """The plan of a committed journal; None when the journal is incomplete (its commit
    record missing or not matching: the file was never touched)."""
    return check_journal(path)[0]


def _commit_digest_ok(fd: int, start: int, body: int, digest: bytes) -> bool:
    """Whether the SHA-256 of the journal's bytes ``[start, body)`` is ``digest``."""
    import hashlib  # only when a journal exists: every run of a local path asks

    h = hashlib.sha256()
    done = start
    while done < body:
        n = min(_CHUNK, body - done)
        h.update(pread_all(fd, n, done))
        done += n
    return h.digest() == digest


def check_journal(path: str) -> tuple[dict[str, Any] | None, str]:
    """``(plan, "")`` for a committed journal, else ``(None, why)``: what is wrong with
    it (no commit record, a commit digest that does not match, a bad footer). The
    payload of a journal committed by :data:`COMMIT_V2` is checked against its plan by
    :func:`check_payload` (it needs the file)."""
    import json

    fd = _open_journal(path)
    try:
        size = os.fstat(fd).st_size
        if size < FOOTER.size + COMMIT_RECORD.size:
            return None, f"{size} bytes, shorter than a commit record"
        record = pread_all(fd, COMMIT_RECORD.size, size - COMMIT_RECORD.size)
        tag, digest = COMMIT_RECORD.unpack(record)
        if tag not in (COMMIT, COMMIT_V2):
            return None, "no commit record at its end"
        body = size - COMMIT_RECORD.size
        magic, at, n = FOOTER.unpack(pread_all(fd, FOOTER.size, body - FOOTER.size))
        footer_ok = magic == MAGIC and at + n == body - FOOTER.size
        if tag == COMMIT:  # an older journal: the digest covers the payload too
            if not _commit_digest_ok(fd, 0, body, digest):
                return (
                    None,
                    f"the SHA-256 of its first {body} bytes does not match its commit record",
                )
        elif not footer_ok or not _commit_digest_ok(fd, at, body, digest):
            return None, (
                f"the SHA-256 of its plan and footer (bytes {at if footer_ok else '?'}.."
                f"{body}) does not match its commit record"
            )
        if not footer_ok:
            return None, "its footer is not a journal's"
        try:
            plan = json.loads(pread_all(fd, n, at))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return None, f"its plan is not JSON ({exc})"
        if tag == COMMIT and isinstance(plan, dict):
            plan.pop("check", None)  # its commit record covers the payload already
        elif not isinstance(plan, dict) or not isinstance(plan.get("check"), dict):
            return None, "its plan does not say what its payload must be"
        problem = plan_problem(plan, at)
        if problem:
            return None, f"its plan {problem}"
        return plan, ""
    finally:
        os.close(fd)


def _open_journal(path: str) -> int:
    """The journal opened for reading: a regular file, never through a link, never
    blocking (a FIFO planted there would hang every open of the model); anything else
    a :class:`StorageError` naming it."""
    from .storage.regular import NotRegular, open_regular

    advice = "the file beside it is left as it is (remove the journal if no in-place run left it)"
    try:
        fd, st = open_regular(path)
    except NotRegular as exc:
        if exc.link:
            raise StorageError(
                f"{path}: cannot read this in-place journal: a symbolic link; {advice}"
            ) from exc
        raise StorageError(
            f"{path}: this in-place journal is not a regular file ({exc.kind}); {advice}"
        ) from exc
    except OSError as exc:
        raise StorageError(
            f"{path}: cannot read this in-place journal: {exc.strerror}; {advice}"
        ) from exc
    try:
        check_owner(path, st, target_of(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_owner(journal: str, st: os.stat_result, target: str | None) -> None:
    """Refuse (:class:`~ptestore.errors.PermissionDenied`) a journal that neither this
    process's user nor the owner of ``target`` (the file beside it) wrote: owned by
    another user, or writable by others than its owner. Its binding can be computed by
    anyone who can read the file, so another user's journal (planted in a shared,
    sticky directory) would otherwise rewrite the file with that user's bytes as soon as
    its owner (or root) inspects it; such a journal is neither applied nor removed.
    ``st``: the journal's ``fstat``, from the descriptor it is read through."""
    import stat

    euid = os.geteuid()
    owner: int | None = None
    if target is not None:
        try:
            owner = os.stat(target).st_uid
        except OSError:
            owner = None
    mode = stat.filemode(st.st_mode)
    if st.st_uid not in (euid, owner):
        who = f"this process's user (uid {euid})"
        who = f"not {who}" if owner is None else f"neither {who} nor {target}'s owner (uid {owner})"
        why = f"owned by uid {st.st_uid} (mode {mode}), {who}"
        then = (
            f"Recover it as uid {st.st_uid} if an in-place run of that user left it; "
            "else another user put it there: remove it"
        )
    elif st.st_mode & 0o022:
        why = f"writable by others than its owner (uid {st.st_uid}, mode {mode})"
        then = (
            "If an in-place run left it, make it writable by its owner only (chmod go-w) "
            "and recover again; else remove it"
        )
    else:
        return
    beside = "the file beside it" if target is None else target
    raise PermissionDenied(
        f"{journal}: refusing this in-place journal: {why}; it is neither applied nor "
        f"removed, and {beside} is left as it is. {then}",
        errno=errno.EPERM,
    )
