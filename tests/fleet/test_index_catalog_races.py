"""Catalog writes racing at a model's first publish and rebuilds racing each other,
made deterministic by hooks on the real code path (local files). Found by the soak on
moto (``test_index_soak.py``): four runs publishing a new model at once, three of which
found no catalog while the fourth had made the trie, each rebuilt the catalog instead of
placing their pairs; each rebuild marked the catalog again and so failed the others'
commits, until all gave up: their pairs were left out of the catalog (``not listed``,
``lists [...] and no more``), nothing lost from the leaves. And a rebuild that runs
placing pairs fail at every attempt gives up with an error its callers report
(``repair``, ``check-index --repair``, a run's ``index_error``; also on moto and
SeaweedFS), where it gave up silently."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ptestore import _retry
from ptestore.cli import main
from ptestore.errors import PreconditionFailed
from ptestore.fleet import index_repair
from ptestore.fleet.index import create_index, find_entry, open_index, publish_entries
from ptestore.fleet.index_catalog import REBUILDING
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_stats import ObjectStats
from ptestore.fleet.index_trie import ModelTrie, Node
from ptestore.fleet.index_v3 import ShardedIndex
from ptestore.testing.fleet_index import device_name, synthetic_entry
from ptestore.testing.s3server import S3TestServer

from .indexkit import assert_catalogs_match_leaves

#: How long a thread of a test waits for the other to reach its step: a ceiling that
#: fails the test if a step is never reached, not a timing assumption.
CEILING = 120.0


def _sharded(url: str, options: dict[str, Any] | None = None) -> ShardedIndex:
    _, sharded, _ = open_index(url, options or {})
    assert sharded is not None
    return sharded


def _listed(url: str, model: str) -> set[str]:
    catalog, _ = _sharded(url).read_catalog(model)
    assert catalog is not None
    return {d for c in catalog["classes"] for d in c["devices"]}


def test_a_run_that_found_no_catalog_places_its_pairs_in_the_one_made_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run P reads no catalog of a new model; run Q then publishes it whole (the trie,
    then the catalog) before P writes its leaf. P places its pair in Q's catalog. Before,
    P rebuilt the catalog from the leaves instead, and runs placing pairs meanwhile
    (one per rebuild here) renewed the rebuild's mark each time, failing its commit until
    P gave up: P's pair was never placed."""
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    mine = synthetic_entry("m", device_name(0), socs=2)
    real_read = ShardedIndex.read_catalog
    real_walk = ModelTrie.walk
    busy: list[bool] = []  # another run's publish in progress (not hooked)
    others = iter(range(1, 100))
    others_done: list[bool] = []  # Q has published

    def read_catalog(self: ShardedIndex, model: str) -> tuple[Any, Any]:
        got = real_read(self, model)
        if busy or got[0] is not None or others_done:
            return got
        busy.append(True)
        others_done.append(True)
        try:  # Q, whole, between P's read and P's leaf write
            publish_entries(url, [synthetic_entry("m", device_name(next(others)))], {})
        finally:
            busy.clear()
        return got

    def walk(self: ModelTrie, *, empty: bool = False) -> Iterator[Node]:
        nodes = list(real_walk(self, empty=empty))
        if not busy:  # a run placing a pair while P's rebuild reads the leaves
            busy.append(True)
            try:
                publish_entries(url, [synthetic_entry("m", device_name(next(others)))], {})
            finally:
                busy.clear()
        return iter(nodes)

    monkeypatch.setattr(ShardedIndex, "read_catalog", read_catalog)
    monkeypatch.setattr(ModelTrie, "walk", walk)
    publish_entries(url, [mine], {})
    monkeypatch.undo()
    assert mine["device"] in _listed(url, "m")
    assert assert_catalogs_match_leaves(url, {}) == 1


