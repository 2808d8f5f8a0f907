"""Readers of every entry of a version 3 index (``load_index``, ``iter_entries``,
``update_index``, ``fleet retire``, ``check-index``) refuse an index a part of which is
missing (a leaf a split node or the catalog names, the shard directory), where they read
it as fewer entries and retire retired nothing there; a node legitimately absent (the
half of a split that got no entry, a device never published) is still read as empty,
and one device's look-up (``find_entry``, ``select``, ``fetch``, ``ensure``) still answers
"no entry" there; where the shape or the catalog shows its entry's leaf lost, it refuses
the index too. Locally and on moto and SeaweedFS; each message pinned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index import (
    create_index,
    find_entry,
    iter_entries,
    load_index,
    open_index,
    publish_entries,
    update_index,
)
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_place import device_bits
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.index_v3 import ShardedIndex, new_layout
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer

#: Devices whose hashes all begin with 0 (leaves of 1 KiB: one entry each): the top
#: node splits, all of them into t0 (t1 never exists), and so on down.
DEVICES = [n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("0")][:4]
#: A device whose hash begins with 1: never published.
ELSEWHERE = next(n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("1"))
MUST = "must be every node its catalogs and split nodes name"
#: One device's look-up (select, find_entry, fetch, ensure) refusing a lost part.
LOOKUP = (
    "; the entry of model {model!r} for device {device!r} may be lost with it, so it is "
    "not answered as none (the portable source): `ptestore fleet check-index {url}` says "
    "what is missing and what --repair can rebuild)"
)
AFTER = (
    "; the index cannot be read whole: restore what is missing (read as empty, the "
    "entries it held would be left out))"
)


def _index(url: str, options: dict[str, Any] | None = None) -> tuple[str, str]:
    """An index of DEVICES for model m in leaves of 1 KiB; its shard directory's name
    and the URL of m's directory."""
    create_index(url, leaf_bytes=1024, storage_options=options)
    publish_entries(url, [synthetic_entry("m", d) for d in DEVICES], options or {})
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    return sharded.layout["shards"], sharded.model_dir("m")


def _leaf_of(device: str) -> str:
    """The prefix of ``device``'s leaf in :func:`_index` (its first bits until they
    differ from every other device's)."""
    bits = device_bits(device)
    depth = max(
        next(k for k in range(256) if device_bits(o)[k] != bits[k]) for o in DEVICES if o != device
    )
    return bits[: depth + 1]


def _lose_a_listed_leaf(model: str) -> tuple[str, str, int, int]:
    """Remove the shallowest leaf of :func:`_index`'s ``model`` (one device's, beside a
    split node): its device, the leaf's prefix, and where the catalog lists the device
    (class ``i``, place ``j``)."""
    leaf = min((_leaf_of(d) for d in DEVICES), key=len)
    [lost] = [d for d in DEVICES if _leaf_of(d) == leaf]
    catalog = json.loads(Path(f"{model}/catalog.json").read_text())
    [(i, j)] = [
        (i, j)
        for i, c in enumerate(catalog["classes"])
        for j, d in enumerate(c["devices"])
        if d == lost
    ]
    Path(f"{model}/t{leaf}.json").unlink()
    return lost, leaf, i, j


def _splits_lost() -> tuple[str, str]:
    """A leaf whose loss leaves its split node with fewer than 2 entries below, and its
    split node."""
    for d in DEVICES:
        leaf = _leaf_of(d)
        sibling = leaf[:-1] + "10"[int(leaf[-1])]
        if any(_leaf_of(o) == sibling for o in DEVICES):
            return leaf, leaf[:-1]
    raise AssertionError("no two sibling leaves")


def _refusals(url: str, options: dict[str, Any], expected: str) -> None:
    """Every reader of the whole index refuses it with ``expected``; nothing written."""
    with pytest.raises(FormatError) as caught:
        load_index(url, **options)
    assert str(caught.value) == expected
    with pytest.raises(FormatError) as caught:
        list(iter_entries(url, **options))
    assert str(caught.value) == expected
    with pytest.raises(FormatError) as caught:
        update_index(url, lambda e: {**e, "retired": {"reason": "x"}}, storage_options=options)
    assert str(caught.value) == expected


