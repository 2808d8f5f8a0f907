"""The sharded index (version 3) on local files, memory and S3 (moto, SeaweedFS): leaves
split at their bound, ``select`` answers as from the whole index while reading a few
small objects (counted outside ptestore), ``update_index``, and the migration of version
1/2 indexes, an older writer racing it included."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ptestore.backends import register_backend, unregister_backend
from ptestore.backends.compat import DeviceProfile
from ptestore.errors import ConfigurationError, FormatError
from ptestore.fleet.index import (
    create_index,
    find_entry,
    load_index,
    migrate_index,
    open_index,
    publish_entries,
    update_index,
)
from ptestore.fleet.index_store import ObjectStats
from ptestore.fleet.index_v3 import ShardedIndex, model_segment
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import SocBackend, device_name, soc_of, synthetic_entry
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import versions

from .indexkit import assert_catalogs_match_leaves, leaf_sizes, old_writer

KEY = ("model", "device")


def _sorted(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: (e["model"], e["device"]))


@pytest.fixture
def soc_backend() -> Iterator[None]:
    register_backend(SocBackend, "synthetic-npu")
    yield
    unregister_backend("synthetic-npu")


def _same_answers(url: str, opts: dict[str, Any], model: str, devices: list[Any]) -> None:
    """``select`` from the shards answers as from the whole index, flattened."""
    whole = load_index(url, **opts)
    for device in devices:
        got = select(url, model, device, storage_options=opts)
        want = select(whole, model, device)
        assert (got.kind, got.made_for, got.rating, got.pte, got.ptd) == (
            want.kind,
            want.made_for,
            want.rating,
            want.pte,
            want.ptd,
        ), device
        assert got.index_read is not None and want.index_read is None


def _exercise(url: str, opts: dict[str, Any], devices: int = 40) -> None:
    create_index(url, leaf_bytes=4096, listed=3, storage_options=opts)
    entries = [
        synthetic_entry(m, device_name(i), socs=4) for m in ("m0", "m1") for i in range(devices)
    ]
    report = publish_entries(url, entries, opts)
    assert report.version == 3 and report.migrated is None
    assert sum(s.splits for s in report.stats) > 0  # 20 entries of 1.4 KB > 4 KiB
    assert all(size <= 4096 for size, _ in leaf_sizes(url, opts))
    assert load_index(url, **opts)["entries"] == _sorted(entries)
    assert assert_catalogs_match_leaves(url, opts) == 2
    # The same entries again: every object read, none written.
    again = publish_entries(url, entries, opts)
    assert [s for s in again.stats if s.written] == []
    # select: a device's own build, another device's build for a new device of the same
    # SoC, the portable source for an unknown SoC; as the whole index answers.
    register_backend(SocBackend, "synthetic-npu")
    try:
        own = device_name(7)
        newcomer = DeviceProfile("newcomer", {"soc": soc_of(own, 4)})
        _same_answers(url, opts, "m1", [own, newcomer, DeviceProfile("odd", {"soc": "x"})])
        assert select(url, "m1", newcomer, storage_options=opts).made_for != "newcomer"
    finally:
        unregister_backend("synthetic-npu")
    # update_index: the change sees each entry inside its leaf's compare-and-swap.
    gone = device_name(3)
    done = update_index(
        url,
        lambda e: {**e, "retired": {"reason": "test"}} if e["device"] == gone else None,
        storage_options=opts,
    )
    assert sorted(e["model"] for e in done.changed) == ["m0", "m1"]
    assert done.examined == 2 * devices
    found = find_entry(url, "m1", gone, **opts)
    assert found is not None and found["retired"] == {"reason": "test"}
    assert select(url, "m1", gone, storage_options=opts).made_for != gone
    assert assert_catalogs_match_leaves(url, opts) == 2


def test_sharded_index_locally(tmp_path: Path) -> None:
    _exercise(str(tmp_path / "fleet" / "ptestore-index.json"), {})


def test_sharded_index_in_memory() -> None:
    _exercise(f"memory://idx-{uuid.uuid4().hex}/ptestore-index.json", {})


@pytest.mark.s3
def test_sharded_index_on_s3(s3_server: S3TestServer) -> None:
    import aiobotocore.session

    from ptestore.testing.s3_traffic import Traffic

    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    _exercise(url, s3_server.storage_options, 20)
    # What select reads, counted by botocore's own event hooks: GetObject bodies (a
    # request for a missing object, the empty half of a split, has an error body too).
    traffic = Traffic()
    session = aiobotocore.session.AioSession()
    traffic.attach(session)
    opts = {**s3_server.storage_options, "session": session}
    register_backend(SocBackend, "synthetic-npu")
    for device in (device_name(2), DeviceProfile("new", {"soc": soc_of(device_name(2), 4)})):
        traffic.reset()
        choice = select(url, "m0", device, storage_options=opts)
        assert choice.kind == "artifact" and choice.index_read is not None
        assert choice.index_read["bytes"] <= traffic.received["GetObject"] <= 64 * 1024
        assert choice.index_read["objects"] <= 8
        # (requests: a 4 KiB leaf bound spreads the leaves over more depths than 16 KiB)
        assert traffic.calls["GetObject"] == choice.index_read["requests"] <= 12
    unregister_backend("synthetic-npu")


# ----------------------------------------------------------------------- what select reads


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every object read through ``read_versioned`` (the one read of the index's
    objects), counted here, not by ptestore."""
    sizes: list[int] = []
    real = versions.read_versioned

    def counting(url: Any, **kw: Any) -> Any:
        got = real(url, **kw)
        sizes.append(len(got.data))
        return got

    monkeypatch.setattr(versions, "read_versioned", counting)
    return sizes


