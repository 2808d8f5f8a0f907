"""Small POSIX I/O helpers shared by writers and the coordinator."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator
    from typing import BinaryIO

    from .storage.types import DataLoader

__all__ = [
    "HASH_PIECE",
    "REQUEST_PIECE",
    "file_size_limit",
    "free_bytes",
    "free_inodes",
    "pread_all",
    "preadinto_all",
    "pwrite_all",
    "read_bounded",
    "read_pieces",
]

#: The buffer a file is read into to be hashed: small enough to stay in the core's
#: cache between the kernel's copy into it and the hash reading it back. Measured here
#: (2 vCPUs, a VM) on 1 GiB just written, SHA-256 and CRC-32 on two threads: pieces of
#: 64-128 KiB read in 0.07-0.11 s of system time, pieces of 192 KiB to 8 MiB in
#: 0.42-0.66 s (0.58 s of wall time in all against 0.76-0.96 s; SHA-256 alone on one
#: thread, 128 KiB against 2 MiB: 0.80 against 1.18 s). A fresh buffer's pages also
#: cost their first touch.
HASH_PIECE = 128 << 10
#: What :func:`read_pieces` asks a loader without ``readinto`` for at a time (one
#: request each: what ``fleet plan`` counts).
REQUEST_PIECE = 8 << 20


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less); raises
    ``OSError`` as the system reports it."""
    done, n = 0, data.nbytes
    while done < n:
        done += os.pwrite(fd, data[done:], offset + done)


def pread_all(fd: int, size: int, offset: int) -> bytes:
    """Read ``size`` bytes at ``offset`` (``os.pread`` may read less); shorter only at
    end of file. Raises ``OSError`` as the system reports it. Past 1 GiB (what one
    ``pread`` may return), the bytes are read into one buffer of ``size`` (a
    ``bytearray``, never a join of pieces: the peak is the size, not twice it)."""
    if size > _PREAD_MAX:
        buffer = bytearray(size)
        with memoryview(buffer) as view:
            got = preadinto_all(fd, view, offset)
        if got < size:
            del buffer[got:]
        return buffer  # type: ignore[return-value]  # bytes-like; a copy would double it
    chunks: list[bytes] = []
    done = 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def preadinto_all(fd: int, view: memoryview, offset: int) -> int:
    """Read into all of ``view`` (writable, bytes) from ``offset``, straight into its
    memory (``os.preadv``, no intermediate ``bytes``); returns the bytes read, fewer only
    at end of file. Raises ``OSError`` as the system reports it."""
    done, n = 0, view.nbytes
    while done < n:
        if _PREADV is not None:
            got = _PREADV(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - systems without preadv: one copy per call
            chunk = os.pread(fd, min(n - done, 1 << 30), offset + done)
            got = len(chunk)
            view[done : done + got] = chunk
        if got == 0:
            break
        done += got
    return done


_PREADV = getattr(os, "preadv", None)
#: The most one ``pread`` is asked for (Linux returns at most about 2 GiB per call).
_PREAD_MAX = 1 << 30


def free_bytes(path: str) -> int | None:
    """Bytes this user may still allocate on the file system of ``path`` (a directory
    or a file on it): ``f_bavail * f_frsize``, not the blocks kept for root. None when
    the system does not say (``statvfs`` failed)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def free_inodes(path: str) -> int | None:
    """Inodes (files, directories) this user may still make on the file system of
    ``path``: ``f_favail``. None when the system does not say (``statvfs`` failed, or a
    file system that does not count them: ``f_files`` 0, as btrfs)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_favail if st.f_files else None


def file_size_limit() -> int | None:
    """The largest file this process may write (the soft ``RLIMIT_FSIZE``, ``ulimit -f``),
    in bytes; None when it has none. A write past it fails with ``EFBIG`` ("File too
    large"); ``fallocate`` ignores it, so space reserved that way does not say so."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft


def read_bounded(f: BinaryIO, limit: int) -> bytes:
    """What the open file ``f`` holds from its position, but at most ``limit + 1``
    bytes (one past the bound: the caller tells a file larger than ``limit`` from
    one that fits), asked for as the file's size says (``fstat``), never as the bound
    says: a buffered ``read(n)`` allocates its ``n`` bytes before it reads any, so a
    150 KB file read with a bound of 1 GiB allocated 1 GiB (a process under an
    address-space limit failed). A file that grew since is read on in pieces of
    :data:`HASH_PIECE`, still to ``limit + 1`` at most."""
    want = limit + 1
    try:
        ask = min(os.fstat(f.fileno()).st_size + 1, want)
    except (OSError, ValueError, AttributeError):  # no descriptor to ask: in pieces
        ask = min(HASH_PIECE, want)
    parts: list[bytes] = []
    got = 0
    while got < want:
        piece = f.read(min(ask, want - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
        ask = HASH_PIECE
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_pieces(
    loader: DataLoader,
    offset: int,
    size: int,
    *,
    cancelled: threading.Event | None = None,
    buffer_size: int = REQUEST_PIECE,
    buffers: int = 1,
) -> Iterator[bytes | bytearray | memoryview]:
    """``size`` bytes of ``loader`` from ``offset``, in order, in pieces: a loader that
    reads into memory it is given (``readinto``: local files) fills one reused buffer of
    ``buffer_size`` bytes, so a multi-GB file costs one piece of memory (each piece is
    valid until the next); any other gives one ``load`` of :data:`REQUEST_PIECE` bytes
    per piece. ``buffers``: how many buffers the pieces take turns in (with 2, a piece
    stays valid until the next but one: the caller may still be hashing it in another
    thread). ``cancelled``: stop (:class:`~ptestore._background.Cancelled`) between
    pieces once it is set. The one read loop of every hash of a loader's bytes (the
    provenance digests, ``inspect --compare``'s segment digests)."""
    from ._background import check
    from .storage.types import load_into

    end = offset + size
    buffered = hasattr(loader, "readinto")
    piece = buffer_size if buffered else REQUEST_PIECE
    pool = [memoryview(bytearray(min(piece, size))) for _ in range(buffers if buffered else 0)]
    k = 0
    while offset < end:
        check(cancelled)
        n = min(piece, end - offset)
        if not pool:
            yield loader.load(offset, n)
        else:
            buffer = pool[k % len(pool)][:n]
            load_into(loader, offset, buffer)
            yield buffer
        offset += n
        k += 1
