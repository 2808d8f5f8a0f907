"""What is checked before a journal (:mod:`ptestore.journal`) is applied: that it is
for this file (:func:`check_target`, against the binding its plan records,
:func:`file_binding`) and that its payload is what its plan says (:func:`check_payload`,
against ``plan["check"]``: the SHA-256 of each chunk of the file's content the writes
touch, as the file will have them, and of each write past the content).

The chunks are those of :mod:`ptestore.provenance.chunks` (their size is in the plan),
so a run with a trailer takes them from its record's chunk digests: the payload costs
that run no hashing of its own. Checking one, at recovery, reads the chunks the writes
touch (from the journal, and the file's own bytes around them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ._io import pread_all
from .errors import StorageError

__all__ = [
    "CHANGING",
    "IDENT_RANGE",
    "OtherFile",
    "Painted",
    "check_bound",
    "check_payload",
    "check_target",
    "file_binding",
    "file_stamps",
    "open_target",
    "painted",
    "payload_check",
    "payload_digests",
    "touched_chunks",
]

#: Where the FlatBuffer file identifier of a .pte is ("ET12" in ExecuTorch 1.x).
IDENT_RANGE = (4, 8)
#: The identifier the file carries while it is being changed (the runtime refuses it;
#: :mod:`ptestore.journal`, which writes it, takes both from here).
CHANGING = b"PTJ~"
#: ``(start, end, source, offset in the source)``: a piece of the file once a plan is
#: applied (:func:`painted`).
Painted = tuple[int, int, str, int]
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
    renamed over since the journal was made): nothing is applied to it. ``now``: what
    the path names (``device D inode I``)."""

    def __init__(self, message: str, now: str = "") -> None:
        super().__init__(message)
        self.now = now


