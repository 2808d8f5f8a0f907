"""Layout arithmetic: compaction, alignment, and block congruence for clones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fixtures import all_fixtures, get_fixture

from ptestore.format import parse
from ptestore.format.layout import layout_file, plan_layout
from ptestore.format.model import Container, inferred_alignment

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
