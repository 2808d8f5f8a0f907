"""Delta fetch: the chunks of a download that local files (its *bases*) already hold.

A download with a chunk record (:mod:`ptestore.provenance.chunks`: a SHA-256 per 4 MiB
chunk of the content, from the artifact's trailer, pinned by the index) needs from the
store only the chunks no base has. A base is any local file: an earlier artifact of
the model (the cache entry ``ensure`` is replacing, last month's download), or the
portable source.

Which base chunk could be target chunk ``i``: the bytes at the same offsets, or, when
both files' layouts are known and the base keeps the chunk's segments elsewhere (a
replacement of another size moved them), the ranges :mod:`.shift` finds there:

- **known**: the base's own trailer records v2 chunk digests on the same grid (same
  chunk size, the same span) and nothing in the chunk moved: compared with the target's
  digest, nothing is read;
- **candidate**: otherwise, when the base has bytes at that span: read and hashed
  (only the spans that could match, never the rest of the base).

Neither is trusted into the output. :func:`fill` puts each chunk into the ``.part``
(a reflink clone of the base's range where the file system shares extents, else a
copy: read, hash, write) and checks the bytes that landed against the **target's**
digest: a chunk whose bytes differ (a candidate that is not the same, or a base whose
trailer claims a digest its bytes do not have) is tried from the next base that could
hold it (:func:`fill_each`), and left to the store when none is left; the second kind is
reported by name (:attr:`Filled.lied`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .._dataclass import dataclass, field
from .._io import pread_all, preadinto_all, pwrite_all
from ..errors import ConfigurationError, FormatError, PteStoreError

if TYPE_CHECKING:
    from ..format.model import Container
    from ..provenance.chunks import ChunkDigests
    from ..storage.loaders import LocalFileLoader
    from .shift import Moves, Piece

__all__ = [
    "Base",
    "Filled",
    "Match",
    "fill",
    "fill_each",
    "match_chunks",
    "open_bases",
    "recorded",
    "workers",
]


def workers() -> int:
    """Threads for hashing and copying chunks (hashlib and pread/pwrite release the GIL)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(1, min(8, cores))


@dataclass
class Base:
    """A local file a download may take chunks from."""

    path: str
    loader: LocalFileLoader
    #: Its file size.
    size: int
    #: The chunk digests its own trailer records for its content (None: no v2 record,
    #: or a damaged one: its chunks are hashed where they could match).
    chunks: ChunkDigests | None
    #: Its container's layout, once :meth:`layout` read it (None: not a container).
    _layout: Container | None = None
    _layout_read: bool = False

    def fileno(self) -> int:
        return self.loader.fileno()

    def layout(self) -> Container | None:
        """The base's parsed metadata (where its segments are); None when it is not a
        .pte or .ptd ptestore can read. Read once."""
        if not self._layout_read:
            from ..format.reader import read_container

            self._layout_read = True
            try:
                self._layout = read_container(self.loader).container
            except (PteStoreError, OSError, ValueError):
                pass  # not a container (or unreadable): used at the same offsets only
        return self._layout

    def close(self) -> None:
        self.loader.close()


def recorded(loader: LocalFileLoader) -> ChunkDigests | None:
    from ..provenance.record import Provenance
    from ..provenance.trailer import read_trailer

    try:
        trailer = read_trailer(loader)
        if trailer is None:
            return None
        content = Provenance.of_trailer(trailer, loader.name).content
    except (FormatError, ValueError):
        return None  # a damaged trailer or record: the base's bytes are hashed instead
    if content is None or content.chunks is None:
        return None
    return content.chunks


def open_bases(paths: Sequence[str], *, required: bool) -> list[Base]:
    """Open each base (a regular local file: :func:`.fetch_checks.open_base`) and read
    its chunk record; one that is missing or cannot be used is a
    :class:`ConfigurationError` when ``required`` (given by the user), else skipped."""
    from .fetch_checks import open_base

    out: list[Base] = []
    for path in paths:
        try:
            loader = open_base(path)
        except ConfigurationError:
            if not required:
                continue
            for b in out:
                b.close()
            raise
        out.append(Base(path, loader, loader.size(), recorded(loader)))
    return out


@dataclass(frozen=True)
class Match:
    """Target chunk ``index`` may be ``base``'s bytes at ``offset``; ``known`` when the
    base's own record says so (else a candidate: it is hashed when filled). ``pieces``
    (:data:`.shift.Piece`) when the chunk is several ranges of the base (and zeros)."""

    index: int
    base: Base
    offset: int
    known: bool
    pieces: tuple[Piece, ...] = ()


