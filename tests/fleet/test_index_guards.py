"""What ptestore writes into a sharded index it reads back, and what a reader makes of
objects that are not where or what they claim: a catalog past its read bound is never
written (a publish, an update, a migration, a repair); a leaf whose recorded place is
not the one it was read from; a padded version 3 root refused from its first bytes; a
version 2 root beside a version 3 shard directory. Each message pinned."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index import create_index, load_index, publish_entries, update_index
from ptestore.fleet.index_bounds import MAX_CATALOG_BYTES
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_v3 import model_segment
from ptestore.testing.fleet_index import synthetic_entry

#: A stamp string that makes an entry about 1.9 MB (an entry may be 2 MiB): nine kinds
#: of build with such stamps make a catalog past 16 MiB.
_STAMP = 1_900_000


def _big(device: str, kind: int) -> dict[str, Any]:
    """An entry of model m whose one stamp is about 1.9 MB, of kind of build ``kind``."""
    e = synthetic_entry("m", device)
    e["compatibility"] = [
        {"id": "Big", "spec": "big", "version": "1", "compatibility": f"{kind}:" + "x" * _STAMP}
    ]
    return e


def _catalog_refused(url: str, message: str, *, pattern: bool = False) -> None:
    """``message`` refuses to write the catalog at ``url`` (a regular expression with
    ``pattern``), larger than readers read."""
    where = url if pattern else re.escape(url)
    wanted = (
        rf"{where}: index catalog size = (\d+): must be at most {MAX_CATALOG_BYTES} bytes "
        r"\(not written: a reader of the index refuses a larger one\)"
    )
    got = re.fullmatch(wanted, message)
    assert got is not None, message
    assert int(got[1]) > MAX_CATALOG_BYTES


def test_a_publish_that_would_make_a_catalog_too_large_to_read_writes_nothing(
    tmp_path: Path,
) -> None:
    """Readers refuse a catalog past 16 MiB: a publish wrote one."""
    url = str(tmp_path / "ptestore-index.json")
    root = create_index(url)
    mdir = tmp_path / root["layout"]["shards"] / "m" / model_segment("m")
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [_big(f"d{i}", i) for i in range(9)], {})
    _catalog_refused(str(mdir / "catalog.json"), str(caught.value))
    assert not mdir.exists()  # refused before any leaf of the model was written
    assert load_index(url)["entries"] == []


def test_an_update_whose_catalog_grows_past_its_bound_is_refused_and_not_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The catalog is checked when it is written: an update (no placement known ahead)
    writes its leaf, then the catalog is refused; check-index --repair cannot rebuild
    it within the bound and says so."""
    url = str(tmp_path / "ptestore-index.json")
    root = create_index(url)
    cat = tmp_path / root["layout"]["shards"] / "m" / model_segment("m") / "catalog.json"
    publish_entries(url, [_big(f"d{i}", i) for i in range(8)] + [synthetic_entry("m", "s")], {})
    before = cat.read_bytes()
    assert len(before) <= MAX_CATALOG_BYTES

    def grow(e: dict[str, Any]) -> dict[str, Any] | None:
        return {**e, "compatibility": _big("s", 8)["compatibility"]} if e["device"] == "s" else None

    with pytest.raises(FormatError) as caught:
        update_index(url, grow)
    _catalog_refused(str(cat), str(caught.value))
    assert cat.read_bytes() == before
    report = check_index(url, None, repair=True)
    assert list(report.problems) == ["m"] and report.repaired == [] and not report.ok
    [left] = report.left["m"]
    assert left.startswith("not repaired: ")
    _catalog_refused(str(cat), left.removeprefix("not repaired: "))
    assert main(["fleet", "check-index", url, "--repair"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"m: {left}", f"{url}: 1 models, 1 catalogs wrong, 0 repaired"]
    # The repair marked it, then could not write the rebuilt one: as it was, marked.
    assert {**json.loads(before), "rebuilding": ...} == {
        **json.loads(cat.read_bytes()),
        "rebuilding": ...,
    }


def test_a_migration_whose_catalog_would_be_too_large_to_read_writes_nothing(
    tmp_path: Path,
) -> None:
    url = tmp_path / "ptestore-index.json"
    v2 = {"format": "ptestore.index", "version": 2, "entries": [_big(f"d{i}", i) for i in range(9)]}
    url.write_text(json.dumps(v2))
    with pytest.raises(FormatError) as caught:
        publish_entries(str(url), [synthetic_entry("n", "a")], {})
    where = rf"{re.escape(str(tmp_path))}/ptestore-index\.v3-[0-9a-f]+/m/{model_segment('m')}"
    _catalog_refused(f"{where}/catalog\\.json", str(caught.value), pattern=True)
    # Refused before anything was written: no shard directory, the index as it was.
    assert [p.name for p in tmp_path.iterdir()] == ["ptestore-index.json"]
    assert json.loads(url.read_text())["version"] == 2


def test_a_publish_of_more_than_a_leaf_holds_splits_within_what_readers_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 entries of 120 KB into one leaf at once were frozen in one splitting node of
    4.8 MB, past the 4 MiB + leaf_bytes readers read of a node (refused by any reader
    until the split committed): a leaf takes what keeps it readable, the rest after its
    split. Every node written is counted here."""
    from ptestore.fleet.index_store import IndexStore, dumps

    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    written: list[int] = []
    real = IndexStore.write

    def counting(self: IndexStore, where: str, value: dict[str, Any], *a: Any) -> None:
        if re.fullmatch(r"t[01]*\.json", where.rsplit("/", 1)[-1]):
            written.append(len(dumps(value)))
        real(self, where, value, *a)

    monkeypatch.setattr(IndexStore, "write", counting)
    entries = [synthetic_entry("m", f"d{i:02d}") for i in range(40)]
    for e in entries:
        e["device_options"]["padding"] = "x" * 120_000
    report = publish_entries(url, entries, {})
    assert sum(s.splits for s in report.stats) >= 1
    assert 0 < max(written) <= 16384 + (4 << 20) + 4096
    assert load_index(url)["entries"] == sorted(entries, key=lambda e: e["device"])


def _put(url: str, value: dict[str, Any]) -> None:
    from ptestore.writers import open_writer

    w = open_writer(url)
    w.write(json.dumps(value).encode(), 0)
    w.publish("overwrite")


def _get(url: str) -> dict[str, Any]:
    from ptestore.writers.versions import read_versioned

    value: dict[str, Any] = json.loads(read_versioned(url).data)
    return value


def test_malformed_device_options_name_the_leaf_that_holds_them() -> None:
    """In a trie of several leaves (in memory): the device's own entry and another
    device's entry read for the model's source are each named by their leaf, and by the
    field."""
    from ptestore.backends.compat import DeviceProfile
    from ptestore.fleet.index import open_index
    from ptestore.fleet.select import select

    url = "memory://guards-options/ptestore-index.json"
    create_index(url, leaf_bytes=1024)  # one entry a leaf
    publish_entries(url, [synthetic_entry("m", f"d{i}", socs=1) for i in range(8)], {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    leaves = {d: sharded.trie("m").find(d, 0, 0)[1] for d in ("d0", "d3")}
    assert len(set(leaves.values())) == 2
    assert f"{sharded.model_dir('m')}/t.json" not in leaves.values()
    for device, options in (("d0", "x"), ("d3", {"memory_mb": float("nan")})):
        value = _get(leaves[device])
        [entry] = value["entries"]
        entry["device_options"] = options
        _put(leaves[device], value)
    with pytest.raises(FormatError) as caught:  # its own entry
        select(url, "m", "d3")
    assert str(caught.value) == (
        f"{leaves['d3']}: entry m/d3 device_options = {{'memory_mb': nan}}: must be a "
        "device's options (device 'd3' option 'memory_mb' must be a finite number, got nan "
        "(trailers and the index are JSON, which has no nan or inf))"
    )
    with pytest.raises(FormatError) as caught:  # nothing fits: d0's entry names the source
        select(url, "m", DeviceProfile("newcomer", {"soc": "soc0"}))
    assert str(caught.value) == (
        f"{leaves['d0']}: entry m/d0 device_options = 'x': must be an object"
    )