def test_select_reads_a_few_small_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, soc_backend: None
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    entries = [
        synthetic_entry(f"model{m}", device_name(i), socs=8) for m in range(3) for i in range(300)
    ]
    publish_entries(url, entries, {})
    whole = len(json.dumps({"entries": entries}, indent=1))  # version 2: one object
    assert whole > 1_000_000
    cases = {
        "own": device_name(123),  # its own build
        "newcomer": DeviceProfile("newcomer", {"soc": soc_of(device_name(5), 8)}),
        "unknown soc": DeviceProfile("odd", {"soc": "none"}),  # the portable source
    }
    for what, device in cases.items():
        sizes = _count_reads(monkeypatch)
        choice = select(url, "model1", device)
        assert sum(sizes) <= 64 * 1024, (what, sizes)
        assert len(sizes) <= 8, (what, sizes)
        assert choice.index_read == {
            "objects": sum(1 for s in sizes if s),
            "bytes": sum(sizes),
            "requests": len(sizes),
        }
        monkeypatch.undo()
    _same_answers(url, {}, "model1", list(cases.values()))


# ---------------------------------------------------------------------------- migration


_old_writer = old_writer


@pytest.mark.parametrize("version", [1, 2])
def test_a_v1_or_v2_index_is_migrated_by_the_next_publish(tmp_path: Path, version: int) -> None:
    url = str(tmp_path / "ptestore-index.json")
    old = [synthetic_entry("m", device_name(i)) for i in range(30)]
    Path(url).write_text(
        json.dumps({"format": "ptestore.index", "version": version, "entries": old})
    )
    # Reading never migrates.
    assert select(url, "m", device_name(4)).made_for == device_name(4)
    assert json.loads(Path(url).read_text())["version"] == version
    new = synthetic_entry("m", "newcomer")
    report = publish_entries(url, [new], {})
    assert report.migrated is not None and report.migrated["from_version"] == version
    assert report.migrated["entries"] == 30
    root = json.loads(Path(url).read_text())
    assert (root["version"], root["migrated"]["from_version"]) == (3, version)
    assert load_index(url)["entries"] == _sorted([*old, new])
    assert assert_catalogs_match_leaves(url) == 1
    assert migrate_index(url) is None  # version 3 already
    # Writing version 2 into it now is refused, by this ptestore and by an older one.
    with pytest.raises(ConfigurationError, match=r"is a version 3 \(sharded\) index"):
        publish_entries(url, [new], {}, version=2)
    with pytest.raises(FormatError, match="index version = 3: must be 1 or 2"):
        _old_writer(url, [synthetic_entry("m", "late")])
    assert find_entry(url, "m", "late") is None