def _sound(url: str, options: dict[str, Any]) -> None:
    """The index reads whole, with its absent halves, and a device never published has
    no entry (no error)."""
    assert [e["device"] for e in load_index(url, **options)["entries"]] == sorted(DEVICES)
    assert find_entry(url, "m", ELSEWHERE, **options) is None
    assert check_index(url, options).problems == {}


def test_a_sound_index_with_absent_halves_is_read_whole(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    _, model = _index(url)
    assert not Path(f"{model}/t1.json").exists()  # the top's half that got no entry
    top = json.loads(Path(f"{model}/t.json").read_text())
    assert (top["state"], top["halves"]) == ("split", ["0"])  # not named by its split
    _sound(url, {})
    report = update_index(url, lambda e: None)
    assert report.examined == len(DEVICES) and report.changed == []


def test_a_leaf_missing_below_a_split_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    leaf, split = _splits_lost()
    Path(f"{model}/t{leaf}.json").unlink()
    _refusals(
        url,
        {},
        f"{url}: index shards = '{shards}': {MUST} ({model}/t{split}.json: index shard state "
        "= 'split': must be a node whose halves hold the entries it split (at least 2) (they "
        f"hold 1: a leaf is missing ({model}/t{leaf}.json not found)){AFTER}",
    )
    lost = next(d for d in DEVICES if _leaf_of(d) == leaf)
    with pytest.raises(FormatError) as caught:  # one device's look-up too (test below)
        find_entry(url, "m", lost)
    assert str(caught.value) == _lost_half(url, shards, model, leaf, lost)
    check = check_index(url, repair=True)
    assert check.problems == {
        "m": [
            f"missing leaf: {model}/t{split}.json: index shard state = 'split': must be a node "
            "whose halves hold the entries it split (at least 2) (they hold 1: a leaf is "
            f"missing ({model}/t{leaf}.json not found))"
        ]
    }
    assert check.repaired == [] and check.left == {
        "m": ["not repaired: a catalog is rebuilt from its leaves: restore the missing one"]
    }


def _lost_half(url: str, shards: str, model: str, leaf: str, device: str, m: str = "m") -> str:
    """What one device's look-up says of ``leaf`` lost beside a sibling leaf."""
    sibling = leaf[:-1] + "10"[int(leaf[-1])]
    return (
        f"{url}: index shards = '{shards}': {MUST} ({model}/t{leaf[:-1]}.json: index shard "
        "state = 'split': must be a node whose halves both exist, unless one got none of the "
        "entries it split (the other got them all, and was split in turn) ("
        f"{model}/t{leaf}.json is not found and {model}/t{sibling}.json is a leaf: a leaf "
        "is missing)" + LOOKUP.format(model=m, device=device, url=url)
    )


def _hashed_below(prefix: str) -> str:
    """A device name, never published, whose hash begins with ``prefix``."""
    names = (f"new-{i}" for i in range(100_000))
    return next(n for n in names if device_bits(n).startswith(prefix))


def _lookups_refuse(url: str, options: dict[str, Any], device: str, expected: str) -> None:
    """``find_entry`` and ``select`` of ``device`` refuse the index with ``expected``."""
    with pytest.raises(FormatError) as caught:
        find_entry(url, "m", device, **options)
    assert str(caught.value) == expected
    with pytest.raises(FormatError) as caught:
        select(url, "m", device, storage_options=options)
    assert str(caught.value) == expected


def test_one_devices_look_up_refuses_a_leaf_lost_beside_a_leaf(tmp_path: Path) -> None:
    """Its node not found below a split node whose other half is a leaf: lost, whether
    the device was published there (listed in the catalog or not) or not. select
    answered "no artifact fits" and handed out the portable source; find_entry None.
    A device whose node is the half a split left empty still has no entry."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    leaf, _ = _splits_lost()
    lost = next(d for d in DEVICES if _leaf_of(d) == leaf)
    Path(f"{model}/t{leaf}.json").unlink()
    for device in (lost, _hashed_below(leaf)):
        _lookups_refuse(url, {}, device, _lost_half(url, shards, model, leaf, device))
    assert find_entry(url, "m", ELSEWHERE) is None  # t1: the top's half left empty
    assert select(url, "m", ELSEWHERE).kind == "source"


def _named_half(url: str, shards: str, model: str, leaf: str, device: str) -> str:
    """What one device's look-up says of ``leaf`` lost, its split node naming it."""
    return (
        f"{url}: index shards = '{shards}': {MUST} ({model}/t{leaf[:-1]}.json: index shard "
        "halves = ['0', '1']: must be halves that exist (a split creates the halves it names "
        f"before it commits, and a node is never removed) ({model}/t{leaf}.json is not "
        "found: a leaf is missing)" + LOOKUP.format(model="m", device=device, url=url)
    )


def test_one_devices_look_up_refuses_a_listed_device_its_leaf_lacks(tmp_path: Path) -> None:
    """A leaf lost beside a split node (its empty half legitimate by the shape): the
    catalog lists its device, so its entry is lost, for its own look-up and as another
    device's candidate (a stand-in resolved); a device not listed there is refused too:
    the split node names the lost leaf among the halves it made (before, "no entry", and
    select handed out the portable source)."""
    from ptestore.fleet.index_view import model_view

    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    lost, leaf, i, j = _lose_a_listed_leaf(model)
    expected = (
        f"{url}: index shards = '{shards}': {MUST} ({model}/catalog.json: index catalog "
        f"classes[{i}].devices[{j}] = '{lost}': must be a device whose entry is in one of "
        f"the model's leaves (its leaf is {model}/t{leaf}.json: not found: a leaf is missing "
        "(a writer updates the leaves before the catalog, and never removes an entry))"
    )
    _lookups_refuse(url, {}, lost, expected + LOOKUP.format(model="m", device=lost, url=url))
    view = model_view(url, "m", ELSEWHERE)
    [stand_in] = [e for e in view.entries if e["device"] == lost]
    with pytest.raises(FormatError) as caught:
        view.resolve(stand_in)
    assert str(caught.value) == expected + LOOKUP.format(model="m", device=lost, url=url)
    other = _hashed_below(leaf)  # not listed
    _lookups_refuse(url, {}, other, _named_half(url, shards, model, leaf, other))


@pytest.mark.parametrize("halves", ["01", ["1", "0"], [], ["0", "0"]])
def test_a_split_marker_naming_other_halves_is_refused(tmp_path: Path, halves: Any) -> None:
    """A split node's ``halves`` that no split writes: every reader refuses the node."""
    url = str(tmp_path / "ptestore-index.json")
    _, model = _index(url)
    top = Path(f"{model}/t.json")
    top.write_text(json.dumps({**json.loads(top.read_text()), "halves": halves}))
    expected = (
        f"{top}: index shard halves = {halves!r}: must be ['0'], ['1'] or ['0', '1'] (its split's)"
    )
    for call in (
        lambda: find_entry(url, "m", ELSEWHERE),
        lambda: load_index(url),
        lambda: publish_entries(url, [synthetic_entry("m", ELSEWHERE)], {}),
    ):
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == expected


def test_a_migrated_trie_names_the_halves_of_its_splits(tmp_path: Path) -> None:
    """A migration writes its trie whole (``write_static``, not by splits): its split
    nodes name the halves they hold too, each one there."""
    sharded = ShardedIndex(IndexStore(str(tmp_path / "ptestore-index.json")), new_layout(1024))
    sharded.write_static([synthetic_entry("m", d) for d in DEVICES])
    model = Path(sharded.model_dir("m"))
    markers = [json.loads(p.read_text()) for p in model.glob("t*.json")]
    splits = {v["prefix"]: v["halves"] for v in markers if v["state"] == "split"}
    assert splits[""] == ["0"] and len(splits) >= 2
    for prefix, halves in splits.items():
        assert all((model / f"t{prefix}{h}.json").exists() for h in halves), prefix
        assert not any((model / f"t{prefix}{h}.json").exists() for h in {"0", "1"} - set(halves))


def test_a_lost_half_its_split_names_is_refused_whole_and_not_repaired(tmp_path: Path) -> None:
    """A leaf lost beside a split node, of a device the catalog does not list (a class
    listing one name): the readers of every entry and check-index read the model as one
    without it, and gc removed its files (only ``gc --job`` told). Its split node names
    it among its halves: refused, reported as a missing leaf, not rebuilt over."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=1024, listed=1)
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in DEVICES], {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    shards, model = sharded.layout["shards"], sharded.model_dir("m")
    leaves = {_leaf_of(d): d for d in DEVICES}
    leaf = next(
        p
        for p, d in sorted(leaves.items())
        if d != min(DEVICES) and p[:-1] + "10"[int(p[-1])] not in leaves
    )
    Path(f"{model}/t{leaf}.json").unlink()
    problem = (
        f"{model}/t{leaf[:-1]}.json: index shard halves = ['0', '1']: must be halves that "
        "exist (a split creates the halves it names before it commits, and a node is never "
        f"removed) ({model}/t{leaf}.json is not found: a leaf is missing)"
    )
    _refusals(url, {}, f"{url}: index shards = '{shards}': {MUST} ({problem}{AFTER}")
    check = check_index(url, repair=True)
    assert check.problems == {"m": [f"missing leaf: {problem}"]} and check.repaired == []
    assert check.left == {
        "m": ["not repaired: a catalog is rebuilt from its leaves: restore the missing one"]
    }
    with pytest.raises(FormatError) as caught:
        sharded.repair("m", force=True)
    assert str(caught.value) == _not_rebuilt(url, shards, problem)


def _strip_halves(model: str) -> None:
    """The split markers of ``model`` as an earlier ptestore wrote them: no halves."""
    for node in Path(model).glob("t*.json"):
        value = json.loads(node.read_text())
        if value["state"] == "split":
            node.write_text(json.dumps({k: v for k, v in value.items() if k != "halves"}))


def test_what_one_devices_look_up_cannot_tell(tmp_path: Path) -> None:
    """Where a lost leaf still reads as "no entry" to a device not listed: below a split
    marker an earlier ptestore wrote (it names no halves), and in a half its split left
    empty that got its first entry later (a split names the halves it made; the node
    that tells is in another half). gc --job checks every pair of its job instead."""
    url = str(tmp_path / "ptestore-index.json")
    _, model = _index(url)
    _strip_halves(model)
    _, leaf, _, _ = _lose_a_listed_leaf(model)
    assert find_entry(url, "m", _hashed_below(leaf)) is None  # (select: its candidate lost)

    url = str(tmp_path / "later" / "ptestore-index.json")
    create_index(url, leaf_bytes=1024, listed=1)
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in sorted(DEVICES)[:3]], {})
    late = next(n for n in (f"zz-{i}" for i in range(100)) if device_bits(n).startswith("1"))
    publish_entries(url, [synthetic_entry("m", late, socs=1)], {})  # creates t1
    _, sharded, _ = open_index(url)
    assert sharded is not None
    model = sharded.model_dir("m")
    top = json.loads(Path(f"{model}/t.json").read_text())
    assert (top["state"], top["halves"]) == ("split", ["0"])  # t1 made after the split
    Path(f"{model}/t1.json").unlink()
    assert find_entry(url, "m", late) is None  # its own look-up: not listed, no entry
    assert [e["device"] for e in load_index(url)["entries"]] == sorted(DEVICES)[:3]


def test_one_devices_look_up_refuses_a_lost_top_node(tmp_path: Path) -> None:
    """The model's catalog is there, its top node not: a device's look-up that walks up
    to it refuses the index (one whose leaf is found deeper still gets its entry)."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    Path(f"{model}/t.json").unlink()
    expected = (
        f"{url}: index shards = '{shards}': {MUST} ({model}/t.json: index shard = 'not "
        f"found': must be there while its model's catalog is ({model}/catalog.json is there: "
        "a leaf is missing (a writer writes the leaves before the catalog, and never removes "
        "one))" + LOOKUP.format(model="m", device=ELSEWHERE, url=url)
    )
    _lookups_refuse(url, {}, ELSEWHERE, expected)


def test_select_fetch_and_ensure_refuse_a_lost_leaf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run; one leaf lost beside a leaf: select, fetch and ensure of its device
    (and of a new device hashed there) exit 2 naming the index, the model, the device
    and the lost leaf, where they served the portable source (exit 0); nothing fetched
    or cached."""
    out = tmp_path / "out"
    index = out / "ptestore-index.json"
    create_index(index, leaf_bytes=1024)
    job = _job(tmp_path / "job.toml", out, DEVICES)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _, sharded, _ = open_index(index)
    assert sharded is not None
    model, shards = sharded.model_dir("mlp"), sharded.layout["shards"]
    leaf, _ = _splits_lost()
    Path(f"{model}/t{leaf}.json").unlink()
    capsys.readouterr()
    for device in (next(d for d in DEVICES if _leaf_of(d) == leaf), _hashed_below(leaf)):
        message = _lost_half(str(index), shards, model, leaf, device, "mlp")
        asked = [str(index), "--model", "mlp", "--device", device]
        dest, cache = tmp_path / "dl" / "m.pte", tmp_path / "cache"
        for command, argv in (
            ("select", ["select", *asked]),
            ("fetch", ["fetch", *asked, str(dest)]),
            ("ensure", ["ensure", *asked, "--cache-dir", str(cache)]),
        ):
            assert main(argv) == 2, command
            assert capsys.readouterr().err == f"ptestore {command}: error: {message}\n"
        assert not dest.exists() and not dest.parent.exists()
        assert not cache.exists() or not any(p.name == "manifest.json" for p in cache.rglob("*"))


def test_a_leaf_of_a_device_the_catalog_lists_is_refused(tmp_path: Path) -> None:
    """A leaf beside a split node (its split holds 2 below, its empty half has a split
    sibling): the catalog, read first, lists its device."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    lost, _, i, j = _lose_a_listed_leaf(model)
    _refusals(
        url,
        {},
        f"{url}: index shards = '{shards}': {MUST} ({model}/catalog.json: index catalog "
        f"classes[{i}].devices[{j}] = '{lost}': must be a device whose entry is in one of "
        "the model's leaves (none holds it: a leaf is missing (a writer updates the leaves "
        f"before the catalog, and never removes an entry)){AFTER}",
    )


def _not_rebuilt(url: str, shards: str, problem: str, m: str = "m") -> str:
    """What a rebuild of ``m``'s catalog says of a leaf ``problem`` shows missing."""
    return (
        f"{url}: index shards = '{shards}': {MUST} ({problem}; the catalog of model {m!r} is "
        "not rebuilt: rebuilt from the leaves as they are, it would leave out the entries the "
        "missing leaf held and hide its loss from gc, which removes the files of entries it "
        f"does not see. Restore the leaf (`ptestore fleet check-index {url}` says what is "
        "missing))"
    )


def test_a_rebuild_refuses_a_lost_leaf_and_leaves_the_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog rebuild reads the leaves as they are: a lost leaf's devices dropped out
    of the catalog silently, and with them what tells gc. It refuses instead, the
    catalog left as it is: a listed device's leaf lost beside a split node (a forced
    repair), a leaf lost below a split while a run finds no catalog (rebuilt after a
    crash), and a leaf lost between check-index's check and its rebuild."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    _, sharded, _ = open_index(url)
    assert sharded is not None
    catalog = Path(f"{model}/catalog.json")
    lost, leaf, i, j = _lose_a_listed_leaf(model)
    kept = json.loads(catalog.read_text())
    with pytest.raises(FormatError) as caught:
        sharded.repair("m", force=True)
    assert str(caught.value) == _not_rebuilt(
        url,
        shards,
        f"{catalog}: index catalog classes[{i}].devices[{j}] = '{lost}': must be a device "
        f"whose entry is in one of the model's leaves (its leaf is {model}/t{leaf}.json: not "
        "found: a leaf is missing (a writer updates the leaves before the catalog, and "
        "never removes an entry))",
    )
    assert json.loads(catalog.read_text()) == kept  # marked, then the mark taken off

    url = str(tmp_path / "two" / "ptestore-index.json")
    shards, model = _index(url)
    gone, split = _splits_lost()
    Path(f"{model}/t{gone}.json").unlink()
    Path(f"{model}/catalog.json").unlink()  # a run crashed before it
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", ELSEWHERE)], {})
    assert str(caught.value) == _not_rebuilt(
        url,
        shards,
        f"{model}/t{split}.json: index shard state = 'split': must be a node whose halves "
        f"hold the entries it split (at least 2) (they hold 1: a leaf is missing ({model}/"
        f"t{gone}.json not found))",
    )
    assert not Path(f"{model}/catalog.json").exists()

    url = str(tmp_path / "three" / "ptestore-index.json")
    shards, model = _index(url)
    _, sharded, _ = open_index(url)
    assert sharded is not None
    listed = json.loads(Path(f"{model}/catalog.json").read_text())
    Path(f"{model}/catalog.json").write_text(json.dumps({**listed, "rebuilding": "0" * 16}))
    real = type(sharded).repair

    def repair(self: Any, m: str, *args: Any, **kwargs: Any) -> None:
        _lose_a_listed_leaf(model)  # after the check, before the rebuild
        real(self, m, *args, **kwargs)

    monkeypatch.setattr(type(sharded), "repair", repair)
    check = check_index(url, repair=True)
    monkeypatch.undo()
    assert check.marked == ["m"] and check.repaired == [] and not check.ok
    [left] = check.left["m"]
    assert left.startswith(f"not repaired: {url}: index shards = '{shards}': {MUST} (")
    assert left.endswith(_not_rebuilt(url, shards, "").split("; ", 1)[1])


