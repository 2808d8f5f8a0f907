"""Layout arithmetic: compaction, alignment, and block congruence for clones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fixtures import all_fixtures, get_fixture

from ptestore.format import parse
from ptestore.format.header import PteHeader
from ptestore.format.layout import layout_file, plan_layout
from ptestore.format.model import Container, Segment, inferred_alignment

BLOCK = 4096


def _container(name: str) -> tuple[Container, bytes]:
    data = get_fixture(name).main_path.read_bytes()
    return parse(data, len(data), name), data


@pytest.mark.parametrize("name", [f.name for f in all_fixtures()])
def test_unchanged_file_keeps_every_offset_with_or_without_blocks(name: str) -> None:
    c, _ = _container(name)
    plain = plan_layout(c, {})
    blocky = plan_layout(c, {}, block_size=BLOCK)
    assert plain == blocky == [(s.offset, s.size) for s in c.segments]


def _grown_layout(name: str, block: int | None) -> tuple[Container, list[tuple[int, int]], int]:
    c, data = _container(name)
    first = min(c.segments, key=lambda s: s.offset)
    placements, patched = layout_file(
        c, data[: c.metadata_size], {first.index: (first.size + 100, 1)}, block_size=block
    )
    return c, placements, patched.segment_base_offset


@pytest.mark.parametrize("name", ["mlp_xnnpack", "conv_xnnpack", "two_methods_xnnpack"])
def test_block_size_keeps_unchanged_segments_congruent_after_a_growth(name: str) -> None:
    c, placements, base = _grown_layout(name, BLOCK)
    first = min(c.segments, key=lambda s: s.offset)
    for seg in c.segments:
        if seg.index == first.index or not seg.size:
            continue
        new_abs = base + placements[seg.index][0]
        old_abs = c.absolute(seg)
        assert (new_abs - old_abs) % BLOCK == 0, seg
        assert new_abs % inferred_alignment(old_abs) == 0  # alignment never weakened


@pytest.mark.parametrize("name", ["mlp_xnnpack", "conv_xnnpack", "two_methods_xnnpack"])
def test_block_congruence_costs_at_most_a_block_per_segment(name: str) -> None:
    c, plain, _ = _grown_layout(name, None)
    _, blocky, _ = _grown_layout(name, BLOCK)
    end = lambda p: max(o + s for o, s in p)  # noqa: E731
    n = len(c.segments)
    assert end(plain) <= end(blocky) <= end(plain) + n * (BLOCK - 1)


def test_block_size_must_be_a_power_of_two() -> None:
    c, _ = _container("mlp_xnnpack")
    with pytest.raises(ValueError, match="block_size 3000 must be a power of two"):
        plan_layout(c, {}, block_size=3000)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["mlp_xnnpack", "conv_xnnpack", "two_methods_xnnpack", "mlp_portable"]),
    st.data(),
)
def test_layout_invariants_with_random_replacements(name: str, data: st.DataObject) -> None:
    c, _ = _container(name)
    new_sizes: dict[int, tuple[int, int]] = {}
    for seg in c.segments:
        if data.draw(st.booleans()):
            size = data.draw(st.integers(0, 3 * seg.size + 64))
            align = 1 << data.draw(st.integers(0, 12))
            new_sizes[seg.index] = (size, align)
    block = data.draw(st.sampled_from([None, 512, 4096, 65536]))
    base = 1 << 16
    placements = plan_layout(c, new_sizes, base, block_size=block)
    order = sorted(c.segments, key=lambda s: (s.offset, s.index))
    cursor = base
    for seg in order:
        off, size = placements[seg.index]
        absolute = base + off
        assert absolute >= cursor  # physical order kept, no overlap
        want_size, requested = new_sizes.get(seg.index, (seg.size, 1))
        assert size == want_size
        assert absolute % max(inferred_alignment(c.absolute(seg)), requested) == 0
        if block is not None and seg.index not in new_sizes:
            assert (absolute - c.absolute(seg)) % block == 0
            assert absolute - cursor < max(block, inferred_alignment(c.absolute(seg)))
        cursor = absolute + size


# ------------------------------------------------------- segments sharing source bytes
def _synthetic(spans: list[tuple[int, int]], base: int = 4096) -> Container:
    """A .pte container whose distinct segment tables describe ``spans`` (relative
    ``(offset, size)``; they may overlap). Layout reads no metadata bytes."""
    end = max((o + s for o, s in spans), default=0)
    segments = tuple(
        Segment(i, o, s, 100 + 24 * i, 108 + 24 * i, (i,), (60 + 4 * i,))
        for i, (o, s) in enumerate(spans)
    )
    header = PteHeader(32, 1024, base, end)
    return Container("pte", "syn.pte", base + end, header, 1024, base, segments, ())


def test_overlapping_unchanged_segments_keep_their_place() -> None:
    spans = [(0, 1000), (0, 1000), (500, 1000), (1536, 100), (1536, 0)]
    c = _synthetic(spans)
    assert plan_layout(c, {}) == spans
    assert plan_layout(c, {}, block_size=BLOCK) == spans


def test_overlapping_unchanged_segments_are_placed_once_after_a_change() -> None:
    # Segment 0 grows; 1..3 share bytes and move together, as one extent, once.
    c = _synthetic([(0, 256), (256, 1000), (256, 1000), (756, 1000), (2048, 100)])
    placements = plan_layout(c, {0: (5000, 1)})
    (o0, s0), (o1, _), (o2, _), (o3, _), (o4, _) = placements
    assert (o0, s0) == (0, 5000)
    assert o1 == o2 >= 5000
    assert o3 - o1 == 500
    assert (4096 + o1) % 256 == 0  # the extent stays aligned like its members
    assert o4 >= o1 + 1500
    # The data is the replacement, the union of the shared bytes and the last segment,
    # plus alignment padding: not one copy per table.
    assert o4 + 100 <= 5000 + 1500 + 100 + 256 + 2048


def test_a_replaced_segment_inside_an_extent_leaves_the_others_in_one_piece() -> None:
    c = _synthetic([(0, 1000), (200, 100), (500, 1000)])
    placements = plan_layout(c, {1: (50, 1)})
    (o0, _), (o1, s1), (o2, _) = placements
    assert (o0, o2 - o0) == (0, 500)  # the unchanged ones keep their relative place
    assert s1 == 50 and o1 >= 1500  # the replacement goes after the extent


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_overlap_layout_invariants(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12))
    spans = [
        (data.draw(st.integers(0, 64)) * 16, data.draw(st.sampled_from([0, 16, 100, 512, 1000])))
        for _ in range(n)
    ]
    c = _synthetic(spans, base=data.draw(st.sampled_from([4096, 4096 + 256, 8192 + 16])))
    new_sizes: dict[int, tuple[int, int]] = {}
    for seg in c.segments:
        if data.draw(st.booleans()):
            new_sizes[seg.index] = (
                data.draw(st.integers(0, 700)),
                1 << data.draw(st.integers(0, 9)),
            )
    block = data.draw(st.sampled_from([None, 512, 4096]))
    base = 1 << 16
    placements = plan_layout(c, new_sizes, base, block_size=block)
    placed = [
        (base + o, base + o + s, seg) for seg, (o, s) in zip(c.segments, placements, strict=True)
    ]
    for start, end, seg in placed:
        want_size, requested = new_sizes.get(seg.index, (seg.size, 1))
        assert end - start == want_size
        assert start % max(inferred_alignment(c.absolute(seg)), requested) == 0
        if block is not None and seg.index not in new_sizes:
            assert (start - c.absolute(seg)) % block == 0
    # Output bytes overlap only where the source bytes of unchanged segments overlapped,
    # at the same distance: every output byte has one source.
    for a_start, a_end, a in placed:
        for b_start, b_end, b in placed:
            if a.index >= b.index or not (a_start < b_end and b_start < a_end):
                continue
            assert a.index not in new_sizes and b.index not in new_sizes
            assert a_start - b_start == c.absolute(a) - c.absolute(b)
    # Bounded by the distinct source bytes, the replacements and the padding.
    unchanged = sorted(
        (c.absolute(s), c.absolute(s) + s.size) for s in c.segments if s.index not in new_sizes
    )
    union = 0
    reach = 0
    for start, end in unchanged:
        union += max(0, end - max(start, reach))
        reach = max(reach, end)
    pad = sum(max(block or 1, 1 << 16) for _ in c.segments)
    data_end = max((end for _, end, _ in placed), default=base)
    assert data_end - base <= union + sum(s for s, _ in new_sizes.values()) + pad
