"""A retire (``update_index`` making entries not live) takes each entry out of its
model's catalog before its leaf retires it: the catalog is what ``select`` lists as
candidates (it reads the leaf of the one it picks only), so a retire killed between its
leaf writes and its catalog placement left a retired entry listed (docs/fleet.md says
the candidates never show one). Killed between the catalog and the leaf, the entry is
live and unlisted: its own device still gets it, ``check-index`` reports the catalog,
and the retire run again ends it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ptestore.fleet.index import create_index, find_entry, publish_entries, update_index
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.index_v3 import ShardedIndex
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import device_name, synthetic_entry

from .indexkit import assert_catalogs_match_leaves

D0, D1, D2 = (device_name(i) for i in range(3))


class _Killed(BaseException):
    """The process ends here (as SIGKILL would: nothing after it runs)."""


def _index(tmp_path: Path) -> str:
    """Model ``m`` on three devices of one kind of build (one catalog class)."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in (D0, D1, D2)], {})
    assert [c["made_for"] for c in select(url, "m", D0).candidates] == [D0, D1, D2]
    return url


def _retire_d2(url: str) -> Any:
    return update_index(
        url, lambda e: {**e, "retired": {"reason": "dropped"}} if e["device"] == D2 else None
    )


def test_a_retire_killed_after_its_leaf_write_leaves_no_retired_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _index(tmp_path)
    leaf_written: list[str] = []
    write, place = IndexStore.write, ShardedIndex._place

    def noting(self: IndexStore, target: str, *args: Any, **kw: Any) -> None:
        write(self, target, *args, **kw)
        if not target.endswith("/catalog.json"):
            leaf_written.append(target)

    def killed(self: ShardedIndex, *args: Any, **kw: Any) -> Any:
        if leaf_written:  # the placement after the leaves
            raise _Killed
        return place(self, *args, **kw)

    monkeypatch.setattr(IndexStore, "write", noting)
    monkeypatch.setattr(ShardedIndex, "_place", killed)
    with pytest.raises(_Killed):
        _retire_d2(url)
    monkeypatch.undo()
    assert leaf_written
    found = find_entry(url, "m", D2)
    assert found is not None and found["retired"] == {"reason": "dropped"}
    assert [c["made_for"] for c in select(url, "m", D0).candidates] == [D0, D1]
    assert select(url, "m", D2).kind == "source"  # its own name: never the retired build
    assert assert_catalogs_match_leaves(url, {}) == 1


def test_a_retire_killed_before_its_leaf_write_leaves_the_entry_live_and_unlisted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _index(tmp_path)
    write = IndexStore.write

    def killed(self: IndexStore, target: str, *args: Any, **kw: Any) -> None:
        if not target.endswith("/catalog.json"):
            raise _Killed
        write(self, target, *args, **kw)

    monkeypatch.setattr(IndexStore, "write", killed)
    with pytest.raises(_Killed):
        _retire_d2(url)
    monkeypatch.undo()
    found = find_entry(url, "m", D2)
    assert found is not None and "retired" not in found
    assert [c["made_for"] for c in select(url, "m", D0).candidates] == [D0, D1]
    assert select(url, "m", D2).made_for == D2  # its own leaf: its own build
    problems = check_index(url).problems
    assert list(problems) == ["m"] and problems["m"][0].endswith(
        f"lists ['{D0}', '{D1}'] and no more, its entries are ['{D0}', '{D1}', '{D2}']"
    ), problems
    # The retire run again ends it.
    assert [e["device"] for e in _retire_d2(url).changed] == [D2]
    assert assert_catalogs_match_leaves(url, {}) == 1
    assert [c["made_for"] for c in select(url, "m", D0).candidates] == [D0, D1]