def test_a_missing_shard_directory_is_refused(tmp_path: Path) -> None:
    """Without its models and root.json: gone. Without root.json alone (an index an
    earlier ptestore made): read as it is."""
    url = str(tmp_path / "ptestore-index.json")
    shards, _ = _index(url)
    (tmp_path / shards / "root.json").unlink()
    _sound(url, {})
    shutil.rmtree(tmp_path / shards)
    _refusals(
        url,
        {},
        f"{url}: index layout.shards = '{shards}': must be a directory holding root.json "
        "(the copy of this root its writers leave there) or a model's shards (there is "
        f"neither in {tmp_path / shards}: its shards were removed or moved, and the entries "
        "they held are unknown; restore them)",
    )
    assert not (tmp_path / shards).exists()  # not marked by the update: refused before


@pytest.mark.s3
def test_missing_parts_on_s3(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    options = s3_server.storage_options
    shards, model = _index(url, options)
    _sound(url, options)
    client = s3_server.client()
    leaf, split = _splits_lost()
    key = f"{model}/t{leaf}.json".removeprefix(f"s3://{bucket}/")
    kept = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=bucket, Key=key)
    _refusals(
        url,
        options,
        f"{url}: index shards = '{shards}': {MUST} ({model}/t{split}.json: index shard state "
        "= 'split': must be a node whose halves hold the entries it split (at least 2) (they "
        f"hold 1: a leaf is missing ({model}/t{leaf}.json not found)){AFTER}",
    )
    lost = next(d for d in DEVICES if _leaf_of(d) == leaf)
    _lookups_refuse(url, options, lost, _lost_half(url, shards, model, leaf, lost))
    assert find_entry(url, "m", ELSEWHERE, **options) is None
    client.put_object(Bucket=bucket, Key=key, Body=kept)
    _sound(url, options)
    assert find_entry(url, "m", lost, **options) is not None
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"fleet/{shards}/")["Contents"]
    for o in listed:
        client.delete_object(Bucket=bucket, Key=o["Key"])
    _refusals(
        url,
        options,
        f"{url}: index layout.shards = '{shards}': must be a directory holding root.json "
        "(the copy of this root its writers leave there) or a model's shards (there is "
        f"neither in s3://{bucket}/fleet/{shards}: its shards were removed or moved, and the "
        "entries they held are unknown; restore them)",
    )


