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
from support.s3job import s3_options_toml

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


def test_the_preflight_leaves_no_directory_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The directories the preflight made for its marker are removed with it: a run
    that then fails (every pair, or the whole run after the plan) leaves no empty
    destination root; one that already existed stays."""
    root = tmp_path / "new" / "deep"
    devices = '[devices.bad]\nscale = "x"\n[devices.worse]\nscale = "y"\n'
    job = _job(tmp_path, str(root), devices=devices)
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["failed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]
    # Refused after the preflight and the plan: no worker has the device's CPU.
    cpu = "aarch64/page=4096:asimd" if os.uname().machine != "aarch64" else "x86_64/page=4096:sse2"
    job = _job(tmp_path, str(root), devices=f'[devices.phone]\nxnnpack_cpu = "{cpu}"\n')
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 2
    assert "declares xnnpack_cpu" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]
    root.mkdir(parents=True)  # not the preflight's: kept, and only its marker removed
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 2
    assert root.is_dir() and list(root.iterdir()) == []


@pytest.mark.s3
def test_s3_option_typo_and_missing_bucket(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = s3_server.storage_options
    conn = s3_options_toml(opts)
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
    # Every second upload (PUT: each pair's PutObject, the index) fails. The writer makes
    # one storage attempt per request: a fault is final for the request, so only the
    # per-pair retry gets the pair through.
    # (Reads would not do: a failed checksum HEAD is answered by reading the bytes.)
    with faulty_proxy(moto_s3.endpoint_url, every=2, methods=frozenset({"PUT"})) as (
        endpoint,
        faults,
    ):
        conn = s3_options_toml(opts, endpoint=endpoint, more="retry_attempts = 1\n")
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


@pytest.mark.parametrize(("workers", "as_json"), [("1", False), ("2", False), ("1", True)])
def test_ctrl_c_stops_promptly_with_a_partial_summary(
    tmp_path: Path, workers: str, as_json: bool
) -> None:
    """Ctrl-C once ``a`` is done and a slow pair has started: the run stops at once
    (not after the hour the slow pairs would take) and reports ``a`` as done.

    Waits for events only (it timed out on a busy machine when it waited 0.5 s and gave
    the shutdown 15 s): the slow backend creates its ``started`` file on entry, and the
    run logs each pair it recorded (``-v``). With one worker the pairs run in order, so
    ``b`` started means ``a`` was recorded; with two, ``c`` starts in the worker that ran
    ``a`` as soon as ``a``'s result was *sent*, which the parent may not have recorded yet
    on a busy machine (it once reported ``a`` as interrupted): so the test also waits for
    the parent's "pair mlp on a: done" line. With ``--json`` stdout is one JSON document,
    the partial result (never an error object after it)."""
    import queue
    import signal
    import subprocess
    import sys
    import threading
    import time

    flag = tmp_path / "c.started" if workers == "2" else tmp_path / "b.started"
    devices = (
        '[devices.a]\nsoc = "x"\n'
        f'[devices.b]\nsoc = "x"\nsleep = 3600\nstarted = "{tmp_path / "b.started"}"\n'
        f'[devices.c]\nsoc = "x"\nsleep = 3600\nstarted = "{tmp_path / "c.started"}"\n'
    )
    out = tmp_path / "out"
    job = _job(tmp_path, str(out), devices=devices, spec="support.slow_backend:Slow=1.0")
    tests = str(Path(__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    env["TQDM_DISABLE"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", workers, "-v"]
        + (["--json"] if as_json else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # Ctrl-C reaches the whole group, as on a terminal
    )
    lines: queue.Queue[bytes] = queue.Queue()
    err_lines: list[bytes] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(b"")

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240  # a ceiling for a busy machine, not a guess
        recorded = False
        while not (recorded and flag.exists()):
            assert proc.poll() is None and time.monotonic() < deadline, err_lines
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                continue
            err_lines.append(line)
            recorded = recorded or b"pair mlp on a: done" in line
        assert (out / "a" / "mlp.pte").exists()
        os.killpg(proc.pid, signal.SIGINT)
        # Prompt: it ends long before the sleeping pairs would (an hour).
        assert proc.stdout is not None
        stdout = proc.stdout.read()
        proc.wait(timeout=240)
        reader.join(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    while not lines.empty():
        err_lines.append(lines.get())
    stderr = b"".join(err_lines)
    assert proc.returncode == 130, stderr.decode()
    text = stdout.decode()
    if as_json:
        shown = json.loads(text)
        assert (shown["done"], shown["failed"], shown["interrupted"]) == (1, 2, True)
        assert "error" not in shown
        assert "interrupted before it finished" in {p["error"] for p in shown["pairs"]}
    else:
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
    old = stale.stat().st_mtime - 2 * 86400  # two days (an mtime of 1970 is no age)
    os.utime(stale, (old, old))
    assert main(["gc", "--job", str(job), "--older-than", "1h", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["target"] == f"{out}/" and shown["removed"] == 1
    assert not stale.exists() and (out / "a" / "mlp.pte").exists()
    assert main(["gc", str(out), "--job", str(job)]) == 2
    assert "gc takes PATH_OR_S3_PREFIX or --job JOB, not both" in capsys.readouterr().err


EXT = get_fixture("mlp_xnnpack_ext")


def test_failed_pairs_leave_no_empty_destination_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every pair of a run into a new root fails: nothing is left, not the root nor a
    device's directory. The .pte writer made ``out/a`` and was discarded before the
    .ptd writer whose staging file was in it: ``out/a`` and ``out`` were left (writers
    are discarded last opened first now, and the run owns the root)."""
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{out}/{{device}}/{{model}}.pte"\n'
        'backends = ["support.dying_backend:Dying"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        "[devices.a]\nfail = true\n[devices.b]\nfail = true\n"
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 1
    capsys.readouterr()
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


def test_pair_writers_at_once_leave_no_empty_destination_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two pairs' writers open at once in a new root (``fleet run --workers 2``), each
    removing only the directories it made: the one that made the root was discarded
    first, while the other's directory was in it; the other, discarded last, had not
    made the root: an interrupted or failed run left it empty. The run makes the root
    itself now and removes what is empty under it once its pairs have ended. The other
    worker's writer is opened and discarded by the test's backend, in this order, in
    one process (``support.sibling_backend``)."""
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{out}/{{device}}/{{model}}.pte"\n'
        'backends = ["support.sibling_backend:Sibling"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        f'[devices.a]\nroot = "{out}"\n[devices.b]\nroot = "{out}"\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in result["pairs"]] == ["failed", "failed"]
    assert "the other worker's writer was discarded" in result["pairs"][1]["error"]
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


def test_a_run_removes_only_what_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root that was there before the run, an empty directory in it included, is left
    as it was by a run whose pairs all fail; the device directory a pair's .pte writer
    made is gone (it was left: discarded before the .ptd writer whose staging file was
    in it; writers are discarded last opened first)."""
    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{out}/{{device}}/{{model}}.pte"\n'
        'backends = ["support.dying_backend:Dying"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        "[devices.a]\nfail = true\n"
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 1
    capsys.readouterr()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["mine"]