def match_chunks(
    record: ChunkDigests,
    todo: Sequence[int],
    bases: Sequence[Base],
    moves: Sequence[Moves | None] | None = None,
    tried: Mapping[int, set[int]] | None = None,
) -> list[Match]:
    """For each chunk of ``todo``, the first base that could hold it (see the module);
    ``moves`` (one per base, :func:`.shift.segment_moves`) where the target's layout is
    known; ``tried``: by chunk, the bases (``id``) whose bytes for it did not check
    (not matched again)."""
    from .shift import chunk_pieces

    out: list[Match] = []
    for i in todo:
        a, b = record.span(i)
        found: Match | None = None
        skip = tried.get(i, set()) if tried is not None else set()
        for k, base in enumerate(bases):
            if id(base) in skip:
                continue
            mv = moves[k] if moves is not None else None
            pieces = chunk_pieces(mv, a, b) if mv is not None else ((a, b, a),)
            if pieces is None:
                continue
            if pieces == ((a, b, a),):
                own = base.chunks
                same_grid = (
                    own is not None
                    and own.chunk_size == record.chunk_size
                    and i < len(own.digests)
                    and own.span(i) == (a, b)
                )
                if same_grid:
                    assert own is not None
                    if own.digests[i] == record.digests[i]:
                        found = Match(i, base, a, True)
                        break
                    continue  # its record says these bytes differ: not this base
                if b <= base.size and found is None:
                    found = Match(i, base, a, False)
            elif found is None:
                off = pieces[0][2]
                if len(pieces) == 1 and off is not None:
                    found = Match(i, base, off, False)
                elif any(p[2] is not None for p in pieces):  # not padding alone
                    found = Match(i, base, a, False, pieces)
        if found is not None:
            out.append(found)
    return out


@dataclass
class Filled:
    """What :func:`fill` put into the ``.part``."""

    #: Chunks in place and verified against the target's digest.
    done: set[int] = field(default_factory=set)
    #: Bytes of those (cloned ones included).
    nbytes: int = 0
    #: Bytes shared by reflink clones (no copy, no new disk blocks).
    cloned: int = 0
    #: ``(chunk, start, end, base path)`` of chunks a base's own record names with the
    #: target's digest while its bytes have another: damaged or changed since.
    lied: list[tuple[int, int, int, str]] = field(default_factory=list)
    #: Bytes of the bases read (and hashed).
    read: int = 0
    #: Bytes taken from each base, by path.
    bases: dict[str, int] = field(default_factory=dict)

    def add(self, other: Filled) -> None:
        """Count what another :func:`fill` of the same ``.part`` put in too."""
        self.done |= other.done
        self.nbytes += other.nbytes
        self.cloned += other.cloned
        self.lied += other.lied
        self.read += other.read
        for path, n in other.bases.items():
            self.bases[path] = self.bases.get(path, 0) + n


_BUFFERS = threading.local()


def _buffer(size: int) -> memoryview:
    """This thread's reused buffer of at least ``size`` bytes (no allocation per chunk:
    a fresh 4 MiB ``bytes`` per read costs page faults, more than the copy)."""
    buf: bytearray | None = getattr(_BUFFERS, "buf", None)
    if buf is None or len(buf) < size:
        buf = bytearray(size)
        _BUFFERS.buf = buf
    return memoryview(buf)[:size]


def _digest(fd: int, offset: int, size: int) -> bytes:
    view = _buffer(size)
    got = preadinto_all(fd, view, offset)
    return hashlib.sha256(view[:got]).digest() if got == size else b""


def _copy_range(src: int, src_offset: int, size: int, dst: int, dst_offset: int) -> bool:
    """``size`` bytes copied in the kernel (``copy_file_range``: no pass through this
    process, a fifth of the CPU of read and write); False when the system cannot (then
    nothing was copied that matters: the caller copies by hand over it)."""
    copy = getattr(os, "copy_file_range", None)
    done = 0
    while copy is not None and done < size:
        try:
            n = copy(src, dst, size - done, src_offset + done, dst_offset + done)
        except OSError:
            return False  # another file system, an old kernel, a special file
        if n == 0:
            return False  # the base ends early
        done += n
    return done == size


def _runs(record: ChunkDigests, matches: list[Match]) -> list[list[Match]]:
    """Consecutive matches of one base at one shift (one clone each)."""
    runs: list[list[Match]] = []
    for m in matches:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and last.base is m.base
            and last.index + 1 == m.index
            and m.offset - record.span(m.index)[0] == last.offset - record.span(last.index)[0]
        ):
            runs[-1].append(m)
        else:
            runs.append([m])
    return runs


