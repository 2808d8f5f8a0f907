"""Two runs of one pair into one index: the artifact a run published is replaced by the
other run's before the first run writes its entry. The entry is checked inside the
compare-and-swap of its leaf (after the read, before the write): one whose artifact was
replaced is not written, the other run's entry stays, and the run reports the pair and
the URL (exit 0); the index names what the URL holds, and ``fetch`` takes it. Made
deterministic by hooks on the real code path: the second run runs whole just before
the first one publishes its index, or between the first one's check and its leaf write
(which then loses its compare-and-swap, and the retry checks again). Locally (versions
3 and 2), on moto and SeaweedFS. A run that replaces no entry of other bytes checks
nothing (no request)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.s3job import s3_options_toml

import ptestore.fleet.index as index_module
from ptestore.fleet import load_job, run_job
from ptestore.fleet.fetch import fetch
from ptestore.fleet.index import artifact_entry, find_entry
from ptestore.fleet.index_pins import ArtifactPin
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.plan import plan_job
from ptestore.fleet.runner import FleetResult
from ptestore.storage.loaders import open_loader
from ptestore.testing.s3server import S3TestServer
from ptestore.viz.html import esc
from ptestore.viz.matrix import matrix_data, matrix_html

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler"


class Fleet:
    """Jobs of one pair (mlp on d0) into one destination, one per backend version."""

    def __init__(
        self, tmp_path: Path, root: str, sources: tuple[str, str], storage: str = "",
        options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.tmp_path = tmp_path
        self.root = root
        self.sources = sources
        self.storage = storage
        self.options = options or {}
        self.dest = f"{root}/d0/mlp.pte"
        self.index = f"{root}/ptestore-index.json"

    def run(self, version: str, index_version: int = 3) -> FleetResult:
        source, ptd = self.sources
        job = self.tmp_path / f"job-{version}.toml"
        job.write_text(
            f'destination = "{self.root}/{{device}}/{{model}}.pte"\n'
            f'backends = ["{SPEC}={version}"]\nindex_version = {index_version}\n'
            f'{self.storage}[[models]]\nname = "mlp"\nsource = "{source}"\nptd = "{ptd}"\n'
            '[devices.d0]\nsoc = "s0"\nscale = 2.0\n'
        )
        result = run_job(load_job(job), workers=1)
        assert [p.status for p in result.pairs] == ["done"], [p.error for p in result.pairs]
        return result

    def held_now(self) -> dict[str, Any]:
        """The index entry's ``pte`` of what the destination holds now."""
        return artifact_entry(self.dest, self.options)[0]

    def assert_index_names_the_url(self, version: str) -> None:
        """The pair's entry names the artifact at its URL (made by ``version``), and a
        fetch of it works (it refused it: EntryMismatch)."""
        entry = find_entry(self.index, "mlp", "d0", **self.options)
        assert entry is not None
        assert entry["pte"] == self.held_now()
        stamps = [c["compatibility"] for c in entry["compatibility"]]
        assert stamps == [f"scaler;soc=s0;v={version}"]
        got = self.tmp_path / "device" / "mlp.pte"
        fetch(self.index, got, model="mlp", device="d0", storage_options=self.options)
        loader = open_loader(self.dest, **self.options)
        try:
            assert got.read_bytes() == bytes(loader.load(0, loader.size()))
        finally:
            loader.close()


def _local(tmp_path: Path) -> Fleet:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    return Fleet(tmp_path, str(tmp_path / "out"), (str(EXT.pte_path), str(EXT.ptd_path)))


def _s3(tmp_path: Path, server: S3TestServer) -> Fleet:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    bucket = server.new_bucket()
    client = server.client()
    client.put_object(Bucket=bucket, Key="src/mlp.pte", Body=EXT.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="src/mlp.ptd", Body=EXT.ptd_path.read_bytes())
    more = "retry_initial = 0.001\nretry_max = 0.02\n"
    storage = s3_options_toml(server.storage_options, more=more)
    sources = (f"s3://{bucket}/src/mlp.pte", f"s3://{bucket}/src/mlp.ptd")
    return Fleet(tmp_path, f"s3://{bucket}/fleet", sources, storage, server.storage_options)


