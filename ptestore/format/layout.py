"""Layout arithmetic: where every segment of a rewritten container goes (no I/O).

The base is chosen first (the original ``segment_base_offset`` whenever the new
metadata fits before it), then segments are placed in their physical order at
absolute offsets aligned to the larger of their original (inferred) alignment and the
alignment a backend asked for. Nothing but alignment padding lies between them, so an
unchanged file keeps every segment where it was and rewriting is idempotent.
"""

from __future__ import annotations

from .model import Container, inferred_alignment
from .patch import PatchResult, align_up, metadata_growth_bound, patch_metadata

__all__ = ["NewSizes", "Placement", "choose_base", "layout_file", "plan_layout"]

#: ``(offset relative to the new base, size)`` of one segment.
Placement = tuple[int, int]
#: Segment index -> ``(new size, requested alignment)`` of a replaced segment.
NewSizes = dict[int, tuple[int, int]]

#: Base alignment when the original file has no segment base to inherit one from.
_DEFAULT_BASE_ALIGNMENT = 128
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
        else _DEFAULT_BASE_ALIGNMENT
    )
    return align_up(size + metadata_growth_bound(container), alignment)


def plan_layout(
    container: Container,
    new_sizes: NewSizes,
    segment_base_offset: int | None = None,
) -> list[Placement]:
    """Place every segment again, after the new base (default :func:`choose_base`).

    ``new_sizes`` maps a segment index to ``(size, requested_alignment)`` for replaced
    segments. Returns the ``(offset relative to the new base, size)`` of every segment,
    by index.

    Segments keep their physical order; each starts at an *absolute* offset aligned to
    the larger of its original alignment (the largest power of two dividing its
    original absolute offset, capped) and the requested one; nothing but padding lies
    between them. An unchanged file keeps every segment where it was.
    """
    base = choose_base(container) if segment_base_offset is None else segment_base_offset
    if container.header is None:
        # No extended header: no segment data can exist; keep every offset as it is.
        return [(s.offset, new_sizes.get(s.index, (s.size, 1))[0]) for s in container.segments]
    has_base = container.segment_base_offset > 0
    order = sorted(container.segments, key=lambda s: (s.offset, s.index))
    placements: list[Placement] = [(0, 0)] * len(container.segments)
    cursor = base
    for seg in order:
        size, requested = new_sizes.get(seg.index, (seg.size, 1))
        original = inferred_alignment(container.absolute(seg)) if has_base else 1
        absolute = align_up(cursor, max(original, requested))
        placements[seg.index] = (absolute - base, size)
        cursor = absolute + size
    return placements


def layout_file(
    container: Container,
    metadata: bytes | bytearray | memoryview,
    new_sizes: NewSizes,
) -> tuple[list[Placement], PatchResult]:
    """Plan the new layout and patch the metadata for it.

    Tries the original base first; if the patched metadata no longer fits before it
    (redirected tables grew it), moves the base past the worst case and lays out again.
    """
    base = choose_base(container)
    placements = plan_layout(container, new_sizes, base)
    patched = patch_metadata(container, metadata, placements, segment_base_offset=None)
    if container.header is None or len(patched.metadata) <= base:
        return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)
    base = choose_base(container, len(patched.metadata))
    placements = plan_layout(container, new_sizes, base)
    return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)