def fill(
    part_fd: int,
    directory: str,
    record: ChunkDigests,
    matches: Sequence[Match],
    on_chunk: Callable[[int, int], None] | None = None,
) -> Filled:
    """Put every chunk of ``matches`` its base really holds into the ``.part`` (open as
    ``part_fd`` in ``directory``, at least ``record.length`` bytes long), verified; see
    the module. ``on_chunk(index, nbytes)`` is called for each chunk put in place."""
    from ..writers._clone import clone_range, probe_clone_block_size

    out = Filled()
    blocks: dict[int, int | None] = {}
    to_copy: list[Match] = []
    to_check: list[Match] = []
    to_copy += [m for m in matches if m.pieces]
    for run in _runs(record, [m for m in matches if not m.pieces]):
        base = run[0].base
        key = id(base)
        if key not in blocks:
            blocks[key] = probe_clone_block_size(directory, base.fileno(), part_fd)
        block = blocks[key]
        if block is None:
            to_copy += run
            continue
        # The aligned whole of the run is cloned at once; a short last chunk (the end of
        # the content) is copied.
        start = run[0].offset
        dst = record.span(run[0].index)[0]
        end_dst = record.span(run[-1].index)[1]
        length = end_dst - dst
        cut = length - length % block
        if (
            start % block
            or dst % block
            or cut == 0
            or not clone_range(base.fileno(), start, cut, part_fd, dst)
        ):
            to_copy += run
            continue
        out.cloned += cut
        for m in run:
            a, b = record.span(m.index)
            (to_check if b <= dst + cut else to_copy).append(m)

    def check(m: Match) -> tuple[Match, bool]:
        a, b = record.span(m.index)
        return m, _digest(part_fd, a, b - a) == record.digests[m.index]

    def copy(m: Match) -> tuple[Match, bool]:
        a, b = record.span(m.index)
        if m.pieces:
            for s, e, off in m.pieces:
                if off is None:
                    pwrite_all(part_fd, memoryview(bytes(e - s)), s)
                elif not _copy_range(m.base.fileno(), off, e - s, part_fd, s):
                    view = _buffer(e - s)
                    if preadinto_all(m.base.fileno(), view, off) != e - s:
                        return m, False
                    pwrite_all(part_fd, view, s)
            return check(m)
        if _copy_range(m.base.fileno(), m.offset, b - a, part_fd, a):
            return check(m)  # what landed in the .part is what is checked
        view = _buffer(b - a)
        got = preadinto_all(m.base.fileno(), view, m.offset)
        if got != b - a or hashlib.sha256(view).digest() != record.digests[m.index]:
            return m, False
        pwrite_all(part_fd, view, a)
        return m, True

    checked = set(id(m) for m in to_check)

    def one(m: Match) -> tuple[Match, bool]:
        return check(m) if id(m) in checked else copy(m)

    jobs = to_check + to_copy
    with ThreadPoolExecutor(min(workers(), max(1, len(jobs))), "ptestore-delta") as pool:
        for m, ok in pool.map(one, jobs):
            a, b = record.span(m.index)
            out.read += b - a
            if ok:
                out.done.add(m.index)
                out.nbytes += b - a
                out.bases[m.base.path] = out.bases.get(m.base.path, 0) + b - a
                if on_chunk is not None:
                    on_chunk(m.index, b - a)
            elif m.known:
                out.lied.append((m.index, a, b, m.base.path))
    if out.cloned:
        # What was cloned but does not check is overwritten from the store later; what
        # checks counts as cloned only.
        out.cloned = sum(
            record.span(m.index)[1] - record.span(m.index)[0]
            for m in to_check
            if m.index in out.done
        )
    return out


def fill_each(
    part_fd: int,
    directory: str,
    record: ChunkDigests,
    todo: Sequence[int],
    bases: Sequence[Base],
    on_chunk: Callable[[int, int], None] | None = None,
    moves: Sequence[Moves | None] | None = None,
    tried: dict[int, set[int]] | None = None,
) -> Filled:
    """:func:`fill` the chunks of ``todo`` the bases hold (:func:`match_chunks`); a chunk
    whose bytes in one base do not check is tried from the next base that could hold it,
    until one does or none is left (then it is the store's). ``tried`` (by chunk, the
    bases that failed it) is kept up to date across calls."""
    tried = {} if tried is None else tried
    out = Filled()
    left = list(todo)
    while left:
        matches = match_chunks(record, left, bases, moves, tried)
        if not matches:
            break
        got = fill(part_fd, directory, record, matches, on_chunk)
        out.add(got)
        for m in matches:
            tried.setdefault(m.index, set()).add(id(m.base))
        left = [m.index for m in matches if m.index not in got.done]
    return out


def copy_whole(base: Base, part_fd: int, directory: str) -> int:
    """Put all of ``base`` into the (empty) ``.part``: a reflink clone of the whole file
    where the file system shares extents, else an in-kernel copy (``copy_file_range``),
    else read and write. Returns the bytes cloned (0 when copied). The caller checks
    the result as a download (the base is not trusted)."""
    from ..writers._clone import clone_range, probe_clone_block_size

    src = base.fileno()
    if probe_clone_block_size(directory, src, part_fd) is not None and clone_range(
        src, 0, base.size, part_fd, 0
    ):
        return base.size
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    while done < base.size and copy_range is not None:
        try:
            n = copy_range(src, part_fd, base.size - done, done, done)
        except OSError:
            break  # another file system, an old kernel: copy by hand
        if n == 0:
            break
        done += n
    while done < base.size:
        data = pread_all(src, min(8 << 20, base.size - done), done)
        if not data:
            break
        pwrite_all(part_fd, memoryview(data), done)
        done += len(data)
    return 0
