"""What one device's look-up costs, whatever an index it does not control holds: a leaf
read once per ``select`` (``fetch INDEX``, ``ensure INDEX``) however many stand-ins it
tries, a bounded number of stand-ins tried before the catalog is refused, and the
stand-ins rated, the candidates listed and the reason bounded however large the
catalog (docs/fleet.md, "What select reads of a sharded index")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index import create_index, open_index, publish_entries
from ptestore.fleet.index_view import MAX_CLASSES, MAX_RESOLVED, NAMES_PER_CLASS
from ptestore.fleet.select import MAX_REASONS, select
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.writers import versions


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every object read through ``read_versioned`` (the one read of the index's
    objects): its URL and size, counted here, not by ptestore."""
    seen: list[tuple[str, int]] = []
    real = versions.read_versioned

    def counting(url: Any, **kw: Any) -> Any:
        got = real(url, **kw)
        seen.append((str(url), len(got.data)))
        return got

    monkeypatch.setattr(versions, "read_versioned", counting)
    return seen


def _stamps(c: int) -> list[dict[str, Any]]:
    """The stamps of class ``c``: a backend installed nowhere (no opinion)."""
    return [{"id": f"Gone{c}", "spec": "x", "compatibility": ""}]


def _hostile_index(
    tmp_path: Path,
    *,
    listed: int,
    classes: int,
    names: int,
    retired: int = 0,
    live_first: bool = False,
) -> tuple[str, str]:
    """A version 3 index of model ``m`` with a live entry ``real`` (and with
    ``live_first`` one of ``a0000000`` with the first class's stamps), and written over
    it by hand: ``retired`` retired entries in its one leaf, and a catalog of
    ``classes`` classes of distinct stamps listing ``names`` devices each
    (``a0000000``, ..., the retired ones first), before ``real``'s. Returns the index
    URL and the catalog's."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, listed=listed)
    entries = [synthetic_entry("m", "real")]
    if live_first:
        entries.append({**synthetic_entry("m", "a0000000"), "compatibility": _stamps(0)})
    publish_entries(url, entries, {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    leaf = Path(sharded.trie("m").url(""))
    value = json.loads(leaf.read_text())
    value["entries"] = [
        *({"model": "m", "device": f"a{i:07d}", "retired": True} for i in range(retired)),
        *value["entries"],
    ]
    leaf.write_text(json.dumps(value, separators=(",", ":")))
    catalog = Path(sharded.catalog_url("m"))
    cat = json.loads(catalog.read_text())
    cat["classes"] = [
        {
            "compatibility": _stamps(c),
            "devices": [f"a{c * names + j:07d}" for j in range(names)],
            "more": False,
        }
        for c in range(classes)
    ] + [c for c in cat["classes"] if c["devices"] == ["real"]]
    catalog.write_text(json.dumps(cat, separators=(",", ":")))
    return url, str(catalog)


# -------------------------------------------------------------- each node read once


def test_stand_ins_of_one_leaf_read_it_once_and_are_tried_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog lists 4,000 devices whose entries in the one leaf are retired (a
    catalog damaged or restored by hand): each stand-in tried read that leaf again (K
    reads of a leaf of K entries: 2,000 took 288 MB and 6.9 s); now the leaf is read
    once and after MAX_RESOLVED stand-ins the catalog is refused, pointing to
    check-index."""
    k = 4000
    url, catalog = _hostile_index(tmp_path, listed=8, classes=k // 8, names=8, retired=k)
    seen = _count_reads(monkeypatch)
    with pytest.raises(FormatError) as err:
        select(url, "m", "zzz")
    assert str(err.value) == (
        f"{catalog}: index catalog devices tried = {MAX_RESOLVED}: must be fewer listed "
        "devices whose leaves do not hold them live with their class's stamps (the first "
        f"{MAX_RESOLVED} tried for model 'm' are not: changed while they were read, or the "
        f"catalog disagrees with its leaves; run again, and if it persists: ptestore fleet "
        f"check-index {url} says which, --repair rebuilds the catalog from the leaves)"
    )
    leaf = [u for u, _ in seen if u.endswith("/t.json")]
    assert len(leaf) == 1, leaf  # was one per stand-in tried
    assert len(seen) <= 4, seen  # the root, the catalog, the leaf


def test_fetch_and_ensure_from_that_index_stop_as_select_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    k = 2000
    url, catalog = _hostile_index(tmp_path, listed=8, classes=k // 8, names=8, retired=k)
    for argv in (
        ["fetch", url, str(tmp_path / "out" / "m.pte"), "--model", "m", "--device", "zzz"],
        ["ensure", url, "--cache-dir", str(tmp_path / "cache"), "--model", "m", "--device", "zzz"],
    ):
        seen = _count_reads(monkeypatch)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{catalog}: index catalog devices tried = {MAX_RESOLVED}" in err, err
        assert f"ptestore fleet check-index {url}" in err
        assert len([u for u, _ in seen if u.endswith("/t.json")]) == 1
        monkeypatch.undo()
    assert not (tmp_path / "out" / "m.pte").exists()


def test_a_stand_in_resolved_reads_its_leaf_once_for_every_stand_in_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few retired stand-ins (fewer than the bound) before a live one: every one of
    them in one leaf, read once; the live one's source is the answer."""
    url, _ = _hostile_index(tmp_path, listed=8, classes=2, names=7, retired=50)
    assert MAX_RESOLVED > 2 * 7
    seen = _count_reads(monkeypatch)
    choice = select(url, "m", "zzz")
    assert choice.kind == "source" and choice.pte["url"] == "s3://fleet/src/m.pte"
    assert len([u for u, _ in seen if u.endswith("/t.json")]) == 1


# ------------------------------------------------------------------ a large catalog


def test_a_large_catalog_rates_lists_and_explains_a_bounded_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``layout.listed = 1000`` (allowed) and a catalog of 1,500 classes of 300 names
    (5.4 MB, within its 16 MiB bound): every name was a stand-in, rated, listed as a
    candidate and explained in the reason (1,000 x 1,000: 22.9 s, 2.4 GB, a 176 MB
    reason). Now at most MAX_CLASSES classes are rated, NAMES_PER_CLASS names of each
    listed, MAX_REASONS explained."""
    url, _ = _hostile_index(tmp_path, listed=1000, classes=1500, names=300, live_first=True)
    seen = _count_reads(monkeypatch)
    choice = select(url, "m", "zzz")
    assert choice.kind == "source"
    assert len(choice.candidates) == MAX_CLASSES * NAMES_PER_CLASS  # was 450,001
    assert choice.unlisted == MAX_CLASSES  # each of them lists more than shown
    assert choice.unrated == 1500 - MAX_CLASSES + 1  # the ones past the bound, and real's
    assert len(choice.reason) < 4000, len(choice.reason)
    assert choice.reason.endswith(
        f"and {MAX_CLASSES * NAMES_PER_CLASS - MAX_REASONS} more; {choice.unrated} kinds of "
        f"build past the first {MAX_CLASSES} not rated): falling back to the portable source"
    ), choice.reason[-300:]
    assert len(json.dumps(choice.to_dict())) < 4 << 20
    assert len(seen) <= 4, seen
