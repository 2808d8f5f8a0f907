"""Layout arithmetic: where every segment of a rewritten container goes (no I/O).

The base is chosen first (the original ``segment_base_offset`` whenever the new
metadata fits before it), then segments are placed in their physical order at
absolute offsets aligned to the larger of their original (inferred) alignment and the
alignment a backend asked for. Nothing but alignment padding lies between them, so an
unchanged file keeps every segment where it was and rewriting is idempotent.
"""

from __future__ import annotations

from .header import SEGMENT_BASE_ALIGNMENT, align_up, is_power_of_two
from .model import Container, inferred_alignment
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
    between them. An unchanged file keeps every segment where it was.

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
    has_base = container.segment_base_offset > 0
    order = sorted(container.segments, key=lambda s: (s.offset, s.index))
    placements: list[Placement] = [(0, 0)] * len(container.segments)
    cursor = base
    for seg in order:
        size, requested = new_sizes.get(seg.index, (seg.size, 1))
        old_abs = container.absolute(seg)
        original = inferred_alignment(old_abs) if has_base else 1
        alignment = max(original, requested)
        absolute = align_up(cursor, alignment)
        if block_size is not None and seg.index not in new_sizes and alignment < block_size:
            # Congruent to the source mod the block size, hence aligned as well (the
            # block size is a multiple of the alignment). An alignment of a block or
            # more already keeps the offset congruent (both are 0 mod the block size).
            absolute = _congruent_up(cursor, old_abs, block_size)
        placements[seg.index] = (absolute - base, size)
        cursor = absolute + size
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