def test_a_rebuild_in_flight_is_not_failed_by_another_that_starts_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebuild A marks the catalog and reads the leaves; rebuild B starts then, finds
    the mark and takes it as it is (before, B marked it again, which failed A's commit:
    rebuilds that kept marking again failed each other's commits until all gave up). A
    commits at its first attempt; B's commit, over the version A replaced, fails and B
    (forced) rebuilds again over A's catalog."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(6)], {})
    sharded = _sharded(url)
    real_walk = ModelTrie.walk
    a_walking, b_walking, a_done = threading.Event(), threading.Event(), threading.Event()
    names: dict[int | None, str] = {}
    marks_before_walk: dict[str, list[bool]] = {"a": [], "b": []}

    def walk(self: ModelTrie, *, empty: bool = False) -> Iterator[Node]:
        who = names.get(threading.get_ident())
        if who is not None:
            catalog, _ = sharded.read_catalog("m")
            marks_before_walk[who].append(catalog is not None and REBUILDING in catalog)
        if who == "a" and not a_walking.is_set():
            a_walking.set()
            assert b_walking.wait(CEILING), "rebuild B never read the leaves"
        elif who == "b" and not b_walking.is_set():
            b_walking.set()
            assert a_done.wait(CEILING), "rebuild A never ended"
        return real_walk(self, empty=empty)

    monkeypatch.setattr(ModelTrie, "walk", walk)
    stats = {"a": ObjectStats(sharded.catalog_url("m"), "catalog"),
             "b": ObjectStats(sharded.catalog_url("m"), "catalog")}  # fmt: skip
    errors: list[BaseException] = []

    def run(who: str, then: threading.Event | None) -> None:
        names[threading.get_ident()] = who
        try:
            sharded.repair("m", stats[who], force=True)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            for event in (a_walking, b_walking, a_done):
                event.set()
        finally:
            if then is not None:
                then.set()

    a = threading.Thread(target=run, args=("a", a_done))
    a.start()
    assert a_walking.wait(CEILING), "rebuild A never read the leaves"
    b = threading.Thread(target=run, args=("b", None))
    b.start()
    a.join(CEILING)
    b.join(CEILING)
    monkeypatch.undo()
    assert not errors and not a.is_alive() and not b.is_alive()
    assert stats["a"].conflicts == 0 and stats["a"].written  # committed at its first attempt
    assert stats["b"].written and marks_before_walk["b"][0]  # B took A's mark as it was
    assert assert_catalogs_match_leaves(url, {}) == 1
    catalog, _ = sharded.read_catalog("m")
    assert catalog is not None and REBUILDING not in catalog


def _rebuilds_failed_by_placements(
    monkeypatch: pytest.MonkeyPatch, url: str, model: str, options: dict[str, Any] | None = None
) -> list[str]:
    """Every time a rebuild has read the leaves (attempts cut to 3), another run places
    a new pair of ``model`` (a publish, whole): it renews the rebuild's mark, so the
    rebuild's commit fails, every attempt. Returns the devices those runs published."""
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    real_rebuild = index_repair.rebuild
    busy: list[bool] = []
    others: list[str] = []

    def rebuild(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if not busy:
            busy.append(True)
            try:
                others.append(device_name(100 + len(others)))
                publish_entries(url, [synthetic_entry(model, others[-1])], options or {})
            finally:
                busy.clear()
        return real_rebuild(*args, **kwargs)

    monkeypatch.setattr(index_repair, "rebuild", rebuild)
    return others


def _gave_up(url: str, model: str, options: dict[str, Any] | None = None) -> str:
    catalog = _sharded(url, options).catalog_url(model)
    return (
        f"{catalog}: the catalog of model {model!r} changed under every one of 3 attempts to "
        "rebuild it from its leaves (other runs writing it meanwhile): not rebuilt, it stays "
        f"behind its leaves until `ptestore fleet check-index {url} --repair` (or a later run "
        "of the model) rebuilds it"
    )


def test_a_rebuild_other_runs_keep_failing_gives_up_with_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs placing pairs while a rebuild reads the leaves, every attempt: the rebuild
    gives up with an error naming the catalog, the model, the index and the attempts
    (before, it returned as if it had rebuilt the catalog, which stayed as it was)."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(4)], {})
    others = _rebuilds_failed_by_placements(monkeypatch, url, "m")
    stats = ObjectStats(_sharded(url).catalog_url("m"), "catalog")
    with pytest.raises(PreconditionFailed) as caught:
        _sharded(url).repair("m", stats, force=True)
    monkeypatch.undo()
    assert str(caught.value) == _gave_up(url, "m")
    assert caught.value.url == _sharded(url).catalog_url("m")
    assert len(others) == 3 and not stats.written and stats.conflicts >= 3
    assert set(others) <= _listed(url, "m")  # their placements are there


def test_a_rebuilds_attempts_back_off_as_conflicts_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each attempt of a rebuild another run failed is retried by the conflict policy
    (its back-off, set to 0 here: the waits are the policy's, never the test's), as
    every conflict of an index write is, and logged as such at DEBUG, in words: what was
    retried and why (before, the log named the private class ``_Again``). Before that,
    the next attempt followed at once, however many runs were writing the catalog."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(4)], {})
    _rebuilds_failed_by_placements(monkeypatch, url, "m")
    catalog = _sharded(url).catalog_url("m")
    with caplog.at_level(logging.DEBUG, "ptestore.retry"), pytest.raises(PreconditionFailed):
        _sharded(url).repair("m", force=True)
    monkeypatch.undo()
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"] == [
        f"{catalog}: rebuilding the catalog of model 'm' from its leaves: attempt {n} of 3 "
        "failed (another run wrote the catalog while this one read the leaves, so the catalog "
        "rebuilt from them was not written: the catalog and the leaves are read again); "
        "retrying in 0.00s"
        for n in (1, 2)
    ]
    assert not any("_Again" in r.getMessage() for r in caplog.records)


def _stamped(device: str, stamp: str) -> dict[str, Any]:
    """An entry of model "m" whose compatibility stamps are ``stamp`` alone."""
    return {**synthetic_entry("m", device), "compatibility": [{"id": "X", "v": stamp}]}


def test_a_placement_placed_again_backs_off_as_conflicts_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run places its pair (stamp B) in the catalog; before it reads the pair's leaf
    again, another run writes that leaf (stamp C, then D: its own placement still to
    come), twice. Each round of placing the pair again as its leaf is now is retried by
    the conflict policy (its back-off set to 0 here: the waits are the policy's, never
    the test's), logged at DEBUG saying what and why; the catalog ends agreeing with the
    leaves. Before, the rounds followed one another at once, unlogged."""
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [_stamped(device_name(i), "A") for i in range(3)], {})
    mine = device_name(0)
    real_place = ShardedIndex._place
    others = iter(["C", "D"])

    def place(self: ShardedIndex, model: str, *args: Any) -> Any:
        got = real_place(self, model, *args)
        stamp = next(others, None)
        if stamp is not None:  # another run's leaf write, its placement still to come
            self.trie(model).update({mine: lambda _: _stamped(mine, stamp)}, 0, 0)
        return got

    monkeypatch.setattr(ShardedIndex, "_place", place)
    with caplog.at_level(logging.DEBUG, "ptestore.retry"):
        publish_entries(url, [_stamped(mine, "B")], {})
    monkeypatch.undo()
    catalog = _sharded(url).catalog_url("m")
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"] == [
        f"{catalog}: placing the pairs of model 'm' in its catalog: attempt {n} of 3 failed "
        f"(another run wrote the leaves of 1 of them after they were placed ('{mine}'): "
        "placed again as the leaves are now); retrying in 0.00s"
        for n in (1, 2)
    ]
    assert assert_catalogs_match_leaves(url, {}) == 1
    stamps = {
        c["compatibility"][0]["v"]: c["devices"]
        for c in json.loads(Path(catalog).read_text())["classes"]
    }
    assert stamps == {"A": [device_name(1), device_name(2)], "D": [mine]}


def test_check_index_reports_a_rebuild_given_up_as_not_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check-index --repair`` of a catalog an interrupted rebuild left marked, while
    runs keep placing pairs: ``not repaired: ...``, exit 1 (before: the model counted as
    rebuilt, exit 0, its catalog still marked)."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(4)], {})
    catalog = Path(_sharded(url).catalog_url("m"))
    catalog.write_text(json.dumps({**json.loads(catalog.read_text()), REBUILDING: "0" * 16}))
    _rebuilds_failed_by_placements(monkeypatch, url, "m")
    capsys.readouterr()
    assert main(["fleet", "check-index", url, "--repair"]) == 1
    monkeypatch.undo()
    assert capsys.readouterr().out.splitlines() == [
        "m: its catalog carries a rebuild's mark (an interrupted rebuild)",
        f"m: not repaired: {_gave_up(url, 'm')}",
        f"{url}: 1 models, 1 catalogs wrong, 0 repaired",
    ]
    assert REBUILDING in json.loads(catalog.read_text())
    assert main(["fleet", "check-index", url, "--repair"]) == 0  # once they are done
    assert assert_catalogs_match_leaves(url, {}) == 1


def _real_run(tmp_path: Path) -> tuple[Path, str]:
    """A real run of one model (``mlp_xnnpack_ext``) for devices ``a`` and ``b`` into
    ``tmp_path/out``: its job file and the URL of the index it published."""
    from support.fixtures import get_fixture

    ext = get_fixture("mlp_xnnpack_ext")
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{out}/{{device}}/{{model}}.pte"\n'
        'backends = ["support.fleet_backend:Scaler=1.0"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{ext.pte_path}"\nptd = "{ext.ptd_path}"\n'
        '[devices.a]\nsoc = "s0"\n[devices.b]\nsoc = "s1"\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    return job, str(out / "ptestore-index.json")


def test_a_run_whose_rebuild_is_given_up_reports_an_index_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run's catalog lost (a crash between the trie and the catalog); the next
    run (its pairs skipped, indexed again) finds no catalog and rebuilds it while runs
    keep placing pairs: its index_error names the rebuild given up, exit 1 (before: exit
    0, no catalog left)."""
    job, url = _real_run(tmp_path)
    Path(_sharded(url).catalog_url("mlp")).unlink()
    _rebuilds_failed_by_placements(monkeypatch, url, "mlp")
    capsys.readouterr()
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    monkeypatch.undo()
    got = json.loads(capsys.readouterr().out)
    assert (got["skipped"], got["failed"], got["index"]) == (2, 0, None)
    assert got["index_error"] == _gave_up(url, "mlp")


@pytest.mark.s3
def test_a_rebuild_given_up_on_s3(s3_server: S3TestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on moto and SeaweedFS, the commits refused by the server (412): the
    rebuild's error, and check-index's ``not repaired``."""
    options = dict(s3_server.storage_options)
    url = f"s3://{s3_server.new_bucket()}/fleet/ptestore-index.json"
    publish_entries(url, [synthetic_entry("m", device_name(i), socs=2) for i in range(4)], options)
    others = _rebuilds_failed_by_placements(monkeypatch, url, "m", options)
    with pytest.raises(PreconditionFailed) as caught:
        _sharded(url, options).repair("m", force=True)
    assert str(caught.value) == _gave_up(url, "m", options) and len(others) == 3
    found = check_index(url, options, repair=True, models=["m"])
    monkeypatch.undo()
    assert found.left == {"m": [f"not repaired: {_gave_up(url, 'm', options)}"]}
    assert not found.ok and found.repaired == []
    assert check_index(url, options, repair=True).ok
    assert assert_catalogs_match_leaves(url, options) == 1


def _placements_rewritten(monkeypatch: pytest.MonkeyPatch, model: str, device: str) -> None:
    """After every placement of ``model``'s pairs in its catalog (attempts cut to 3),
    another run writes ``device``'s leaf with new stamps (its own placement still to
    come): every round finds that pair to place again."""
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    real_place = ShardedIndex._place
    others = itertools.count(1)

    def place(self: ShardedIndex, placed_model: str, *args: Any) -> Any:
        got = real_place(self, placed_model, *args)
        if placed_model == model:
            stamp = f"C{next(others)}"
            entry = {**synthetic_entry(model, device), "compatibility": [{"id": "X", "v": stamp}]}
            self.trie(model).update({device: lambda _: entry}, 0, 0)
        return got

    monkeypatch.setattr(ShardedIndex, "_place", place)


def _placement_given_up(url: str, model: str, device: str) -> str:
    catalog = _sharded(url).catalog_url(model)
    return (
        f"{catalog}: the pairs of model {model!r} were placed in its catalog in every one of "
        f"3 rounds, and other runs wrote the leaves of 1 of them after each ('{device}'): not "
        "placed as their leaves are now (left to those runs' own placements), the catalog "
        f"may stay behind its leaves until `ptestore fleet check-index {url} --repair` (or a "
        "later run of the model) rebuilds it"
    )


def test_placements_other_runs_rewrite_every_round_are_given_up_with_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other runs write the leaf of a run's pair after each of its 3 rounds of placing
    it: the publish gives up with an error naming the catalog, the model, the rounds and
    the pairs, that model's alone (the other model's entries published). Before, the
    rounds ran out silently."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [_stamped(device_name(i), "A") for i in range(3)], {})
    mine = device_name(0)
    _placements_rewritten(monkeypatch, "m", mine)
    errors: dict[str, Any] = {}
    other = synthetic_entry("n", mine)
    publish_entries(url, [_stamped(mine, "B"), other], {}, errors=errors)
    with pytest.raises(PreconditionFailed) as caught:
        publish_entries(url, [_stamped(mine, "B")], {})
    monkeypatch.undo()
    assert list(errors) == ["m"] and isinstance(errors["m"], PreconditionFailed)
    assert str(errors["m"]) == str(caught.value) == _placement_given_up(url, "m", mine)
    assert caught.value.url == _sharded(url).catalog_url("m")
    assert find_entry(url, "n", mine) == other


def test_a_run_whose_placement_is_given_up_reports_an_index_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run whose placement of its pair in the catalog other runs keep undoing
    (they write its leaf after every round): its ``index_errors`` names the model and
    the placement given up, and the summary says so, exit 1 (before: exit 0, nothing
    said)."""
    job, url = _real_run(tmp_path)
    # Another run's entry of (mlp, a) there: the run places its own, a change.
    other = {**synthetic_entry("mlp", "a"), "compatibility": [{"id": "X", "v": "Z"}]}
    publish_entries(url, [other], {})
    _placements_rewritten(monkeypatch, "mlp", "a")
    capsys.readouterr()
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    error = _placement_given_up(url, "mlp", "a")
    assert got["index_errors"] == [{"model": "mlp", "device": None, "index": url, "error": error}]
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 1
    monkeypatch.undo()
    summary = capsys.readouterr().out.splitlines()
    assert summary[-1] == f"index not published for model mlp: {error}"
