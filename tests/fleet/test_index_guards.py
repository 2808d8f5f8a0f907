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
from ptestore.testing.s3server import S3TestServer

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


def _split_index(tmp_path: Path) -> tuple[str, Any, dict[str, Path]]:
    """An index of model m whose leaves hold one entry each (d0..d7), its sharded view,
    and the leaf file of each device."""
    from ptestore.fleet.index import open_index

    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=1024)
    publish_entries(url, [synthetic_entry("m", f"d{i}") for i in range(8)], {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    leaves = {f"d{i}": Path(sharded.trie("m").find(f"d{i}", 0, 0)[1]) for i in range(8)}
    assert len(set(leaves.values())) == 8
    return url, sharded, leaves


def test_a_leaf_read_from_another_place_than_it_says_is_refused_by_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """d1's leaf copied over d0's: load_index listed d1's entry twice and d0's not at all,
    select found d1's at its own leaf; now every reader refuses the misplaced leaf."""
    from ptestore.fleet.index import find_entry, iter_entries
    from ptestore.fleet.select import select

    url, _, leaves = _split_index(tmp_path)
    here, there = leaves["d0"], leaves["d1"]
    here.write_bytes(there.read_bytes())
    found, wanted = (p.name.removeprefix("t").removesuffix(".json") for p in (there, here))
    message = (
        f"{here}: index shard prefix = {found!r}: must be {wanted!r} (the prefix its name "
        "t<bits>.json gives)"
    )
    for read in (
        lambda: select(url, "m", "d0"),
        lambda: find_entry(url, "m", "d0"),
        lambda: load_index(url),
        lambda: list(iter_entries(url)),
        lambda: publish_entries(url, [synthetic_entry("m", "d0", generation=1)], {}),
    ):
        with pytest.raises(FormatError) as caught:
            read()
        assert str(caught.value) == message
    assert select(url, "m", "d1").made_for == "d1"  # a reader of another leaf is unaffected
    for repair in ([], ["--repair"]):
        assert main(["fleet", "check-index", url, *repair]) == 1
        out = capsys.readouterr().out.splitlines()
        expected = [f"m: damaged leaf: {message}"]
        if repair:
            expected.append(
                "m: not repaired: a catalog is rebuilt from its leaves: restore or remove the "
                "damaged one"
            )
        summary = f"{url}: 1 models, 1 catalogs wrong" + (", 0 repaired" if repair else "")
        assert out == [*expected, summary]


def test_a_leaf_of_another_model_or_an_entry_off_its_prefix_is_refused(tmp_path: Path) -> None:
    from ptestore.fleet.index import find_entry
    from ptestore.fleet.index_v3 import model_segment

    url, sharded, leaves = _split_index(tmp_path)
    leaf = leaves["d0"]
    good = json.loads(leaf.read_text())
    # The entry of d1 (its hash under another prefix) put into d0's leaf.
    stray = json.loads(leaves["d1"].read_text())["entries"][0]
    leaf.write_text(json.dumps({**good, "entries": [*good["entries"], stray]}))
    with pytest.raises(FormatError) as caught:
        find_entry(url, "m", "d0")
    prefix = leaf.name.removeprefix("t").removesuffix(".json")
    assert str(caught.value) == (
        f"{leaf}: index shard entry device = 'd1': must be a device whose hash starts with "
        f"the leaf's prefix {prefix!r}"
    )
    # A leaf of model n (its prefix this one's) put in model m's directory.
    other = {**good, "model": "n", "entries": [{**good["entries"][0], "model": "n"}]}
    leaf.write_text(json.dumps(other))
    with pytest.raises(FormatError) as caught:
        load_index(url)
    assert str(caught.value) == (
        f"{leaf}: index shard model = 'n': must be the model of its directory "
        f"{model_segment('m')!r}"
    )
    assert sharded.model_dir("m").endswith(model_segment("m"))


# -- the root URL: a version 3 root read no further than its first bytes ---------------

_PADDED = 64 << 20


def _padded(text: str, size: int, *, first: bool = False) -> bytes:
    """The JSON object ``text`` padded to ``size`` bytes by a string field of its own,
    after its other fields (``first``: before them)."""
    body = text.strip()
    if first:
        head = '{"padding": "'
        tail = '", ' + body[1:]
    else:
        head = body[:-1] + ', "padding": "'
        tail = '"}'
    return (head + "x" * (size - len(head) - len(tail)) + tail).encode()


def _rchar() -> int:
    """The bytes this process has read by system calls (Linux's /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


_ROOT_REFUSED = (
    "{url}: index size = {size}: must be at most 65536 bytes (a version 3 root: not read "
    "past its first 65536 bytes)"
)


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads by /proc/self/io")
def test_a_padded_version_3_root_is_refused_from_its_first_bytes(tmp_path: Path) -> None:
    """A version 3 root padded to 64 MiB was read whole (the root URL's bound is a
    version 2 index's 1 GiB), then refused once parsed: 64 MiB read from the file (on S3,
    downloaded). Its first 64 KiB say version 3: refused from them, by every reader."""
    from ptestore.fleet.index import find_entry, migrate_index
    from ptestore.fleet.select import select

    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [synthetic_entry("m", "a")], {})
    Path(url).write_bytes(_padded(Path(url).read_text(), _PADDED))
    message = _ROOT_REFUSED.format(url=url, size=_PADDED)
    for read in (
        lambda: select(url, "m", "a"),
        lambda: find_entry(url, "m", "a"),
        lambda: load_index(url),
        lambda: check_index(url),
        lambda: publish_entries(url, [synthetic_entry("m", "b")], {}),
        lambda: migrate_index(url),
    ):
        with pytest.raises(FormatError) as caught:
            read()
        assert str(caught.value) == message
    before = _rchar()
    with pytest.raises(FormatError):
        select(url, "m", "a")
    assert _rchar() - before < 256 << 10  # was 64 MiB: the whole file


def test_a_large_object_at_the_root_url_is_read_by_what_its_first_bytes_say(
    tmp_path: Path,
) -> None:
    """Past a version 3 root's bound, the root URL's object is read on only as a
    version 1/2 index: its version first (as ptestore writes it), or its entries before
    its version (keys sorted by a tool); padding before any of them is refused unread."""
    from ptestore.fleet.select import select

    url = tmp_path / "ptestore-index.json"
    entries = [synthetic_entry("m", f"d{i:03d}") for i in range(100)]
    v2 = {"format": "ptestore.index", "version": 2, "entries": entries}
    for text in (json.dumps(v2), json.dumps(v2, sort_keys=True)):
        url.write_text(text)
        assert url.stat().st_size > 64 << 10
        assert select(str(url), "m", "d042").made_for == "d042"
    url.write_bytes(_padded(json.dumps(v2), 1 << 20, first=True))
    with pytest.raises(FormatError) as caught:
        select(str(url), "m", "d042")
    assert str(caught.value) == (
        f"{url}: index size = 1048576: must be at most 65536 bytes (a version 3 root; its first "
        "65536 bytes show no version 1 or 2 index, neither a version nor entries: not read "
        "further)"
    )
    url.write_bytes(_padded(json.dumps({**v2, "version": 7}), 1 << 20))
    with pytest.raises(FormatError) as caught:
        select(str(url), "m", "d042")
    assert str(caught.value) == f"{url}: index version = 7: must be 1, 2 or 3"


def test_a_padded_version_3_root_in_memory_is_refused() -> None:
    from ptestore.fleet.index import find_entry

    url = "memory://guards-root/ptestore-index.json"
    create_index(url)
    publish_entries(url, [synthetic_entry("m", "a")], {})
    from ptestore.writers.versions import read_versioned

    padded = _padded(read_versioned(url).data.decode(), 8 << 20)
    from ptestore.writers import open_writer

    w = open_writer(url)
    w.write(padded, 0)
    w.publish("overwrite")
    with pytest.raises(FormatError) as caught:
        find_entry(url, "m", "a")
    assert str(caught.value) == _ROOT_REFUSED.format(url=url, size=8 << 20)


@pytest.mark.s3
def test_a_padded_version_3_root_on_s3_is_refused_from_its_first_bytes(
    s3_server: S3TestServer,
) -> None:
    """On S3 the root URL was downloaded whole (8 MiB here) before it was refused. Now,
    counted by the client's own event hooks: the first GetObject's body is not read (its
    Content-Length is past a version 3 root's bound), then one ranged read of 64 KiB."""
    import aiobotocore.session

    from ptestore.fleet.select import select
    from ptestore.testing.s3_traffic import Traffic

    bucket = s3_server.new_bucket()
    opts: dict[str, Any] = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    create_index(url, storage_options=opts)
    publish_entries(url, [synthetic_entry("m", "a")], opts)
    client = s3_server.client()
    key = "fleet/ptestore-index.json"
    text = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    client.put_object(Bucket=bucket, Key=key, Body=_padded(text, 8 << 20))
    traffic = Traffic()
    session = aiobotocore.session.AioSession()
    traffic.attach(session)
    with pytest.raises(FormatError) as caught:
        select(url, "m", "a", storage_options={**opts, "session": session})
    assert str(caught.value) == _ROOT_REFUSED.format(url=url, size=8 << 20)
    ranges = [p.get("Range") for p in traffic.params["GetObject"]]
    assert ranges == [None, "bytes=0-65535"], ranges
    # A version 2 index past a version 3 root's bound is still read, from its first bytes.
    entries = [synthetic_entry("m", f"d{i:03d}") for i in range(100)]
    v2 = json.dumps({"format": "ptestore.index", "version": 2, "entries": entries})
    client.put_object(Bucket=bucket, Key="v2/ptestore-index.json", Body=v2.encode())
    assert len(v2) > 64 << 10
    url = f"s3://{bucket}/v2/ptestore-index.json"
    choice = select(url, "m", "d042", storage_options=opts)
    assert choice.made_for == "d042" and choice.index_read is not None
    assert choice.index_read["objects"] == 1 and choice.index_read["bytes"] == len(v2) + 65536


# -- a version 2 root beside a shard directory a version 3 root named -------------------


def _overwritten(url: str, options: dict[str, Any] | None = None) -> tuple[str, list[Any]]:
    """A version 3 index of m/a, m/b, then a version 2 index of m/a written over its root
    (an older ptestore's copy, read before the migration, renamed over it): returns the
    shard directory and the version 2 entries."""
    from ptestore.writers import open_writer

    opts = dict(options or {})
    root = create_index(url, storage_options=opts)
    old = [synthetic_entry("m", "a")]
    publish_entries(url, [*old, synthetic_entry("m", "b")], opts)
    v2 = {"format": "ptestore.index", "version": 2, "entries": old}
    w = open_writer(url, **({"auto_mkdir": True} if "://" not in url else opts))
    w.write(json.dumps(v2).encode(), 0)
    w.publish("overwrite")
    return str(root["layout"]["shards"]), old


def _overwritten_message(url: str, shards: str) -> str:
    return (
        f"{url}: index version = 2: must be 3 (beside it, {shards} holds root.json, the copy "
        "of the version 3 root that named it: an older ptestore wrote this version 2 index "
        "over the migrated one, and what was published into version 3 since is only there; "
        "see docs/fleet.md, Versions 1 and 2)"
    )


def _refused_and_warned(
    url: str, shards: str, old: list[Any], caplog: pytest.LogCaptureFixture, **opts: Any
) -> None:
    """Readers of every entry and writers refuse the index; a device's look-up answers
    from the version 2 index with a warning."""
    from ptestore.fleet.index import find_entry, iter_entries, migrate_index
    from ptestore.fleet.select import select

    message = _overwritten_message(url, shards)
    for call in (
        lambda: load_index(url, **opts),
        lambda: list(iter_entries(url, **opts)),
        lambda: publish_entries(url, [synthetic_entry("m", "c")], opts),
        lambda: update_index(url, lambda e: None, storage_options=opts),
        lambda: migrate_index(url, storage_options=opts),
        lambda: check_index(url, opts),
    ):
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == message
    for look_up in (
        lambda: select(url, "m", "a", storage_options=opts).made_for,
        lambda: (find_entry(url, "m", "a", **opts) or {}).get("device"),
    ):
        caplog.clear()
        with caplog.at_level("WARNING", logger="ptestore.fleet.index"):
            assert look_up() == "a"
        assert [r.getMessage() for r in caplog.records] == [message]
    # m/b's entry is only in the version 3 shards: b gets what the version 2 index has.
    assert select(url, "m", "b", storage_options=opts).made_for != "b"


def test_a_version_2_root_over_a_migrated_index_is_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ptestore.fleet.orphans import collect_orphans

    url = str(tmp_path / "ptestore-index.json")
    shards, old = _overwritten(url)
    _refused_and_warned(url, shards, old, caplog)
    # gc needs every entry: it removes nothing (m/b's files are named in the shards only).
    [failed] = collect_orphans(tmp_path, grace=0)
    assert failed.action == f"failed: {url}: cannot read the index: " + _overwritten_message(
        url, shards
    )


def test_a_version_2_root_over_a_migrated_index_is_found_in_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = "memory://guards-beside/ptestore-index.json"
    shards, old = _overwritten(url)
    _refused_and_warned(url, shards, old, caplog)


@pytest.mark.s3
def test_a_version_2_root_over_a_migrated_index_is_found_on_s3(
    s3_server: S3TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3_server.new_bucket()
    opts: dict[str, Any] = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    shards, old = _overwritten(url, opts)
    _refused_and_warned(url, shards, old, caplog, **opts)


def test_a_migrations_private_copy_beside_a_version_2_root_is_no_finding(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory no root named (a migration under way, or one that crashed or lost its
    race: never read) beside a version 2 index: no warning, and the next publish
    migrates as before. An index a ptestore before the copy made gets it from its next
    publish."""
    from ptestore.fleet.select import select

    url = tmp_path / "ptestore-index.json"
    entries = [synthetic_entry("m", "a")]
    url.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    private = tmp_path / "ptestore-index.v3-0123abcd" / "m" / model_segment("m")
    private.mkdir(parents=True)
    (private / "t.json").write_text("{}")
    with caplog.at_level("DEBUG", logger="ptestore"):
        assert select(str(url), "m", "a").made_for == "a"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    report = publish_entries(str(url), [synthetic_entry("m", "b")], {})
    assert report.migrated is not None
    shards = json.loads(url.read_text())["layout"]["shards"]
    named = tmp_path / shards / "root.json"
    assert json.loads(named.read_text()) == json.loads(url.read_text())
    named.unlink()  # as a ptestore before the copy left it
    publish_entries(str(url), [synthetic_entry("m", "c")], {})
    assert json.loads(named.read_text()) == json.loads(url.read_text())


def test_a_device_reads_a_bounded_number_of_directories_beside_a_version_2_root(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of ``ptestore-index.v3-*`` directories beside a version 2 root (2,000
    empty prefixes on S3 made one select 2,003 requests, 103 s): a device's look-up
    reads none of them past :data:`NAMED_CHECKED` (a warning says so), the readers of
    every entry and the writers still read each one's copy of the root and refuse the
    index overwritten, and a few directories are still checked by the device."""
    from ptestore.fleet.index_migrate import NAMED_CHECKED
    from ptestore.fleet.select import select
    from ptestore.writers import versions

    url = str(tmp_path / "ptestore-index.json")
    shards, _ = _overwritten(url)
    many = 300
    for i in range(many):
        (tmp_path / f"ptestore-index.v3-{i:08x}").mkdir()
    read: list[str] = []
    real = versions.read_versioned

    def counting(where: Any, **kw: Any) -> Any:
        read.append(str(where))
        return real(where, **kw)

    monkeypatch.setattr(versions, "read_versioned", counting)
    caplog.set_level("WARNING", logger="ptestore.fleet")
    assert select(url, "m", "a").made_for == "a"
    assert read == [url]  # the index alone: was one read per directory beside it
    assert [r.getMessage() for r in caplog.records] == [
        f"{url}: {many + 1} directories named ptestore-index.v3-* beside it, more than a "
        f"device's look-up checks ({NAMED_CHECKED}): not read; `ptestore fleet check-index "
        f"{url}` says whether a version 3 root named one"
    ]
    with pytest.raises(FormatError) as caught:  # read whole: each one read
        load_index(url)
    assert str(caught.value) == _overwritten_message(url, shards)
    with pytest.raises(FormatError) as caught:
        check_index(url)
    assert str(caught.value) == _overwritten_message(url, shards)
    # A few: each read (the one a root named found), the device warned as before.
    for i in range(many - (NAMED_CHECKED - 1)):
        (tmp_path / f"ptestore-index.v3-{i:08x}").rmdir()
    read.clear()
    caplog.clear()
    assert select(url, "m", "a").made_for == "a"
    assert len(read) == 1 + NAMED_CHECKED
    assert [r.getMessage() for r in caplog.records] == [_overwritten_message(url, shards)]
