"""The job stamp a fleet run records (``job.path`` in each artifact's provenance and its
index entry) names the job file by its absolute path, so that ``fleet retire`` finds the
entries a job wrote whatever the directory the run or the retire was started in; a
stamp an earlier version recorded as given (relative) still matches the same job file
given the same way, and never makes an artifact stale."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job, run_job
from ptestore.fleet.index import load_index

MLP = get_fixture("mlp_xnnpack")


def _job_file(tmp: Path, devices: str) -> Path:
    (tmp / "jobs").mkdir(exist_ok=True)
    (tmp / "elsewhere").mkdir(exist_ok=True)
    job = tmp / "jobs" / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n{devices}'
    )
    return job


def _stamps(tmp: Path) -> dict[str, str]:
    entries = load_index(tmp / "out" / "ptestore-index.json")["entries"]
    return {e["device"]: e["job"]["path"] for e in entries}


def test_retire_finds_a_runs_entries_from_any_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job_file(tmp_path, "[devices.a]\n[devices.b]\n")
    monkeypatch.chdir(tmp_path / "jobs")
    assert main(["fleet", "run", "job.toml", "--workers", "1", "-q"]) == 0
    assert _stamps(tmp_path) == {"a": str(job), "b": str(job)}
    job.write_text(job.read_text().replace("[devices.b]\n", ""))
    monkeypatch.chdir(tmp_path / "elsewhere")
    # The plan never compared the stamp: from here too, the pair it names is current.
    assert [p.action for p in plan_job(load_job("../jobs/job.toml")).pairs] == ["skip"]
    assert main(["fleet", "retire", "../jobs/job.toml", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["retired"], done["other_jobs"]) == (
        [{"model": "m", "device": "b", "reason": "the job no longer names device 'b'"}],
        0,
    )
    (entry,) = [
        e
        for e in load_index(tmp_path / "out" / "ptestore-index.json")["entries"]
        if e["device"] == "b"
    ]
    assert entry["retired"]["job"]["path"] == str(job)


def test_a_relative_stamp_an_earlier_version_recorded_still_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries stamped ``job.toml`` (what a run recorded before the stamp was made
    absolute): a run given the same file skips them (their stamps stay) and publishes
    its new pair with the absolute path; ``retire job.toml`` from that directory
    retires both kinds."""
    job = _job_file(tmp_path, "[devices.a]\n[devices.b]\n")
    monkeypatch.chdir(tmp_path / "jobs")
    old = dataclasses.replace(load_job("job.toml"), location="")
    assert old.stamp_path == "job.toml"
    assert run_job(old, workers=1).exit_code == 0
    assert _stamps(tmp_path) == {"a": "job.toml", "b": "job.toml"}
    job.write_text(job.read_text() + "[devices.c]\n")
    result = run_job(load_job("job.toml"), workers=1)
    assert [p.status for p in result.pairs] == ["skipped", "skipped", "done"]
    assert _stamps(tmp_path) == {"a": "job.toml", "b": "job.toml", "c": str(job)}
    job.write_text(job.read_text().replace("[devices.b]\n", "").replace("[devices.c]\n", ""))
    assert main(["fleet", "retire", "job.toml", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "would retire m/b: the job no longer names device 'b'",
        "would retire m/c: the job no longer names device 'c'",
    ]
    # From another directory a relative stamp names another file: left (only the
    # absolute one is this job's there).
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["fleet", "retire", str(job), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert ([e["device"] for e in done["retired"]], done["other_jobs"]) == (["c"], 1)
