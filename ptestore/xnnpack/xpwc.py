"""XNNPACK's packed-weight file ("XPWC" version 2, ExecuTorch 1.4.1) and its checks.

Layout (backends/xnnpack/runtime/XNNWeightsCache.cpp of the wheel's revision): packed
regions at page-aligned offsets, then an index of entries ``u32 name_len, name,
u64 offset, u64 size, u32 seed``, then a 20-byte footer ``u64 index_start,
u32 entry_count, u32 magic ("XPWC", 0x58505743), u32 version (2)``, all little-endian.
An entry's name is the named-data key of the packed weight, followed by the key of its
bias when it has one.

The runtime checks the footer and each entry's bounds, nothing else (no checksum): that
is what ptestore adds, before the runtime is ever pointed at a file. It does not check an
entry's alignment either: it maps the whole file (at a page boundary) and hands XNNPACK
each region at the address its offset gives, and XNNPACK's kernels read a packed weight
with aligned SIMD loads (ExecuTorch's ``kPackedAllocationAlignment``, XNNPACK's
``XNN_ALLOCATION_ALIGNMENT``: 64 bytes on x86-64, less elsewhere). A region at an offset
that is not a multiple of that crashes the process that loads the file (SIGSEGV), so
:func:`parse_index` refuses it (:data:`ALIGNMENT`). The runtime itself writes every
region at a page boundary, a multiple of any of these.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from .._dataclass import dataclass
from ..errors import FormatError

if TYPE_CHECKING:
    from ..format.xnnpack import PackedWeight

__all__ = [
    "ALIGNMENT",
    "FOOTER_SIZE",
    "MAGIC",
    "VERSION",
    "Entry",
    "check_coverage",
    "check_names",
    "parse_index",
]

MAGIC = 0x58505743
VERSION = 2
FOOTER_SIZE = 20
#: What a region's offset must be a multiple of: the largest alignment XNNPACK expects of
#: a packed weight (``XNN_ALLOCATION_ALIGNMENT``, 64 on x86-64; ExecuTorch's
#: ``kPackedAllocationAlignment``). The runtime's own files place regions at page offsets.
ALIGNMENT = 64
_FOOTER = struct.Struct("<QIII")
_ENTRY_TAIL = struct.Struct("<QQI")


@dataclass(frozen=True)
class Entry:
    name: str
    offset: int
    size: int
    seed: int


def parse_index(data: bytes | memoryview, source: str) -> list[Entry]:
    """The entries of a whole packed-weight file, every bound and each region's alignment
    (:data:`ALIGNMENT`) checked; a :class:`FormatError` naming the field, its value and the
    limit otherwise."""
    size = len(data)
    if size < FOOTER_SIZE:
        raise FormatError(source, "file size", size, f">= {FOOTER_SIZE} (the footer)")
    index_start, count, magic, version = _FOOTER.unpack_from(data, size - FOOTER_SIZE)
    if magic != MAGIC:
        raise FormatError(source, "footer magic", hex(magic), f"{hex(MAGIC)} ('XPWC')")
    if version != VERSION:
        raise FormatError(source, "footer version", version, str(VERSION))
    end = size - FOOTER_SIZE
    if index_start > end:
        raise FormatError(source, "footer index_start", index_start, f"<= {end}")
    if count == 0:
        raise FormatError(source, "footer entry_count", 0, ">= 1")
    entries: list[Entry] = []
    pos = index_start
    for i in range(count):
        if pos + 4 > end:
            raise FormatError(source, f"index entry {i}", pos, f"a name length before {end}")
        (name_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + name_len + _ENTRY_TAIL.size > end:
            raise FormatError(
                source, f"index entry {i} name_len", name_len, f"<= {end - pos - _ENTRY_TAIL.size}"
            )
        try:
            name = bytes(data[pos : pos + name_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(source, f"index entry {i} name", "bytes", "UTF-8") from None
        pos += name_len
        offset, length, seed = _ENTRY_TAIL.unpack_from(data, pos)
        pos += _ENTRY_TAIL.size
        if offset >= index_start or length > index_start - offset or length == 0:
            raise FormatError(
                source,
                f"index entry {i} ({name!r}) offset/size",
                f"{offset}/{length}",
                f"a non-empty region before the index at {index_start}",
            )
        if offset % ALIGNMENT:
            raise FormatError(
                source,
                f"index entry {i} ({name!r}) offset",
                offset,
                f"a multiple of {ALIGNMENT} (XNNPACK reads a packed weight at that "
                "alignment: the runtime would crash loading this file)",
            )
        entries.append(Entry(name, offset, length, seed))
    if pos != end:
        raise FormatError(source, "index end", pos, f"{end} (the footer)")
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise FormatError(source, "index entry names", "duplicates", "unique")
    spans = sorted((e.offset, e.offset + e.size, e.name) for e in entries)
    for (_, a_end, a), (b_start, _, b) in itertools.pairwise(spans):
        if b_start < a_end:
            raise FormatError(source, f"region of {b!r}", b_start, f">= {a_end} (end of {a!r})")
    return entries


def check_names(entries: list[Entry], keys: Collection[str], source: str) -> None:
    """Every entry's name is one of the artifact's XNNPACK keys, or a key followed by
    another (weight and bias); a :class:`FormatError` naming the first that is not.

    Linear in entries and keys: a name is split only where a key can end (at most one
    split per distinct key length shorter than the name), never compared with every key."""
    known = set(keys)
    lengths = sorted({len(k) for k in known if k})
    for e in entries:
        if e.name not in known and not _two_keys(e.name, known, lengths):
            raise FormatError(
                source,
                "index entry name",
                e.name,
                "one of the artifact's XNNPACK named-data keys, or a weight key followed "
                "by its bias key",
            )


def _two_keys(name: str, known: set[str], lengths: list[int]) -> bool:
    """Whether ``name`` is a key of ``known`` followed by another (``lengths``: the keys'
    distinct lengths, ascending): tried only where a key can end inside the name."""
    for n in lengths:
        if n >= len(name):
            return False
        if name[:n] in known and name[n:] in known:
            return True
    return False


def check_coverage(entries: list[Entry], weights: Iterable[PackedWeight], source: str) -> None:
    """Every weight the artifact's XNNPACK delegate packs (the filter, with its bias, of
    each packing node: :func:`ptestore.format.xnnpack.parse_packed_weights`) has its
    entry: a :class:`FormatError` naming the first weight's key that has none (a load
    with such a file packs that weight again, at every load)."""
    names = {e.name for e in entries}
    for w in weights:
        if w.entry_name not in names and w.filter_key not in names:
            bias = f" with its bias {w.bias_key!r}" if w.bias_key else ""
            raise FormatError(
                source,
                "index entries (weight)",
                w.filter_key,  # the value: a message shows 80 characters of it
                f"a weight with an entry (XNNPACK packs every weight: none for this "
                f"one{bias}, {w.node} {w.where})",
            )