def test_an_old_writer_during_the_migration_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older ptestore publishes into the version 2 index after the migration copied
    it and before the root is swapped: the swap fails, the index is read again, and its
    entry is in the version 3 index."""
    url = str(tmp_path / "ptestore-index.json")
    _old_writer(url, [synthetic_entry("m", device_name(i)) for i in range(10)])
    real = ShardedIndex.write_static
    raced: list[dict[str, Any]] = []

    def then_an_old_writer(self: ShardedIndex, *args: Any, **kw: Any) -> int:
        n = real(self, *args, **kw)
        if not raced:  # once, between the copy and the swap
            raced.append(synthetic_entry("m", "raced-in"))
            _old_writer(url, raced)
        return n

    monkeypatch.setattr(ShardedIndex, "write_static", then_an_old_writer)
    report = publish_entries(url, [synthetic_entry("m2", "x")], {})
    root = next(s for s in report.stats if s.kind == "root")
    assert (root.attempts, root.conflicts, root.written) == (2, 1, True)
    devices = {(e["model"], e["device"]) for e in load_index(url)["entries"]}
    assert ("m", "raced-in") in devices and ("m2", "x") in devices and len(devices) == 12
    assert assert_catalogs_match_leaves(url) == 2


def test_two_migrations_at_once_keep_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    _old_writer(url, [synthetic_entry("m", device_name(i)) for i in range(10)])
    both = threading.Barrier(2)
    real = ShardedIndex.write_static

    def together(self: ShardedIndex, *args: Any, **kw: Any) -> int:
        n = real(self, *args, **kw)
        both.wait(timeout=300)  # both copied the old index before either swaps the root
        return n

    monkeypatch.setattr(ShardedIndex, "write_static", together)
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            publish_entries(url, [synthetic_entry("m", name)], {})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    devices = [e["device"] for e in load_index(url)["entries"]]
    assert sorted(devices) == sorted([device_name(i) for i in range(10)] + ["one", "two"])
    shards = json.loads(Path(url).read_text())["layout"]["shards"]
    listed = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    # the loser removed its copy; the lock file is the legacy writers' (index_migrate)
    assert listed == ["ptestore-index.json", "ptestore-index.json.lock", shards]


def test_a_job_can_keep_writing_version_2(tmp_path: Path) -> None:
    """``index_version = 2`` in a job file: devices too old for version 3 keep working."""
    from ptestore.fleet.job import JobError, parse_job

    text = (
        'destination = "out/{device}/{model}.pte"\nindex_version = 2\n'
        '[[models]]\nsource = "src/m.pte"\n[devices.a]\n'
    )
    assert parse_job(text, "job.toml").index_version == 2
    assert parse_job(text.replace("index_version = 2\n", ""), "job.toml").index_version is None
    with pytest.raises(JobError, match=r"job.toml:2: index_version: must be 2 or 3"):
        parse_job(text.replace("= 2", "= 4"), "job.toml")
    url = str(tmp_path / "ptestore-index.json")
    assert publish_entries(url, [synthetic_entry("m", "a")], {}, version=2).version == 2
    report = update_index(url, lambda e: {**e, "retired": {}}, version=2)
    assert (report.version, len(report.changed)) == (2, 1)
    assert json.loads(Path(url).read_text())["version"] == 2


def test_a_catalog_a_crash_left_out_is_rebuilt(tmp_path: Path) -> None:
    """A run killed between its leaves and its catalog: the next publish into that model
    rebuilds the catalog from the leaves (every device, not only its own)."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", device_name(i)) for i in range(30)], {})
    shards = json.loads(Path(url).read_text())["layout"]["shards"]
    catalog = tmp_path / shards / "m" / model_segment("m") / "catalog.json"
    catalog.unlink()
    # Still found by its own device (the leaves are the truth).
    assert select(url, "m", device_name(9)).made_for == device_name(9)
    report = publish_entries(url, [synthetic_entry("m", "late")], {})
    assert [s.written for s in report.stats if s.kind == "catalog"] == [True]
    assert catalog.exists() and assert_catalogs_match_leaves(url) == 1


