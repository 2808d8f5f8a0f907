"""Readers of every entry of a version 3 index (``load_index``, ``iter_entries``,
``update_index``, ``fleet retire``, ``check-index``) refuse an index a part of which is
missing (a leaf a split node or the catalog names, the shard directory), where they read
it as fewer entries and retire retired nothing there; a node legitimately absent (the
half of a split that got no entry, a device never published) is still read as empty,
and one device's look-up (``find_entry``, ``select``) still answers "no entry". Locally
and on moto and SeaweedFS; each message pinned."""

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
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer

#: Devices whose hashes all begin with 0 (leaves of 1 KiB: one entry each): the top
#: node splits, all of them into t0 (t1 never exists), and so on down.
DEVICES = [n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("0")][:4]
#: A device whose hash begins with 1: never published.
ELSEWHERE = next(n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("1"))
MUST = "must be every node its catalogs and split nodes name"
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
    assert find_entry(url, "m", lost) is None  # one device's look-up: no entry, as before
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


def test_a_leaf_of_a_device_the_catalog_lists_is_refused(tmp_path: Path) -> None:
    """A leaf beside a split node (its split holds 2 below, its empty half has a split
    sibling): the catalog, read first, lists its device."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url)
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
    _refusals(
        url,
        {},
        f"{url}: index shards = '{shards}': {MUST} ({model}/catalog.json: index catalog "
        f"classes[{i}].devices[{j}] = '{lost}': must be a device whose entry is in one of "
        "the model's leaves (none holds it: a leaf is missing (a writer updates the leaves "
        f"before the catalog, and never removes an entry)){AFTER}",
    )


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
    client.put_object(Bucket=bucket, Key=key, Body=kept)
    _sound(url, options)
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