def check_bound(fd: int, target: str, journal: str, plan: dict[str, Any]) -> None:
    """Refuse (:class:`OtherFile`) when the open ``fd`` (the file at ``target``, opened to
    apply ``journal``) is not the device and inode the plan is bound to: the path was
    renamed over after the journal's checks (or its commit). Every write of the apply
    goes through ``fd``, so once this holds, a later rename leaves the new file alone.
    A plan without a binding (an older ptestore's) is checked by size only, earlier
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


def check_target(target: str, journal: str, plan: dict[str, Any]) -> None:
    """Refuse (:class:`StorageError` naming both) to apply ``journal`` to a file that is
    not the one it was made for: another inode (a replaced or re-downloaded file), or
    the same inode with other bytes where the plan writes first and a size that is
    neither the size before nor after. A file marked :data:`CHANGING` on the same inode
    is the one being changed."""
    import hashlib

    bound = plan.get("file")
    fd = open_target(target, journal, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        lo, hi = IDENT_RANGE
        marked = pread_all(fd, hi - lo, lo) == CHANGING
        if bound is None:  # a journal of an older ptestore: its size only
            if marked or st.st_size == plan["size_before"]:
                return
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
            return
        if same_file:
            n = int(bound["head_size"])
            head = pread_all(fd, n, 0)
            unchanged = stamps[0] is None or stamps == (st.st_mtime_ns, st.st_ctime_ns)
            if (
                unchanged
                and st.st_size == bound["size_before"]
                and (hashlib.sha256(head).hexdigest() == bound["head_sha256"])
            ):
                return  # not started
            if stamps[0] is not None:
                # changed since the commit: applied (every write in place, the journal
                # not yet removed), or rewritten (not the version bound: never mixed)
                now += f", modified {st.st_mtime_ns} ns, changed {st.st_ctime_ns} ns"
                if st.st_size == plan["size"] and _writes_present(fd, journal, plan):
                    return
            elif _applied_before_stamps(fd, journal, plan, head, n, st.st_size, bound):
                return
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


def painted(
    size_before: int,
    content: int,
    punch: list[list[int]],
    writes: list[list[int]],
    ident: bool = False,
) -> list[Painted]:
    """What ``[0, content)`` of the file is once a plan is applied, as disjoint pieces
    ``(start, end, source, offset in it)`` in order, ``source`` ``"original"`` (the
    file's own bytes, where they were), ``"zeros"`` (punched, or past the old end) or
    ``"journal"``: the original's bytes, the punched ranges, then the writes in order.
    Applying writes none of the file's pieces but its identifier (:data:`IDENT_RANGE`,
    :data:`CHANGING` until its step 4): with ``ident``, that range is an ``"ident"``
    piece (the plan's identifier), so the pieces read the same at every step."""
    pieces: list[Painted] = [(0, min(size_before, content), "original", 0)]
    if content > size_before:
        pieces.append((size_before, content, "zeros", 0))

    def paint(start: int, end: int, source: str, offset: int) -> None:
        end = min(end, content)
        if start >= end:
            return
        out: list[Painted] = []
        for a, b, src, o in pieces:
            if b <= start or a >= end:
                out.append((a, b, src, o))
                continue
            if a < start:
                out.append((a, start, src, o))
            if b > end:
                out.append((end, b, src, o + (end - a)))
        out.append((start, end, source, offset))
        pieces[:] = sorted(out)

    for off, n in punch:
        paint(off, off + n, "zeros", 0)
    for dst, jofs, n in writes:
        paint(dst, dst + n, "journal", jofs)
    if ident:
        paint(IDENT_RANGE[0], IDENT_RANGE[1], "ident", 0)
    return [p for p in pieces if p[0] < p[1]]


def touched_chunks(
    content: int, chunk_size: int, writes: list[list[int]] | list[tuple[int, int, int]]
) -> list[int]:
    """The chunks (of ``chunk_size`` bytes) of ``[0, content)`` the writes touch, in
    order."""
    out: set[int] = set()
    for dst, _, n in writes:
        end = min(dst + n, content)
        if n and dst < end:
            out.update(range(dst // chunk_size, -(-end // chunk_size)))
    return sorted(out)


def payload_check(
    content: int, chunk_size: int, chunks: dict[int, bytes], beyond: dict[int, bytes]
) -> dict[str, Any]:
    """``plan["check"]``: the SHA-256 ``chunks`` of the touched chunks (by index) of
    ``[0, content)`` in chunks of ``chunk_size`` bytes, and of each write past the
    content, ``beyond`` (by its index in the plan's writes)."""
    return {
        "length": content,
        "chunk_size": chunk_size,
        "chunks": {str(i): d.hex() for i, d in sorted(chunks.items())},
        "beyond": {str(k): d.hex() for k, d in sorted(beyond.items())},
    }


def _sha256(
    fds: dict[str, int | bytes | None], pieces: list[Painted], names: dict[str, str]
) -> bytes:
    """The SHA-256 of ``pieces`` (their sources: a file descriptor, bytes, None for
    zeros; ``names``: the files' paths, for messages)."""
    import hashlib

    h = hashlib.sha256()
    for a, b, src, o in pieces:
        source = fds[src]
        done = 0
        while done < b - a:
            n = min(_PIECE, b - a - done)
            if source is None:
                h.update(bytes(n))
            elif isinstance(source, bytes):
                h.update(source[o + done : o + done + n])
            else:
                data = pread_all(source, n, o + done)
                if len(data) != n:
                    raise StorageError(
                        f"{names[src]}: {len(data)} bytes at offset {o + done} where checking "
                        f"its in-place journal needs {n} (the file is shorter than its plan "
                        "says); not applied"
                    )
                h.update(data)
            done += n
    return h.digest()


def _within(pieces: list[Painted], start: int, end: int) -> list[Painted]:
    """The parts of ``pieces`` in ``[start, end)``."""
    return [
        (max(a, start), min(b, end), src, o + max(0, start - a))
        for a, b, src, o in pieces
        if a < end and b > start
    ]


def payload_digests(
    file_fd: int,
    journal_fd: int,
    plan: dict[str, Any],
    content: int,
    chunk_size: int,
    names: dict[str, str],
    known: Sequence[bytes] | None = None,
) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """What a plan's writes leave in the file: the SHA-256 of each chunk (of
    ``chunk_size`` bytes) of its ``content`` bytes they touch and of each write past the
    content (by its index in the plan's writes), read from the file's own bytes
    (``file_fd``) and the journal's (``journal_fd``); the chunks' from ``known`` (the
    content's chunk digests: a run with a trailer has them) where given. What an
    in-place run records, and what :func:`check_payload` compares with the record.
    ``names``: the files' paths, for messages."""
    writes, cs = plan["writes"], chunk_size
    pieces = painted(plan["size_before"], content, plan["punch"], writes, ident=True)
    fds = {
        "original": file_fd,
        "journal": journal_fd,
        "zeros": None,
        "ident": bytes.fromhex(plan["ident"]),
    }
    touched = touched_chunks(content, cs, writes)
    chunks = {
        i: known[i]
        if known is not None
        else _sha256(fds, _within(pieces, i * cs, min((i + 1) * cs, content)), names)
        for i in touched
    }
    beyond = {
        k: _sha256(fds, [(dst, dst + n, "journal", src)], names)
        for k, (dst, src, n) in enumerate(writes)
        if dst >= content
    }
    return chunks, beyond


def check_payload(target: str, journal: str, plan: dict[str, Any]) -> str:
    """What is wrong with the payload of a journal committed with a check (the chunks
    it would leave in ``target`` are not those its plan names), or ``""``. Nothing to
    check for older journals (their commit record covers the payload)."""
    check = plan.get("check")
    if check is None:
        return ""
    content, cs = int(check["length"]), int(check["chunk_size"])
    touched = touched_chunks(content, cs, plan["writes"])
    planned = sorted(int(i) for i in check["chunks"])
    if planned != touched:
        return f"its plan checks chunks {planned}, its writes touch chunks {touched}"
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
        try:
            jfd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
            try:
                names = {"original": target, "journal": journal}
                chunks, beyond = payload_digests(fd, jfd, plan, content, cs, names)
            finally:
                os.close(jfd)
        finally:
            os.close(fd)
    except StorageError:  # (an OSError too) says what is wrong already
        raise
    except OSError as exc:
        raise StorageError(
            f"{target}: cannot check its in-place journal {journal}: {exc.strerror}; not "
            "applied, both left as they are"
        ) from exc
    for i, d in chunks.items():
        if d.hex() != check["chunks"][str(i)]:
            a, b = i * cs, min((i + 1) * cs, content)
            return (
                f"chunk {i} of what it leaves in the file (bytes {a}..{b}) has SHA-256 "
                f"{d.hex()}, its plan says {check['chunks'][str(i)]}"
            )
    for k, d in beyond.items():
        if check["beyond"].get(str(k)) != d.hex():
            dst, _, n = plan["writes"][k]
            return (
                f"its write of {n} bytes at {dst} has SHA-256 {d.hex()}, its plan says "
                f"{check['beyond'].get(str(k))}"
            )
    return ""
