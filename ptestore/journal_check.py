"""What is checked before a journal (:mod:`ptestore.journal`) is applied: that its plan
is one a run writes (:func:`plan_problem`: every field's type and range) and that its
payload is what its plan says (:func:`check_payload`, against ``plan["check"]``: the
SHA-256 of each chunk of the file's content the writes touch, as the file will have
them, and of each write past the content). That it is for this file is
:mod:`ptestore.journal_binding`'s.

The chunks are those of :mod:`ptestore.provenance.chunks` (their size is in the plan),
so a run with a trailer takes them from its record's chunk digests: the payload costs
that run no hashing of its own. Checking one, at recovery, reads the chunks the writes
touch (from the journal, and the file's own bytes around them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeGuard

from ._io import pread_all
from ._text import shown
from .errors import StorageError

__all__ = [
    "CHANGING",
    "IDENT_RANGE",
    "Painted",
    "check_payload",
    "painted",
    "payload_check",
    "payload_digests",
    "plan_problem",
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


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ranges(value: object, width: int) -> TypeGuard[list[list[int]]]:
    return isinstance(value, list) and all(
        isinstance(r, list) and len(r) == width and all(_count(x) for x in r) for r in value
    )


def plan_problem(plan: dict[str, Any], payload: int) -> str:
    """What makes a committed plan one no in-place run writes (its fields' types, its
    writes outside the file or the journal's ``payload`` bytes, a size its check does
    not account for), or ``""``: such a plan is never applied, whatever its commit
    record says."""
    ident, size, before = plan.get("ident"), plan.get("size"), plan.get("size_before")
    if not isinstance(ident, str) or len(ident) != 8 or not _is_hex(ident):
        return f"names identifier {ident!r}, not 4 bytes in hex"
    if not _count(size) or not _count(before):
        return f"names size {size!r} after and {before!r} before: not byte counts"
    writes, punch = plan.get("writes"), plan.get("punch")
    if not _ranges(writes, 3) or not _ranges(punch, 2):
        return "has writes or released ranges that are not lists of byte counts"
    for dst, src, n in writes:
        if src + n > payload or dst + n > size:
            return (
                f"writes {n} bytes from journal offset {src} to file offset {dst}: outside "
                f"its payload ({payload} bytes) or the file's new size ({size})"
            )
    for off, n in punch:
        if off + n > max(size, before):
            return f"releases bytes {off}..{off + n}, past the file ({max(size, before)})"
    problem = _binding_problem(plan.get("file"), before)
    if problem:
        return problem
    check = plan.get("check")
    if check is None:  # an older journal: its commit record covers its payload
        return ""
    length, cs = check.get("length"), check.get("chunk_size")
    if not _count(length) or not _count(cs) or cs == 0 or length > size:
        return f"checks {length!r} bytes in chunks of {cs!r}, for a file of {size} bytes"
    chunks, beyond = check.get("chunks"), check.get("beyond")
    if not _digests(chunks, None) or not _digests(beyond, len(writes)):
        return (
            f"checks chunks {shown(chunks)} and writes past the content {shown(beyond)}: "
            "not digests (64 hex digits) by index"
        )
    past = sorted((dst, dst + n) for dst, _, n in writes if dst + n > length)
    end = length
    for a, b in past:
        if a < length:
            return f"writes bytes {a}..{b} across the end of what it checks ({length})"
        if a > end:
            return f"leaves bytes {end}..{a} of the file unchecked"
        end = max(end, b)
    if end != size:
        return f"leaves bytes {end}..{size} of the file unchecked"
    return ""


_HEX = frozenset("0123456789abcdefABCDEF")


def _is_hex(text: str) -> bool:
    """Hex digits only (``bytes.fromhex`` would take spaces too)."""
    return len(text) % 2 == 0 and all(c in _HEX for c in text)


def _digests(value: object, count: int | None) -> bool:
    """A JSON object of SHA-256 digests (64 hex digits) by index (a decimal string; below
    ``count`` when given)."""
    if not isinstance(value, dict):
        return False
    for k, d in value.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) < 20):
            return False
        if count is not None and int(k) >= count:
            return False
        if not (isinstance(d, str) and len(d) == 64 and _is_hex(d)):
            return False
    return True


def _binding_problem(bound: object, before: int) -> str:
    """What is wrong with a plan's binding to its file (``plan["file"]``; None: an older
    ptestore's plan, bound by its size only), or ``""``."""
    if bound is None:
        return ""
    counts = ("dev", "ino", "size_before", "head_size")
    if not (
        isinstance(bound, dict)
        and all(_count(bound.get(k)) for k in counts)
        and isinstance(bound.get("head_sha256"), str)
        and len(bound["head_sha256"]) == 64
        and _is_hex(bound["head_sha256"])
        and all(_time(bound.get(k)) for k in ("mtime_ns", "ctime_ns"))
        and ("mtime_ns" in bound) == ("ctime_ns" in bound)
    ):
        return (
            f"binds it to a file described as {shown(bound)}: not a device, an inode, "
            "sizes, a SHA-256 and times"
        )
    if bound["size_before"] != before:
        return f"binds it to a file of {bound['size_before']} bytes, its size before {before}"
    return ""


def _time(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


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
