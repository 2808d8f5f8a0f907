"""``ptestore.format.users.segment_users``: the one walk over who references each
segment, which the alias check, ``inspect`` and the layout map share."""

from __future__ import annotations

import pytest
from support.fixtures import get_fixture

from ptestore.format.model import (
    Container,
    Delegate,
    NamedDataEntry,
    Segment,
    SubsegmentOffsets,
)
from ptestore.format.reader import read_container
from ptestore.format.users import SegmentUser, segment_users
from ptestore.inspection import describe, describe_container
from ptestore.storage.loaders import LocalFileLoader
from ptestore.viz.regions import region_users


def _segment(i: int) -> Segment:
    return Segment(i, 64 * i, 64, None, None, (i,), (0,))


def _container() -> Container:
    return Container(
        kind="pte",
        source="made.pte",
        file_size=4096,
        header=None,
        metadata_size=512,
        segment_base_offset=1024,
        segments=tuple(_segment(i) for i in range(5)),
        named_data=(NamedDataEntry("w", 0), NamedDataEntry("b", 0)),
        methods=("forward",),
        delegates=(
            Delegate("forward", 0, "XnnpackBackend", "segment", 1, ()),
            Delegate("forward", 1, "Inline", "inline", 0, ()),
            Delegate("forward", 2, "XnnpackBackend", "segment", 0, ()),
        ),
        constant_segment=SubsegmentOffsets(2, (0, 16, 48)),
        mutable_data_segments=(SubsegmentOffsets(3, ()),),
    )


def test_every_kind_of_user_in_one_order() -> None:
    users = segment_users(_container())
    assert [str(u) for u in users[0]] == [
        "delegate forward[2] XnnpackBackend",
        "key w",
        "key b",
    ]
    d0, k0, k1 = users[0]
    assert (d0.kind, d0.delegate, d0.segment) == ("delegate", _container().delegates[2], 0)
    assert (k0.kind, k0.key, k1.key) == ("named", "w", "b")
    assert users[1] == [
        SegmentUser(1, "delegate", "delegate forward[0] XnnpackBackend", _container().delegates[0])
    ]
    assert users[2] == [SegmentUser(2, "constant", "constant data", offsets=3)]
    # a mutable data segment that lists no offset is still a reference (inspect shows
    # it; the alias check ignores it: nothing in the program reads it)
    assert users[3] == [SegmentUser(3, "mutable", "mutable data 0", position=0, offsets=0)]
    assert 4 not in users  # unreferenced: no entry
    # the inline delegate references no segment
    assert all(
        u.delegate is None or u.delegate.location == "segment" for v in users.values() for u in v
    )


@pytest.mark.parametrize("name", ["mlp_xnnpack", "shared_blob_xnnpack", "mutable_portable"])
def test_inspect_and_the_layout_map_see_the_same_users(name: str) -> None:
    """The layout map rebuilds the references from a describe() object (JSON): it finds
    the users the container walk finds, with the same words."""
    path = get_fixture(name).main_path
    loader = LocalFileLoader(str(path))
    try:
        container = read_container(loader).container
    finally:
        loader.close()
    walked = {i: [u.label for u in us] for i, us in segment_users(container).items()}
    assert walked  # the fixture has referenced segments
    drawn = region_users(describe_container(container))
    assert set(drawn) == set(walked)
    for index, labels in walked.items():
        words = [label for _, label in drawn[index]]
        assert [w.split(" (")[0] for w in words] == labels, index
    # what inspect --json counts as unreferenced agrees too
    waste = describe(str(path))["waste"]["unreferenced_segments"]
    assert waste == sum(s.size for s in container.segments if s.index not in walked)


def test_the_public_inspection_segment_users_keeps_its_labels() -> None:
    """``ptestore.inspection.segment_users`` still answers labels, with an entry for every
    segment (the name was public before the walk moved to ``format.users``)."""
    from support.fixtures import FIXTURES_DIR

    from ptestore.format.reader import read_container
    from ptestore.inspection import segment_users
    from ptestore.storage.loaders import open_loader

    with open_loader(str(FIXTURES_DIR / "mlp_xnnpack.pte")) as loader:
        c = read_container(loader).container
    users = segment_users(c)
    assert sorted(users) == [s.index for s in c.segments]
    keys = {f"key {e.key}" for e in c.named_data}
    labels = {label for found in users.values() for label in found}
    assert keys <= labels
    assert all(isinstance(label, str) for label in labels)