def test_a_rebuild_refuses_a_lost_top_node_under_a_catalog_listing_none(tmp_path: Path) -> None:
    """The top node lost under a catalog whose classes list no device (their lists
    emptied by removals, members left: a rebuild's case), or a damaged one: no listed
    device tells, but a catalog is there, so the top node was (a writer writes the
    leaves first). Rebuilt, the catalog listed nothing and hid the loss from gc."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
    _, sharded, _ = open_index(url)
    assert sharded is not None
    catalog = Path(f"{model}/catalog.json")
    value = json.loads(catalog.read_text())
    value["classes"] = [{**c, "devices": [], "more": True} for c in value["classes"]]
    Path(f"{model}/t.json").unlink()
    problem = (
        f"{model}/t.json: index shard = 'not found': must be there while its model's catalog "
        f"is ({catalog} is there: a leaf is missing (a writer writes the leaves before the "
        "catalog, and never removes one))"
    )
    for damaged in (False, True):
        catalog.write_text("{damaged" if damaged else json.dumps(value))

        def kept(damaged: bool = damaged) -> bool:  # (a rebuild's mark taken off again)
            text = catalog.read_text()
            return text == "{damaged" if damaged else json.loads(text) == value

        with pytest.raises(FormatError) as caught:
            sharded.repair("m", force=damaged)
        assert str(caught.value) == _not_rebuilt(url, shards, problem) and kept()
        assert check_index(url, repair=True).problems == {"m": [f"missing leaf: {problem}"]}
        assert kept()


@pytest.mark.s3
def test_a_rebuild_refuses_a_lost_listed_leaf_on_s3(s3_server: S3TestServer) -> None:
    """A listed device's leaf deleted beside a split node on moto and SeaweedFS:
    check-index reports a missing leaf and --repair leaves the catalog; a forced
    rebuild refuses, the catalog as it was."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    options = s3_server.storage_options
    shards, model = _index(url, options)
    client = s3_server.client()
    key = f"{model}/catalog.json".removeprefix(f"s3://{bucket}/")
    kept = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    leaf = min((_leaf_of(d) for d in DEVICES), key=len)
    [lost] = [d for d in DEVICES if _leaf_of(d) == leaf]
    [(i, j)] = [
        (i, j)
        for i, c in enumerate(kept["classes"])
        for j, d in enumerate(c["devices"])
        if d == lost
    ]
    client.delete_object(Bucket=bucket, Key=key.replace("catalog.json", f"t{leaf}.json"))
    problem = (
        f"{model}/catalog.json: index catalog classes[{i}].devices[{j}] = '{lost}': must be a "
        f"device whose entry is in one of the model's leaves (its leaf is {model}/t{leaf}.json:"
        " not found: a leaf is missing (a writer updates the leaves before the catalog, and "
        "never removes an entry))"
    )
    check = check_index(url, options, repair=True)
    assert check.problems == {"m": [f"missing leaf: {problem}"]} and check.repaired == []
    assert check.left == {
        "m": ["not repaired: a catalog is rebuilt from its leaves: restore the missing one"]
    }
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    with pytest.raises(FormatError) as caught:
        sharded.repair("m", force=True)
    assert str(caught.value) == _not_rebuilt(url, shards, problem)
    assert json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read()) == kept
    other = _hashed_below(leaf)  # not listed: its split node names the lost leaf
    _lookups_refuse(url, options, other, _named_half(url, shards, model, leaf, other))


EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _job(path: Path, dest: Path, devices: list[str]) -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        + "".join(f'[devices.{d}]\nsoc = "s{i}"\n' for i, d in enumerate(devices))
    )
    return path


def test_fleet_retire_refuses_an_index_missing_a_leaf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run of the DEVICES into leaves of 1 KiB, then a job without one of them:
    with a leaf of the model missing, retire (and its dry run) is exit 2 and writes
    nothing (it retired nothing there and said so, exit 0); restored, it retires."""
    out = tmp_path / "out"
    index = out / "ptestore-index.json"
    create_index(index, leaf_bytes=1024)
    job = _job(tmp_path / "job.toml", out, DEVICES)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _, sharded, _ = open_index(index)
    assert sharded is not None
    model, shards = Path(sharded.model_dir("mlp")), sharded.layout["shards"]
    leaf, split = _splits_lost()
    dropped = next(d for d in DEVICES if _leaf_of(d) == leaf)
    _job(job, out, [d for d in DEVICES if d != dropped])
    kept = (model / f"t{leaf}.json").read_bytes()
    (model / f"t{leaf}.json").unlink()
    before = {p: p.read_bytes() for p in model.iterdir()}
    capsys.readouterr()
    for dry in ([], ["--dry-run"]):
        assert main(["fleet", "retire", str(job), *dry]) == 2
        assert capsys.readouterr().err == (
            f"ptestore fleet: error: {index}: index shards = '{shards}': {MUST} ({model}/"
            f"t{split}.json: index shard state = 'split': must be a node whose halves hold the "
            f"entries it split (at least 2) (they hold 1: a leaf is missing ({model}/t{leaf}"
            f".json not found)){AFTER}\n"
        )
        assert {p: p.read_bytes() for p in model.iterdir()} == before
    (model / f"t{leaf}.json").write_bytes(kept)
    assert main(["fleet", "retire", str(job)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"retired mlp/{dropped}: the job no longer names device '{dropped}'"
    )
    assert [e["device"] for e in load_index(index)["entries"] if e.get("retired")] == [dropped]