def _checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each check of a pinned artifact found (True: the URL still held it)."""
    found: list[bool] = []
    real = ArtifactPin.held

    def held(self: ArtifactPin) -> bool:
        found.append(real(self))
        return found[-1]

    monkeypatch.setattr(ArtifactPin, "held", held)
    return found


def _superseded(fleet: Fleet, result: FleetResult) -> None:
    """``result`` left the pair out, reported it, and exits 0."""
    assert result.index_error is None and result.exit_code == 0
    assert result.index_shards is not None
    assert result.index_shards["superseded"] == [
        {"model": "mlp", "device": "d0", "url": fleet.dest}
    ]
    line = (
        f"mlp on d0: not indexed: {fleet.dest} was replaced by another run after "
        "this run read it (that run indexes what it published)"
    )
    assert result.summary().splitlines()[-1] == f"superseded: {line}"
    # The run's --report says so too: in the pair's cell and a table of its own.
    plan = plan_job(load_job(fleet.tmp_path / "job-1.0.toml"))
    data = matrix_data(plan, result, artifacts=False)
    [cell] = data["pairs"]
    assert (cell["status"], cell["not_indexed"]) == ("done", line)
    page = matrix_html(data)
    assert "<h2>Done, not indexed (1)</h2>" in page and esc(line) in page


def _replaced_before_the_index(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, index_version: int = 3
) -> None:
    """Run 1.0 publishes its artifact and reads it for its entry; then run 2.0 publishes
    over it and indexes its own, whole; then run 1.0 publishes its index."""
    checks = _checks(monkeypatch)
    real = index_module.publish_entries
    other: list[FleetResult] = []
    started: list[bool] = []

    def publish_entries(url: str, entries: Any, options: Any, **kw: Any) -> Any:
        if not started:  # the first run's publish: the other run goes first, whole
            started.append(True)
            other.append(fleet.run("2.0", index_version))
        return real(url, entries, options, **kw)

    monkeypatch.setattr(index_module, "publish_entries", publish_entries)
    first = fleet.run("1.0", index_version)
    fleet.assert_index_names_the_url("2.0")
    assert other[0].index_shards is not None and other[0].index_shards["superseded"] == []
    # The other run replaced no entry (no check); this one found its artifact replaced.
    assert checks == [False]
    _superseded(fleet, first)


def _replaced_between_check_and_write(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 0.5 indexes the pair; run 1.0 reads the leaf, checks its artifact (held),
    and just before its conditional write run 2.0 publishes over it and indexes its own:
    the write loses its compare-and-swap, and the retry checks again."""
    checks = _checks(monkeypatch)
    fleet.run("0.5")
    assert checks == []  # an entry replacing none: no check, no request
    real = IndexStore.write
    started: list[bool] = []

    def write(self: IndexStore, url: str, value: dict[str, Any], mode: str,
              expected: str | None = None) -> None:  # fmt: skip
        if value.get("format") == "ptestore.index-shard" and value.get("entries") and not started:
            started.append(True)  # the first run's first leaf write: the other run first
            fleet.run("2.0")
        real(self, url, value, mode, expected)

    monkeypatch.setattr(IndexStore, "write", write)
    first = fleet.run("1.0")
    fleet.assert_index_names_the_url("2.0")
    # Run 1.0's check (held), run 2.0's (held), run 1.0's again after its conflict.
    assert checks == [True, True, False]
    _superseded(fleet, first)
    assert first.index_shards is not None
    [leaf] = [s for s in first.index_shards["shards"] if s["kind"] == "leaf"]
    assert (leaf["attempts"], leaf["conflicts"], leaf["written"]) == (2, 1, False)


@pytest.mark.parametrize("index_version", [3, 2])
def test_an_artifact_replaced_before_the_index_is_published_leaves_the_other_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_version: int
) -> None:
    _replaced_before_the_index(_local(tmp_path), monkeypatch, index_version)


def test_an_artifact_replaced_between_the_check_and_the_leaf_write_is_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replaced_between_check_and_write(_local(tmp_path), monkeypatch)


@pytest.mark.s3
@pytest.mark.parametrize(
    "scenario", [_replaced_before_the_index, _replaced_between_check_and_write]
)
def test_the_runs_on_s3(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_server: S3TestServer,
    scenario: Callable[[Fleet, pytest.MonkeyPatch], None],
) -> None:
    scenario(_s3(tmp_path, s3_server), monkeypatch)


def test_a_rerun_that_names_the_same_artifact_checks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose entries name what the index names (a rerun that skips the pair) and
    one replacing an entry of other bytes nobody raced (one check per entry)."""
    fleet = _local(tmp_path)
    checks = _checks(monkeypatch)
    fleet.run("1.0")
    again = run_job(load_job(tmp_path / "job-1.0.toml"), workers=1)
    assert [p.status for p in again.pairs] == ["skipped"] and again.exit_code == 0
    assert checks == []
    fleet.run("2.0")
    assert checks == [True]
    fleet.assert_index_names_the_url("2.0")