def test_retire_never_writes_back_an_older_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run publishes a fresh entry of a pair while ``fleet retire`` is deciding to
    retire it: the entry is retired as it is then (the fresh one), never replaced by the
    retired copy of what retire read first (what a read-merge-write did)."""
    from ptestore.fleet import retire
    from ptestore.fleet.job import parse_job

    url = str(tmp_path / "out" / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", d) for d in ("a", "b")], {})
    job = parse_job(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        '[[models]]\nname = "m"\nsource = "src/m.pte"\n[devices.a]\n',
        "fleet/job.toml",  # the job stamp of synthetic entries: they are this job's
    )
    fresh = synthetic_entry("m", "b", generation=7)
    real = retire.retired_reason
    seen: list[str] = []

    def meanwhile(job: Any, model: object, device: object) -> str | None:
        if device == "b" and not seen:  # a run of the older job publishes b now
            seen.append("b")
            publish_entries(url, [fresh], {})
        return real(job, model, device)

    monkeypatch.setattr(retire, "retired_reason", meanwhile)
    result = retire.retire_dropped(job)
    assert [r["device"] for r in result.retired] == ["b"]
    got = find_entry(url, "m", "b")
    assert got is not None and got["retired"]["reason"] == "the job no longer names device 'b'"
    assert {k: v for k, v in got.items() if k != "retired"} == fresh  # not the older copy
    assert find_entry(url, "m", "a") == synthetic_entry("m", "a")


def test_index_errors_name_the_object_the_field_and_the_limit(tmp_path: Path) -> None:
    from ptestore.errors import AlreadyExists, ObjectNotFound

    url = str(tmp_path / "ptestore-index.json")
    with pytest.raises(ObjectNotFound, match=rf"^{url}: no such file$"):
        update_index(url, lambda e: None)
    with pytest.raises(ConfigurationError) as err:
        create_index(url, leaf_bytes=100)
    assert str(err.value) == f"{url}: leaf_bytes = 100: must be an int in [1024, 16777216]"
    with pytest.raises(ConfigurationError) as err:
        create_index("ftp://host/ptestore-index.json")
    assert str(err.value) == (
        "ftp://host/ptestore-index.json: a sharded index needs a store with "
        "compare-and-swap (local files, memory://, s3://)"
    )
    root = create_index(url)
    with pytest.raises(AlreadyExists, match=rf"^{url}: an index exists already$"):
        create_index(url)
    with pytest.raises(ConfigurationError, match=rf"^{url}: index version must be 2 or 3, got 4$"):
        publish_entries(url, [synthetic_entry("m", "a")], {}, version=4)
    with pytest.raises(FormatError) as bad:
        publish_entries(url, [{"model": "m"}], {})
    assert str(bad.value) == (
        f"{url}: index entry = {{'model': 'm', 'device': None}}: must be an entry with a "
        "model and a device name"
    )
    publish_entries(url, [synthetic_entry("m", "a")], {})
    with pytest.raises(ConfigurationError) as err:
        update_index(url, lambda e: {**e, "device": "b"})
    assert str(err.value) == (
        f"{url}: update_index's change must keep an entry's model and device ('m', 'a')"
    )
    # A hostile or damaged shard: named, with its field.
    model_dir = tmp_path / root["layout"]["shards"] / "m" / model_segment("m")
    leaf = model_dir / "t.json"
    good = leaf.read_text()
    leaf.write_text(good.replace('"model":"m","device"', '"model":"other","device"'))
    with pytest.raises(FormatError) as bad:
        select(url, "m", "a")
    assert str(bad.value) == f"{leaf}: index shard entry model = 'other': must be 'm'"
    leaf.write_text(good.replace('"state":"leaf"', '"state":"maybe"'))
    with pytest.raises(FormatError) as bad:
        find_entry(url, "m", "a")
    assert str(bad.value) == (
        f"{leaf}: index shard state = 'maybe': must be 'leaf' or 'splitting' or 'split'"
    )
    leaf.write_text(good)
    catalog = model_dir / "catalog.json"
    catalog.write_text('{"format": "ptestore.index-catalog", "leaves": [], "classes": []}')
    with pytest.raises(FormatError) as bad:
        select(url, "m", "a")
    assert str(bad.value) == (
        f"{catalog}: index catalog leaves = []: must be an object of depth: count"
    )
    catalog.write_text(
        '{"format": "ptestore.index-catalog", "leaves": {}, "classes": [], "rebuilding": 7}'
    )
    with pytest.raises(FormatError) as bad:
        select(url, "m", "a")
    assert str(bad.value) == f"{catalog}: index catalog rebuilding = 7: must be a string"
    # A root naming a directory outside the index's own (path syntax) is refused.
    Path(url).write_text(Path(url).read_text().replace(root["layout"]["shards"], "../../etc"))
    with pytest.raises(FormatError) as bad:
        select(url, "m", "a")
    assert str(bad.value) == (
        f"{url}: index layout.shards = '../../etc': must be ptestore-index.v3-<hex>"
    )


def test_an_index_can_be_migrated_ahead_of_a_run(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    _old_writer(url, [synthetic_entry("m", device_name(i)) for i in range(5)])
    done = migrate_index(url)
    assert done is not None and (done["from_version"], done["entries"]) == (2, 5)
    assert json.loads(Path(url).read_text())["version"] == 3
    assert [e["device"] for e in load_index(url)["entries"]] == [device_name(i) for i in range(5)]
    assert migrate_index(url) is None


def _stamped(device: str, stamp: str) -> dict[str, Any]:
    """An entry of model "m" whose compatibility stamps are ``stamp`` alone."""
    return {**synthetic_entry("m", device), "compatibility": [{"id": "X", "v": stamp}]}


def _classes(catalog: dict[str, Any] | None) -> list[tuple[str, list[str], bool]]:
    """Each class of a catalog of :func:`_stamped` entries: stamp, listed devices, more."""
    assert catalog is not None
    return [(c["compatibility"][0]["v"], c["devices"], c["more"]) for c in catalog["classes"]]


def test_a_placement_that_changes_nothing_is_decided_on_the_catalog_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer reads the catalog, another run changes it (and rebuilds it) while the
    first writes its leaves: the first's placement leaves the catalog as it is only when
    the catalog *as it is then* already says so, never on its first, stale, read (which
    left a member out of a class whose list the rebuild had completed: the soak's
    ``assert_catalogs_match_leaves`` failure)."""
    from ptestore.fleet import index_trie

    url = str(tmp_path / "ptestore-index.json")
    create_index(url, listed=1)

    # Class A lists "a" (and has more: "c"); "b" would not be listed while "a" is.
    publish_entries(url, [_stamped("a", "A"), _stamped("c", "A")], {})
    real = index_trie.ModelTrie.update
    raced: list[bool] = []

    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not raced:  # the writer of "b" has read the catalog; another run moves "a"
            raced.append(True)  # to class B, which empties A's list: it rebuilds it
            publish_entries(url, [_stamped("a", "B")], {})
        return real(self, *args, **kwargs)

    monkeypatch.setattr(index_trie.ModelTrie, "update", update)
    publish_entries(url, [_stamped("b", "A")], {})
    assert raced == [True]
    monkeypatch.setattr(index_trie.ModelTrie, "update", real)
    assert assert_catalogs_match_leaves(url) == 1
    _, sharded, _ = open_index(url)
    assert sharded is not None
    assert _classes(sharded.read_catalog("m")[0]) == [("B", ["a"], False), ("A", ["b"], True)]


