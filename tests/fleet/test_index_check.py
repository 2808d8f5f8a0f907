"""``ptestore fleet check-index INDEX [--repair]``: the catalogs of a sharded index
checked against their leaves, the wrong ones (removed, behind their leaves, left marked
by an interrupted rebuild) named and rebuilt, locally and on moto and SeaweedFS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ptestore.cli import main
from ptestore.fleet.index import open_index, publish_entries
from ptestore.fleet.index_check import check_index
from ptestore.testing.fleet_index import device_name, synthetic_entry
from ptestore.testing.s3server import S3TestServer

from .indexkit import assert_catalogs_match_leaves


def _catalog(url: str, model: str) -> Path:
    _, sharded, _ = open_index(url)
    assert sharded is not None
    return Path(sharded.catalog_url(model))


def _index(tmp_path: Path) -> str:
    url = str(tmp_path / "ptestore-index.json")
    entries = [synthetic_entry(m, device_name(i), socs=3) for m in "kmn" for i in range(12)]
    publish_entries(url, entries, {})
    return url


def _damage(url: str) -> str:
    """Model m's catalog removed, n's missing its first class, k's left marked; returns
    the class n lost."""
    _catalog(url, "m").unlink()
    n = json.loads(_catalog(url, "n").read_text())
    lost = n["classes"].pop(0)
    _catalog(url, "n").write_text(json.dumps(n))
    k = json.loads(_catalog(url, "k").read_text())
    _catalog(url, "k").write_text(json.dumps({**k, "rebuilding": "0123456789abcdef"}))
    from ptestore.fleet.index_catalog import class_key

    return class_key(lost["compatibility"])


def test_a_sound_index_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _index(tmp_path)
    assert main(["fleet", "check-index", url]) == 0
    assert capsys.readouterr().out == f"{url}: 3 models, 0 catalogs wrong\n"


def test_wrong_catalogs_are_named_then_rebuilt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _index(tmp_path)
    lost = _damage(url)
    assert main(["fleet", "check-index", url]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "m: no catalog",
        f"n: class {lost}: not listed",
        "k: its catalog carries a rebuild's mark (an interrupted rebuild)",
        f"{url}: 3 models, 3 catalogs wrong",
    ]
    assert main(["fleet", "check-index", url, "--repair", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["repaired"] == ["k", "m", "n"] and got["left"] == {} and got["ok"]
    assert got["problems"] == {"m": ["no catalog"], "n": [f"class {lost}: not listed"]}
    assert got["marked"] == ["k"]
    assert "rebuilding" not in json.loads(_catalog(url, "k").read_text())
    assert main(["fleet", "check-index", url]) == 0
    assert assert_catalogs_match_leaves(url) == 3


def test_a_catalog_listing_a_device_its_leaves_do_not_hold_is_wrong(tmp_path: Path) -> None:
    url = _index(tmp_path)
    m = json.loads(_catalog(url, "m").read_text())
    m["classes"][0]["devices"] = ["dev-999999", *m["classes"][0]["devices"][1:]]
    _catalog(url, "m").write_text(json.dumps(m))
    (problem,) = check_index(url).problems["m"]
    assert problem.startswith("class ") and ": lists ['dev-999999'" in problem
    assert ", its entries are ['dev-" in problem
    assert check_index(url, repair=True).ok and check_index(url).problems == {}


def test_a_version_2_index_has_nothing_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", "a")], {}, version=2)
    assert main(["fleet", "check-index", url]) == 0
    assert capsys.readouterr().out == (
        f"{url}: index version 2: one object, no catalogs to check\n"
    )


def test_a_version_2_entry_that_is_not_one_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-index said nothing of a version 2 index (exit 0) while select skipped its
    damaged entries: each is reported, exit 1 (--repair has nothing to rebuild it from)."""
    url = str(tmp_path / "ptestore-index.json")
    good = synthetic_entry("m", "a")
    entries = [good, "garbage", {**synthetic_entry("m", "b"), "model": ["m"]}]
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    for repair in ([], ["--repair"]):
        assert main(["fleet", "check-index", url, *repair]) == 1
        assert capsys.readouterr().out == (
            f"{url}: damaged entry: {url}: index entries[1] = 'garbage': must be an object "
            "with a model and a device\n"
            f"{url}: damaged entry: {url}: index entries[2].model = ['m']: must be a string\n"
            f"{url}: index version 2: one object, no catalogs to check\n"
        )
    assert main(["fleet", "check-index", url, "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert (found["ok"], list(found["problems"])) == (False, ["entries"])
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [good]}))
    assert main(["fleet", "check-index", url]) == 0


def test_no_index_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "nope.json")
    assert main(["fleet", "check-index", url]) == 2
    assert url in capsys.readouterr().err


@pytest.mark.s3
def test_check_index_repairs_on_s3(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    opts: dict[str, Any] = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    publish_entries(url, [synthetic_entry("m", device_name(i)) for i in range(10)], opts)
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    (catalog,) = [k for k in keys if k.endswith("/catalog.json")]
    client.delete_object(Bucket=bucket, Key=catalog)
    found = check_index(url, opts)
    assert found.problems == {"m": ["no catalog"]} and not found.ok
    repaired = check_index(url, opts, repair=True)
    assert repaired.repaired == ["m"] and repaired.ok
    assert assert_catalogs_match_leaves(url, opts) == 1


def test_models_named_are_checked_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--models``: only their objects are read and repaired; a model the index does not
    hold is named, never given a catalog."""
    url = _index(tmp_path)
    lost = _damage(url)
    assert main(["fleet", "check-index", url, "--models", "n,zz", "--repair"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"n: class {lost}: not listed",
        "zz: not in this index (no catalog, no live entry)",
        "n: rebuilt",
        f"{url}: 2 models, 2 catalogs wrong, 1 repaired",
    ]
    found = check_index(url)
    assert set(found.problems) == {"m"} and found.marked == ["k"]  # the others untouched
    _, sharded, _ = open_index(url)
    assert sharded is not None and sharded.read_catalog("zz")[0] is None


def test_a_damaged_catalog_is_a_problem_and_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A catalog that is not JSON, or whose field has the wrong type, is named (not an
    exit 2 for the whole check) and --repair rebuilds it over the damaged version; then
    the model can be published again."""
    url = _index(tmp_path)
    m, n = _catalog(url, "m"), _catalog(url, "n")
    m.write_text("{truncated")
    n.write_text(json.dumps({**json.loads(n.read_text()), "classes": "oops"}))
    assert main(["fleet", "check-index", url]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"m: damaged catalog: {m}: index = b'{{truncated': must be JSON (Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1))",
        f"n: damaged catalog: {n}: index catalog classes = 'oops': must be a list of classes",
        f"{url}: 3 models, 2 catalogs wrong",
    ]
    assert main(["fleet", "check-index", url, "--repair", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["repaired"] == ["m", "n"] and got["left"] == {} and got["ok"]
    assert main(["fleet", "check-index", url]) == 0
    assert assert_catalogs_match_leaves(url) == 3
    publish_entries(url, [synthetic_entry("m", device_name(99), socs=3)], {})
