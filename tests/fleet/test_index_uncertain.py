"""An index write whose outcome is unknown (``PublishUncertain``: an attempt's answer was
lost and the retry was refused by a version that is not the writer's, see
``tests/writers/test_s3_lost_answers.py``) is read again like a conflict: a publish and a
retire still end with every entry and catalog right. Before, it ended the update (the run
exited 1 with the index not published)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import PublishUncertain
from ptestore.fleet.index import create_index, load_index, publish_entries, update_index
from ptestore.fleet.index_store import IndexStore
from ptestore.testing.fleet_index import device_name, synthetic_entry

from .indexkit import assert_catalogs_match_leaves


def _uncertain_writes(monkeypatch: pytest.MonkeyPatch, landed: bool, times: int = 1) -> list[str]:
    """The first ``times`` index writes raise PublishUncertain, after writing
    (``landed``: the lost answer of a write that took effect) or without."""
    real = IndexStore.write
    hit: list[str] = []

    def write(
        self: IndexStore, url: str, value: dict[str, Any], mode: str, expected: Any = None
    ) -> None:
        if len(hit) < times:
            hit.append(url)
            if landed:
                real(self, url, value, mode, expected)
            raise PublishUncertain(f"{url}: a retry of PutObject was refused (stand-in)")
        real(self, url, value, mode, expected)

    monkeypatch.setattr(IndexStore, "write", write)
    return hit


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "lost"])
def test_a_publish_whose_write_is_uncertain_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    entries = [synthetic_entry("m0", device_name(i), socs=2) for i in range(6)]
    hit = _uncertain_writes(monkeypatch, landed, times=3)
    report = publish_entries(url, entries, {})
    assert hit  # landed: every write was (the leaf, the catalog), each found in place
    assert sum(s.conflicts for s in report.stats) == len(hit)
    got = sorted(load_index(url)["entries"], key=lambda e: e["device"])
    assert got == sorted(entries, key=lambda e: e["device"])
    assert assert_catalogs_match_leaves(url, {}) == 1


def test_a_retire_whose_write_is_uncertain_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    entries = [synthetic_entry("m0", device_name(i), socs=2) for i in range(6)]
    publish_entries(url, entries, {})
    gone = device_name(2)
    _uncertain_writes(monkeypatch, landed=True)
    done = update_index(
        url, lambda e: {**e, "retired": {"reason": "test"}} if e["device"] == gone else None
    )
    assert [e["device"] for e in done.changed] == [gone]
    retired = [e["device"] for e in load_index(url)["entries"] if e.get("retired")]
    assert retired == [gone]
    assert assert_catalogs_match_leaves(url, {}) == 1