def test_a_rebuild_never_commits_leaves_read_before_a_writer_that_changed_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild reads the leaves while a writer publishes an entry whose placement
    leaves the catalog as it is (no catalog write): the rebuild's commit fails on the
    mark the writer renewed, and it reads the leaves again. A repair of a catalog that
    needs none (another run rebuilt it since) leaves it alone; forced, it rebuilds."""
    from ptestore.fleet import index_trie

    url = str(tmp_path / "ptestore-index.json")
    create_index(url, listed=2)

    publish_entries(url, [_stamped(d, "A") for d in ("a", "c", "d")], {})
    publish_entries(url, [_stamped("c", "B")], {})  # A lists "a" and has more ("d")
    _, sharded, _ = open_index(url)
    assert sharded is not None
    before = sharded.read_catalog("m")
    real = index_trie.ModelTrie.walk
    walks: list[int] = []

    def walk(self: Any, **kwargs: Any) -> Any:
        yield from real(self, **kwargs)
        walks.append(1)
        if len(walks) == 1:  # "b" joins A now: "a" is listed and more is set
            publish_entries(url, [_stamped("b", "A")], {})

    monkeypatch.setattr(index_trie.ModelTrie, "walk", walk)
    sharded.repair("m")  # not needed: no walk, no write
    assert sharded.read_catalog("m") == before and walks == []
    stats = ObjectStats(sharded.catalog_url("m"), "catalog")
    sharded.repair("m", stats, force=True)
    monkeypatch.setattr(index_trie.ModelTrie, "walk", real)
    assert len(walks) == 2 and stats.conflicts == 1 and stats.written
    assert assert_catalogs_match_leaves(url) == 1
    catalog, _ = sharded.read_catalog("m")
    assert catalog is not None and "rebuilding" not in catalog
    assert _classes(catalog) == [("A", ["a", "b"], True), ("B", ["c"], False)]


def test_a_run_that_found_no_catalog_rebuilds_the_one_another_run_made_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run finds a trie without its catalog (a crash left it so); before it writes its
    leaves, another run makes the catalog from the leaves as they are then. The first
    run's entries are in the catalog all the same: it rebuilds what it finds, not only
    a catalog that is missing (what lost a writer's entries in the S3 soak)."""
    from ptestore.fleet import index_trie

    url = str(tmp_path / "ptestore-index.json")
    create_index(url, listed=8)
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=1) for i in range(4)], {})
    _, sharded, _ = open_index(url)
    assert sharded is not None
    Path(sharded.catalog_url("m")).unlink()  # the crash
    real = index_trie.ModelTrie.update
    raced: list[bool] = []

    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not raced:  # before this run's leaves: another run makes the catalog
            raced.append(True)
            publish_entries(url, [synthetic_entry("m", "other", socs=1)], {})
        return real(self, *args, **kwargs)

    monkeypatch.setattr(index_trie.ModelTrie, "update", update)
    publish_entries(url, [synthetic_entry("m", "late", socs=1)], {})
    monkeypatch.setattr(index_trie.ModelTrie, "update", real)
    assert raced == [True]
    assert assert_catalogs_match_leaves(url) == 1
    catalog, _ = sharded.read_catalog("m")
    assert catalog is not None and "rebuilding" not in catalog
    assert [c["devices"] for c in catalog["classes"]] == [
        sorted([device_name(i) for i in range(4)] + ["late", "other"])
    ]
