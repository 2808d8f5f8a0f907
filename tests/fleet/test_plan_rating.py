"""A fleet plan asks the job's backends to rate each current artifact for its pair's
device, as ``verify --job`` does (one rating: ``ptestore.backends.rating``), and runs
a pair whose artifact any of them rates below ``OPTIMAL``. Before, a plan compared
provenance keys only: an artifact ``verify --job`` called stale ("backends.compatibility:
... prefer_respecialization", exit 1) was planned ``skip`` and never made again.

The backends (``tests/support/rated_backend.py``) rate by the SDK installed now (an
environment variable), at one version; everything runs locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job
from ptestore.fleet.work import run_pair

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.rated_backend:SdkRated"
BELOW = "compatibility: {spec} rates the XnnpackBackend data prefer_respecialization for 'a'"


def _job(tmp: Path, spec: str = SPEC) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{spec}"]\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n[devices.a]\nsoc = "x"\n'
    )
    return job


def _plan(job: Path) -> tuple[str, str]:
    (pair,) = plan_job(load_job(job)).pairs
    return pair.action, pair.reason


def _run(job: Path) -> int:
    return main(["fleet", "run", str(job), "--workers", "1", "--quiet"])


def test_an_artifact_rated_below_optimal_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path)
    monkeypatch.setenv("PTESTORE_TEST_SDK", "2.30")
    assert _run(job) == 0
    assert _plan(job) == ("skip", "current: provenance and bytes match")
    capsys.readouterr()
    monkeypatch.setenv("PTESTORE_TEST_SDK", "2.31")  # an SDK update; the version is the same
    # verify --job calls it stale ...
    assert main(["verify", "--job", str(job), "--quick"]) == 1
    out = capsys.readouterr()
    assert (
        "stale: backends.compatibility: support.rated_backend:SdkRated rates the "
        "XnnpackBackend data prefer_respecialization for 'a' (stamped 'sdk=2.30')"
    ) in out.out + out.err
    # ... and the plan runs it, saying why (it was planned 'skip current').
    assert _plan(job) == ("run", BELOW.format(spec=SPEC))
    assert main(["fleet", "plan", str(job)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("m "))
    assert " run " in line and line.endswith(BELOW.format(spec=SPEC))
    assert _run(job) == 0
    assert _plan(job) == ("skip", "current: provenance and bytes match")
    capsys.readouterr()
    assert main(["verify", "--job", str(job), "--quick"]) == 0


def test_a_fresh_artifact_still_below_optimal_is_not_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the backend makes now is what it makes: the run publishes it and succeeds;
    the next plan runs it again (fleet.md says so)."""
    spec = "support.rated_backend:Stuck"
    job = _job(tmp_path, spec)
    assert _run(job) == 0
    assert _plan(job) == ("run", BELOW.format(spec=spec))
    assert main(["fleet", "run", str(job), "--workers", "1", "--json", "--quiet"]) == 0
    assert '"status": "done"' in capsys.readouterr().out
    assert _plan(job) == ("run", BELOW.format(spec=spec))


def test_a_backend_that_cannot_rate_fails_its_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its check calls sys.exit(0): the plan fails the pair naming it, and so does a run."""
    spec = "support.exiting_backend:Exit"
    job = _job(tmp_path, spec)
    assert _run(job) == 0  # no artifact yet: nothing to rate
    action, reason = _plan(job)
    assert (action, reason) == (
        "fail",
        f"cannot rate the destination: backend {spec!r}: check_compatibility failed: SystemExit: 0",
    )
    capsys.readouterr()
    assert main(["fleet", "run", str(job), "--workers", "1", "--json", "--quiet"]) == 1
    (pair,) = json.loads(capsys.readouterr().out)["pairs"]
    assert (pair["status"], pair["error"]) == ("failed", reason)  # as planned, not run
    # A worker given the pair rates it too, and fails it the same way (once: final).
    (planned,) = plan_job(load_job(job)).pairs
    assert planned.task is not None
    result = run_pair(planned.task)
    assert (result.status, result.error, result.attempts) == (
        "failed",
        f"backend {spec!r}: check_compatibility failed: SystemExit: 0",
        1,
    )
