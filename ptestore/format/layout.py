"""Layout arithmetic: where every segment of a rewritten container goes (no I/O).

The base is chosen first (the original ``segment_base_offset`` whenever the new
metadata fits before it), then segments are placed in their physical order at
absolute offsets aligned to the larger of their original (inferred) alignment and the
alignment a backend asked for. Nothing but alignment padding lies between them, so an
unchanged file keeps every segment where it was and rewriting is idempotent.

Every source byte is placed once. Segments are physical (entries sharing a table are
one segment, see :mod:`.model`), and unchanged segments whose source bytes overlap (two
tables describing the same bytes, or bytes in common) form one *extent*: the union of
their bytes is placed once and each keeps its position inside it. So the segment data
of the output is at most the input's distinct segment bytes, the replacements, and
alignment padding.
"""

from __future__ import annotations

from .._dataclass import dataclass, field
from .header import SEGMENT_BASE_ALIGNMENT, align_up, is_power_of_two
from .model import Container, Segment, inferred_alignment
from .patch import PatchResult, metadata_growth_bound, patch_metadata

__all__ = ["NewSizes", "Placement", "choose_base", "layout_file", "plan_layout"]

#: ``(offset relative to the new base, size)`` of one segment.
Placement = tuple[int, int]
#: Segment index -> ``(new size, requested alignment)`` of a replaced segment.
NewSizes = dict[int, tuple[int, int]]

#: The smallest alignment a moved base keeps.
_MIN_BASE_ALIGNMENT = 16


def choose_base(container: Container, metadata_size: int | None = None) -> int:
    """Where segment data starts in the rewritten file.

    The original ``segment_base_offset`` when the new metadata (``metadata_size``,
    default the original's) fits before it, so an unchanged file keeps its layout and
    rewriting is idempotent; else the end of the metadata grown by the patch engine's
    worst case, aligned up to the original base's own alignment.
    """
    original = container.segment_base_offset
    if container.header is None:
        return 0
    size = container.metadata_size if metadata_size is None else metadata_size
    if original and size <= original:
        return original
    alignment = (
        max(_MIN_BASE_ALIGNMENT, inferred_alignment(original))
        if original
        else SEGMENT_BASE_ALIGNMENT
    )
    return align_up(size + metadata_growth_bound(container), alignment)


def _congruent_up(cursor: int, target: int, modulus: int) -> int:
    """The smallest value >= ``cursor`` that is congruent to ``target`` mod ``modulus``."""
    return cursor + (target - cursor) % modulus


@dataclass
class _Extent:
    """Segments placed together: one replaced or empty segment, or unchanged segments
    whose source bytes overlap (placed as their union, each at its offset inside it)."""

    start: int  # absolute source offset of the first byte
    end: int
    alignment: int  # the largest alignment a member needs
    members: list[Segment] = field(default_factory=list)


def _extents(container: Container, new_sizes: NewSizes, has_base: bool) -> list[_Extent]:
    """The segments grouped into extents, in physical order."""
    out: list[_Extent] = []
    merging: _Extent | None = None  # the open extent of unchanged, non-empty segments
    for seg in sorted(container.segments, key=lambda s: (s.offset, s.index)):
        old_abs = container.absolute(seg)
        original = inferred_alignment(old_abs) if has_base else 1
        if seg.index in new_sizes:
            out.append(_Extent(old_abs, old_abs, max(original, new_sizes[seg.index][1]), [seg]))
            continue
        if merging is not None and old_abs < merging.end:
            merging.end = max(merging.end, old_abs + seg.size)
            merging.alignment = max(merging.alignment, original)
            merging.members.append(seg)
            continue
        if seg.size == 0:  # on its own: it has no bytes to share
            out.append(_Extent(old_abs, old_abs, original, [seg]))
            continue
        merging = _Extent(old_abs, old_abs + seg.size, original, [seg])
        out.append(merging)
    return out


def plan_layout(
    container: Container,
    new_sizes: NewSizes,
    segment_base_offset: int | None = None,
    *,
    block_size: int | None = None,
) -> list[Placement]:
    """Place every segment again, after the new base (default :func:`choose_base`).

    ``new_sizes`` maps a segment index to ``(size, requested_alignment)`` for replaced
    segments. Returns the ``(offset relative to the new base, size)`` of every segment,
    by index.

    Segments keep their physical order; each starts at an *absolute* offset aligned to
    the larger of its original alignment (the largest power of two dividing its
    original absolute offset, capped) and the requested one; nothing but padding lies
    between them. An unchanged file keeps every segment where it was. Unchanged
    segments whose source bytes overlap are placed as one extent (their union, once),
    which starts congruent to its source offset modulo the largest alignment of its
    members, so that every member stays aligned.

    ``block_size`` (a power of two, the destination file system's clone granularity)
    keeps every *unchanged* segment congruent to its source offset modulo the block
    size, so that its whole blocks can be shared with the source (reflink) instead of
    copied. That costs at most ``block_size - 1`` bytes of padding per segment placed
    after a change, and nothing where nothing moved.
    """
    base = choose_base(container) if segment_base_offset is None else segment_base_offset
    if block_size is not None and not is_power_of_two(block_size):
        raise ValueError(f"block_size {block_size} must be a power of two")
    if container.header is None:
        # No extended header: no segment data can exist; keep every offset as it is.
        return [(s.offset, new_sizes.get(s.index, (s.size, 1))[0]) for s in container.segments]
    placements: list[Placement] = [(0, 0)] * len(container.segments)
    cursor = base
    for ext in _extents(container, new_sizes, container.segment_base_offset > 0):
        first = ext.members[0]
        if first.index in new_sizes:
            size = new_sizes[first.index][0]
            absolute = align_up(cursor, ext.alignment)
            placements[first.index] = (absolute - base, size)
            cursor = absolute + size
            continue
        # Congruent to the source modulo the extent's alignment (hence every member is
        # aligned: each member's alignment divides it), or modulo the block size.
        modulus = ext.alignment
        if block_size is not None and modulus < block_size:
            modulus = block_size
        absolute = _congruent_up(cursor, ext.start, modulus)
        for seg in ext.members:
            inside = container.absolute(seg) - ext.start
            placements[seg.index] = (absolute + inside - base, seg.size)
        cursor = absolute + ext.end - ext.start
    return placements


def layout_file(
    container: Container,
    metadata: bytes | bytearray | memoryview,
    new_sizes: NewSizes,
    *,
    block_size: int | None = None,
) -> tuple[list[Placement], PatchResult]:
    """Plan the new layout and patch the metadata for it (``block_size``: see
    :func:`plan_layout`).

    Tries the original base first; if the patched metadata no longer fits before it
    (redirected tables grew it), moves the base past the worst case and lays out again.
    """
    base = choose_base(container)
    placements = plan_layout(container, new_sizes, base, block_size=block_size)
    patched = patch_metadata(container, metadata, placements, segment_base_offset=None)
    if container.header is None or len(patched.metadata) <= base:
        return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)
    base = choose_base(container, len(patched.metadata))
    placements = plan_layout(container, new_sizes, base, block_size=block_size)
    return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)
