"""A journal's binding to its file (:mod:`ptestore.journal`): what its plan records of
the file it was made for (:func:`file_binding`, :func:`file_stamps`), and the checks
that the file at the path is that file, before (:func:`check_target`) and while
(:func:`check_bound`) a journal is applied.
"""

from __future__ import annotations

import os
from typing import Any

from ._io import pread_all
from .errors import StorageError
from .journal_check import CHANGING, IDENT_RANGE

__all__ = [
    "OtherFile",
    "check_bound",
    "check_target",
    "file_binding",
    "file_stamps",
    "open_target",
]

_PIECE = 1 << 20


def file_binding(fd: int, size_before: int, head: bytes) -> dict[str, Any]:
    """What binds a journal to the file it is made for (recorded in its plan): the
    file's device and inode, its size, and the SHA-256 of its first bytes, ``head``
    (as many as the new metadata has: those the plan's write at offset 0 overwrites, or
    keeps when the metadata did not change and the plan has no such write)."""
    import hashlib

    st = os.fstat(fd)
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size_before": size_before,
        "head_size": len(head),
        "head_sha256": hashlib.sha256(head).hexdigest(),
    }


def file_stamps(fd: int) -> dict[str, int]:
    """The file's modification and change times (``mtime_ns``, ``ctime_ns``), taken
    into its binding once the journal is about to be committed (after the run's last
    change to the file): a file rewritten since, in place, is then not the one bound,
    though its inode, size and first bytes are (its untouched chunks would otherwise be
    mixed with the plan's writes)."""
    st = os.fstat(fd)
    return {"mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def open_target(target: str, journal: str, flags: int) -> int:
    """``os.open`` of the file a journal is for (a regular file), or a
    :class:`StorageError` naming both."""
    import stat

    try:
        fd = os.open(target, flags | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(
            f"{target}: cannot open to apply its journal {journal}: {exc.strerror}"
        ) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StorageError(
            f"{target}: cannot apply its journal {journal}: not a regular file "
            f"({stat.filemode(mode)})"
        )
    return fd


class OtherFile(StorageError):
    """The path names another file than the one a journal is bound to (replaced or
    renamed over since the journal was made), or the same file rewritten since
    (``rewritten``): nothing is applied to it. ``now``: what the path names (``device
    D inode I``, or the rewritten file's size and times)."""

    def __init__(self, message: str, now: str = "", rewritten: bool = False) -> None:
        super().__init__(message)
        self.now = now
        self.rewritten = rewritten


def check_bound(fd: int, target: str, journal: str, plan: dict[str, Any]) -> None:
    """Refuse (:class:`OtherFile`) when the open ``fd`` (the file at ``target``, opened to
    apply ``journal``) is not the device and inode the plan is bound to (the path was
    renamed over after the journal's checks, or its commit), or, not yet marked
    :data:`CHANGING`, no longer has the size and the modification and change times the
    plan recorded (rewritten in place since the run's last check of it: applying would
    mix the plan's writes with the rewrite's other bytes). Every write of the apply goes
    through ``fd``, so once this holds, a later rename leaves the new file alone. A plan
    without a binding (an older ptestore's) is checked by size only, earlier
    (:func:`check_target`)."""
    bound = plan.get("file")
    if bound is None:
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (bound["dev"], bound["ino"]):
        now = f"device {st.st_dev} inode {st.st_ino}"
        raise OtherFile(
            f"{target}: not the file its journal {journal} was made for (the journal: "
            f"device {bound['dev']} inode {bound['ino']}; the path now names {now}: "
            f"replaced meanwhile); not applied, the file is left as it is. Remove "
            f"{journal} if {target} was replaced on purpose",
            now,
        )
    if bound.get("mtime_ns") is None:  # bound without times (an older ptestore)
        return
    lo, hi = IDENT_RANGE
    if pread_all(fd, hi - lo, lo) == CHANGING:
        return  # this plan's apply began (only ptestore writes the mark)
    was = (bound["size_before"], bound["mtime_ns"], bound["ctime_ns"])
    if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != was:
        now = f"{st.st_size} bytes, modified {st.st_mtime_ns} ns, changed {st.st_ctime_ns} ns"
        raise OtherFile(
            f"{target}: modified since its journal {journal} was committed (the journal: "
            f"{was[0]} bytes, modified {was[1]} ns, changed {was[2]} ns; the file now: "
            f"{now}); not applied, the file is left as it is. Remove {journal} if "
            f"{target} was rewritten on purpose",
            now,
            rewritten=True,
        )


def _head_written(plan: dict[str, Any], journal_fd: int, n: int) -> bytes | None:
    """The first ``n`` bytes the plan writes at offset 0 (with :data:`CHANGING` as the
    identifier, as applying leaves them until its step 4), from the journal; None
    where it writes none of them (the metadata did not change: the file keeps its
    first bytes)."""
    for dst, src, size in plan["writes"]:
        if dst == 0 and size >= n:
            data = bytearray(pread_all(journal_fd, n, src))
            lo, hi = IDENT_RANGE
            if n >= hi:
                data[lo:hi] = bytes.fromhex(plan["ident"])
            return bytes(data)
    return None


def check_target(target: str, journal: str, plan: dict[str, Any]) -> bool:
    """Refuse (:class:`StorageError` naming both) to apply ``journal`` to a file that is
    not the one it was made for: another inode (a replaced or re-downloaded file), or
    the same inode with other bytes where the plan writes first and a size that is
    neither the size before nor after. A file marked :data:`CHANGING` on the same inode
    is the one being changed. True when the file holds every write of the plan already
    (applied, its journal not yet removed: nothing to apply again)."""
    import hashlib

    bound = plan.get("file")
    fd = open_target(target, journal, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        lo, hi = IDENT_RANGE
        marked = pread_all(fd, hi - lo, lo) == CHANGING
        if bound is None:  # a journal of an older ptestore: its size only
            if marked or st.st_size == plan["size_before"]:
                return False
            raise StorageError(
                f"{target}: not the file its journal {journal} was made for (size "
                f"{st.st_size}, the journal's {plan['size_before']} before); not applied. "
                f"Remove {journal} if {target} was replaced on purpose"
            )
        now = f"device {st.st_dev} inode {st.st_ino}, {st.st_size} bytes"
        made = (
            f"device {bound['dev']} inode {bound['ino']}, {bound['size_before']} bytes, "
            f"sha256 {bound['head_sha256']} of its first {bound['head_size']} bytes"
        )
        stamps = (bound.get("mtime_ns"), bound.get("ctime_ns"))
        if stamps[0] is not None:
            made += f", modified {stamps[0]} ns, changed {stamps[1]} ns"
        same_file = (st.st_dev, st.st_ino) == (bound["dev"], bound["ino"])
        if same_file and marked:
            return False
        if same_file:
            n = int(bound["head_size"])
            head = pread_all(fd, n, 0)
            unchanged = stamps[0] is None or stamps == (st.st_mtime_ns, st.st_ctime_ns)
            if (
                unchanged
                and st.st_size == bound["size_before"]
                and (hashlib.sha256(head).hexdigest() == bound["head_sha256"])
            ):
                return False  # not started
            if stamps[0] is not None:
                # changed since the commit: applied (every write in place, the journal
                # not yet removed), or rewritten (not the version bound: never mixed)
                now += f", modified {st.st_mtime_ns} ns, changed {st.st_ctime_ns} ns"
                if st.st_size == plan["size"] and _writes_present(fd, journal, plan):
                    return True
            elif _applied_before_stamps(fd, journal, plan, head, n, st.st_size, bound):
                return _writes_present(fd, journal, plan)  # else applied again, as before
            now += f", sha256 {hashlib.sha256(head).hexdigest()} of its first {n} bytes"
        raise StorageError(
            f"{target}: not the file its journal {journal} was made for (the journal: "
            f"{made}; the file now: {now}); not applied, the file is left as it is. "
            f"Remove {journal} if {target} was replaced on purpose"
        )
    finally:
        os.close(fd)


def _applied_before_stamps(
    fd: int, journal: str, plan: dict[str, Any], head: bytes, n: int, size: int, bound: Any
) -> bool:
    """A journal bound without stamps (an older ptestore): applied when the file has
    the plan's size and the first bytes it writes (or keeps)."""
    import hashlib

    jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
    try:
        written = _head_written(plan, jfd, n)
    finally:
        os.close(jfd)
    if written is None:  # the plan keeps the first bytes: they are the ones bound
        kept = hashlib.sha256(head).hexdigest() == str(bound["head_sha256"])
        return size == plan["size"] and kept
    return size == plan["size"] and written == head


def _writes_present(fd: int, journal: str, plan: dict[str, Any]) -> bool:
    """Whether every write of the plan is in the file already (its identifier the
    plan's): a run applied it and stopped before removing its journal."""
    lo, hi = IDENT_RANGE
    if bytes(pread_all(fd, hi - lo, lo)) != bytes.fromhex(plan["ident"]):
        return False
    jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for dst, src, n in plan["writes"]:
            done = 0
            while done < n:
                k = min(_PIECE, n - done)
                have = bytearray(pread_all(fd, k, dst + done))
                want = bytearray(pread_all(jfd, k, src + done))
                start = dst + done
                for i in range(max(lo, start), min(hi, start + k)):  # the identifier:
                    have[i - start] = want[i - start]  # checked above
                if have != want:
                    return False
                done += k
    finally:
        os.close(jfd)
    return True
