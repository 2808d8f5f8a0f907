"""An operator's run: a job-wide mistake is one message and exit 2 before any pair
(a misspelt storage option, a missing bucket, an unwritable destination, a backend
that does not load); --fail-fast stops at the first failed pair."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.testing.s3server import S3TestServer

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"


def _job(tmp: Path, dest: str, *, extra: str = "", devices: str = "", spec: str = SPEC) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{spec}"]\n{extra}'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        + (devices or '[devices.a]\nsoc = "x"\n[devices.b]\nsoc = "y"\n')
    )
    return job


def test_unwritable_destination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A destination under a regular file: no directory can be made there (root too).
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    job = _job(tmp_path, str(blocker / "out"))
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{job}: destination {blocker}/out/ is not writable" in err
    assert len(err.splitlines()) == 2  # the message and the --debug hint
    assert main(["fleet", "plan", str(job)]) == 0  # plan writes nothing, checks no marker


def test_a_backend_that_does_not_load_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, str(tmp_path / "out"), spec="no_such_pkg.mod:Backend")
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore fleet: error: {job}: backends: ")
    assert len(err.splitlines()) == 2  # one message (and the --debug hint)
    assert not (tmp_path / "out").exists()


def test_a_backend_that_does_not_load_on_the_workers_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend the planning process loads but the pool's (spawned) workers cannot: a
    module that exists only in this process's ``sys.modules``."""
    import sys
    import types

    from support import fleet_backend

    here = types.ModuleType("ptestore_planner_only")
    here.Scaler = fleet_backend.Scaler  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ptestore_planner_only", here)
    devices = "".join(f'[devices.d{i}]\nsoc = "x"\n' for i in range(6))
    spec = "ptestore_planner_only:Scaler=1.0"
    job = _job(tmp_path, str(tmp_path / "out"), spec=spec, devices=devices)
    assert main(["fleet", "run", str(job), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"ptestore fleet: error: {re.escape(str(job))}: backends: on worker process \d+ of "
        rf"\S+: backend {re.escape(repr(spec))}: cannot import 'ptestore_planner_only': "
        r"No module named 'ptestore_planner_only'\n",
        err,
    ), err  # one message, not one per pair
    assert not list((tmp_path / "out").rglob("*.pte"))


def test_fail_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Scaler fails on a scale that is no number: the first device fails.
    devices = '[devices.bad]\nscale = "x"\n[devices.a]\nsoc = "x"\n[devices.b]\nsoc = "y"\n'
    job = _job(tmp_path, str(tmp_path / "out"), devices=devices)
    assert main(["fleet", "run", str(job), "--workers", "1", "--json", "--fail-fast"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert [(p["device"], p["status"]) for p in shown["pairs"]] == [
        ("bad", "failed"),
        ("a", "failed"),
        ("b", "failed"),
    ]
    assert shown["pairs"][1]["error"] == "not started: --fail-fast after mlp on bad failed"
    assert not (tmp_path / "out" / "a").exists()
    # Without it the others are done.
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert (shown["done"], shown["failed"]) == (2, 1)


@pytest.mark.s3
def test_s3_option_typo_and_missing_bucket(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = s3_server.storage_options
    conn = (
        f'[storage_options]\nendpoint_url = "{opts["endpoint_url"]}"\n'
        f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
        '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
    )
    bucket = s3_server.new_bucket()
    typo = _job(tmp_path, f"s3://{bucket}/f", extra=conn.replace("secret =", "secrett ="))
    assert main(["fleet", "run", str(typo), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "secrett" in err and len(err.splitlines()) == 2  # one message, not one per pair
    missing = _job(tmp_path, f"s3://{bucket}-missing/f", extra=conn)
    assert main(["fleet", "run", str(missing), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: destination s3://{bucket}-missing/f/ is not writable" in err
    ok = _job(tmp_path, f"s3://{bucket}/f", extra=conn)
    assert main(["fleet", "run", str(ok), "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] == 2
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in keys if ".ptestore-preflight-" in k]  # the marker is gone


@pytest.mark.s3
def test_transient_failures_are_retried_per_pair(
    moto_s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.faulty_proxy import faulty_proxy

    from ptestore.fleet import load_job, plan_job, run_plan

    bucket = moto_s3.new_bucket()
    opts = moto_s3.storage_options
    with faulty_proxy(moto_s3.endpoint_url, every=4) as (endpoint, faults):
        # One storage attempt per request: a fault is final for the request, so only
        # the per-pair retry can get the pair through.
        conn = (
            f'[storage_options]\nendpoint_url = "{endpoint}"\nretry_attempts = 1\n'
            f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
            '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
        )
        job = _job(tmp_path, f"s3://{bucket}/f", extra=conn)
        faults.enabled = False
        plan = plan_job(load_job(job))
        faults.enabled = True
        result = run_plan(plan, workers=1)
    shown = result.to_json()
    assert faults.injected > 0
    # A pair that hit a fault went again and got through; none tried more than 3 times.
    assert any(p["status"] == "done" and p["attempts"] > 1 for p in shown["pairs"]), shown
    assert all(1 <= p["attempts"] <= 3 for p in shown["pairs"]), shown


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_stops_promptly_with_a_partial_summary(tmp_path: Path, workers: str) -> None:
    import signal
    import subprocess
    import sys
    import time

    devices = (
        '[devices.a]\nsoc = "x"\n[devices.b]\nsoc = "x"\nsleep = 60\n'
        '[devices.c]\nsoc = "x"\nsleep = 60\n'
    )
    out = tmp_path / "out"
    job = _job(tmp_path, str(out), devices=devices, spec="support.slow_backend:Slow=1.0")
    tests = str(Path(__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=tests, TQDM_DISABLE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", workers],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # Ctrl-C reaches the whole group, as on a terminal
    )
    deadline = time.monotonic() + 90
    while not (out / "a" / "mlp.pte").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    stdout, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 15  # not the 60 s the other pairs would take
    assert proc.returncode == 130, stderr.decode()
    text = stdout.decode()
    assert "done                      1" in text and "failed                    2" in text
    assert "interrupted before it finished" in text
    err = stderr.decode().strip().splitlines()[-1]
    assert err == "ptestore fleet: interrupted after 1 pair(s) were published (mlp on a)"
    from ptestore.fleet.index import load_index

    index = load_index(out / "ptestore-index.json")
    assert [e["device"] for e in index["entries"]] == ["a"]


def test_gc_job_cleans_the_job_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    job = _job(tmp_path, str(out))
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    stale = out / "a" / f".mlp.pte.ptestore-{'0' * 16}.tmp"  # a crashed writer's staging
    stale.write_bytes(b"partial")
    os.utime(stale, (1, 1))
    assert main(["gc", "--job", str(job), "--older-than", "1h", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["target"] == f"{out}/" and shown["removed"] == 1
    assert not stale.exists() and (out / "a" / "mlp.pte").exists()
    assert main(["gc", str(out), "--job", str(job)]) == 2
    assert "gc takes PATH_OR_S3_PREFIX or --job JOB, not both" in capsys.readouterr().err
