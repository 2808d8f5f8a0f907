"""A rule a submission broke stops the run even when the backend catches the
:class:`InvalidReplacement` and returns (docs/backends.md: "the run stops and nothing is
published"): a vendor backend with a per-key ``try``/``except`` shipped a partly
specialized model before."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import InvalidReplacement

MLP = get_fixture("mlp_xnnpack")
KEYS = sorted(e["key"] for e in MLP.facts["pte"]["named_data"])


class Swallows(BackendInterface):
    """Replaces the first key with its own bytes and the second with 4 bytes more (a
    size change it did not allow), catching the refusal."""

    name = "XnnpackBackend"
    caught: ClassVar[list[str]] = []

    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        named = context.get_named_data_map()
        first, second = KEYS[0], KEYS[1]
        output.write_named_data(first, BackendData(bytes(named.get_data(first))[::-1]))
        try:
            output.write_named_data(second, BackendData(b"x" * (named.get_data_size(second) + 4)))
        except InvalidReplacement as exc:
            Swallows.caught.append(str(exc))


def test_a_refusal_the_backend_caught_stops_the_run(src: Path, tmp_path: Path) -> None:
    Swallows.caught.clear()
    dst = tmp_path / "out.pte"
    with pytest.raises(InvalidReplacement) as err:
        ptestore.specialize(src, dst, backends=[Swallows()])
    assert Swallows.caught == [str(err.value)]  # the same refusal, raised at the call's end
    assert err.value.backend == "XnnpackBackend" and err.value.key == KEYS[1]
    assert "allow_size_change" in str(err.value)
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]


def test_in_place_the_file_is_left_as_it_was(src: Path) -> None:
    before = src.read_bytes()
    with pytest.raises(InvalidReplacement):
        ptestore.specialize(src, src, backends=[Swallows()], in_place=True)
    assert src.read_bytes() == before
    assert sorted(p.name for p in src.parent.iterdir()) == ["model.pte"]  # no journal
