"""``fleet run --pair-timeout``: a pair whose backend never returns is failed once it has
run past the limit, its worker process stopped (SIGTERM, then SIGKILL); the others are
published, a pair the pool's break stopped runs again alone, the hung pair does not.

The limits leave the normal pairs (one tiny model each) far more time than they take,
and nothing here asserts how long a run took: only what it reports and leaves. The
runs wait out their limit (12 s each, mostly idle): ``slow``, out of the fast loop."""

from __future__ import annotations

import json
import os
import re
import select
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import ConfigurationError
from ptestore.fleet import load_job, plan_job, run_job
from ptestore.fleet.index import load_index
from ptestore.gc import collect_local
from ptestore.writers.local import TEMP_NAME_RE

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.hanging_backend:Hanging=1.0"
#: The limit: a normal pair (and a hung pair's way to its backend) takes a fraction of
#: a second, a few on a busy machine, counted from its own start on its worker.
LIMIT = 12.0


def _job(tmp: Path, devices: str) -> Path:
    assert MLP.pte_path is not None
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n' + devices
    )
    return job


def _staging(root: Path) -> list[str]:
    return sorted(
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files if TEMP_NAME_RE.match(f)
    )


@pytest.mark.slow  # waits out its limit: 12 s, mostly idle
def test_a_hung_pair_fails_past_the_limit_and_the_others_are_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers: ``hang`` never returns; ``a`` waits for it to have started, then
    for a third of the limit, so that ``b``, which starts after ``a`` on the same
    worker, starts well after ``hang``; ``b``'s first run never returns either, and the
    pool's break at ``hang``'s limit stops it: it runs again alone and is published.
    ``c`` never started on the broken pool: it runs on a new one. ``hang`` fails with
    the limit and the time it ran, is not run again, and leaves nothing (SIGTERM: its
    writer discarded its staging file)."""
    # Both hangs end on SIGTERM; the grace before SIGKILL is only an upper bound, so a
    # long one costs nothing here and lets a busy machine's worker clean up in time (it
    # took more than 5 s once, under two CI runs: SIGKILL, its staging file left).
    import ptestore.fleet.pool

    monkeypatch.setattr(ptestore.fleet.pool, "STOP_GRACE", 60.0)
    started = tmp_path / "hang.started"
    marker = tmp_path / "b.first"
    job = _job(
        tmp_path,
        f'[devices.hang]\nsoc = "x"\nstarted = "{started}"\nhang = "soft"\n'
        f'[devices.a]\nsoc = "x"\nafter = "{started}"\nsleep = {LIMIT / 3}\n'
        f'[devices.b]\nsoc = "x"\nfirst_hangs = "{marker}"\n'
        '[devices.c]\nsoc = "x"\n',
    )
    # The pool takes the pairs in this order: hang, then a, then b once a is done.
    assert [p.pair.device.name for p in plan_job(load_job(job)).pairs] == ["hang", "a", "b", "c"]
    code = main(
        ["fleet", "run", str(job), "--workers", "2", "--pair-timeout", f"{LIMIT:g}", "--json"]
    )
    shown = json.loads(capsys.readouterr().out)
    assert code == 1
    pairs = {p["device"]: p for p in shown["pairs"]}
    assert {d: p["status"] for d, p in pairs.items()} == {
        "hang": "failed",
        "a": "done",
        "b": "done",
        "c": "done",
    }, shown
    error = pairs["hang"]["error"]
    m = re.fullmatch(
        r"mlp on hang ran for (?P<ran>[0-9.]+) s, past --pair-timeout 12 s: its worker "
        r"process (?P<pid>[0-9]+) was stopped \(SIGTERM\); the pair is not run again",
        error,
    )
    assert m is not None, error
    assert float(m["ran"]) >= LIMIT and pairs["hang"]["seconds"] >= LIMIT
    assert marker.exists()  # b's first run hung and was stopped by the break
    assert (shown["done"], shown["failed"]) == (3, 1)
    out = tmp_path / "out"
    assert not (out / "hang").exists()  # its writer discarded: no file, no directory
    assert _staging(out) == []
    assert sorted(e["device"] for e in load_index(out / "ptestore-index.json")["entries"]) == [
        "a",
        "b",
        "c",
    ]


@pytest.mark.slow  # waits out its limit: 12 s, mostly idle
def test_a_pair_deaf_to_sigterm_is_killed_and_gc_collects_its_staging_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend stuck where SIGTERM cannot reach it (blocked, as in native code that
    never returns) is killed with SIGKILL after the grace; ``--workers 1`` with a limit
    runs the pair in one worker process (inline it could not be stopped). Its staging
    file stays, unpublished, and gc removes it (its lock died with the process)."""
    import ptestore.fleet.pool

    monkeypatch.setattr(ptestore.fleet.pool, "STOP_GRACE", 0.5)
    job = _job(tmp_path, '[devices.hard]\nsoc = "x"\nhang = "hard"\n')
    # The limit counts from the pair's start on its worker, which first imports and
    # checks the backend: it must reach the backend's hang before the limit.
    result = run_job(load_job(job), workers=1, pair_timeout=LIMIT)
    assert result.engine == "1 process" and result.exit_code == 1
    (pair,) = result.pairs
    assert pair.status == "failed"
    assert pair.error is not None and re.fullmatch(
        r"mlp on hard ran for [0-9.]+ s, past --pair-timeout 12 s: its worker process "
        r"[0-9]+ was stopped \(SIGKILL after 0.5 s: it did not end on SIGTERM\); the pair "
        r"is not run again",
        pair.error,
    ), pair.error
    out = tmp_path / "out"
    assert not (out / "hard" / "mlp.pte").exists()
    (left,) = _staging(out)
    collected = collect_local(out, older_than=0)
    assert [(e.location, e.action) for e in collected] == [(left, "removed")]
    assert _staging(out) == []


#: A vendor compiler for the ``command`` backend: for device ``hang`` it starts a
#: grandchild (MARKER in its argv), writes its pid to PIDFILE and never returns; for any
#: other device it keeps its input (empty stdout).
COMPILER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    sys.stdin.buffer.read()
    marker, pidfile = sys.argv[1], sys.argv[2]
    if os.environ["PTESTORE_DEVICE"] == "hang":
        gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
        with open(pidfile + ".tmp", "w") as f:
            f.write("%d %d" % (os.getpid(), gc.pid))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(3600)
    """
)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` ends (waited for on a pidfd; the bound only turns a
    defect into a failure)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 120)[0])
    finally:
        os.close(fd)


@pytest.mark.slow  # waits out its limit: 12 s, mostly idle
def test_a_hung_command_backend_leaves_no_program_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The motivating case: a vendor compiler run by the ``command`` backend never
    returns. SIGTERM to the worker stops the program's whole process group (its own
    children included) before the worker ends: nothing is left running, nothing
    published; the other pair is."""
    import ptestore.backends.command
    import ptestore.fleet.pool

    # A program deaf to SIGTERM: the worker's grace outlasts the backend's, which kills it.
    assert ptestore.fleet.pool.STOP_GRACE > ptestore.backends.command.STOP_GRACE + 1
    # On a busy machine the worker may need longer than the default 5 s to stop its
    # program and end (it did once under two concurrent test runs): what is tested is
    # that SIGTERM ends the program's group, so the grace is an upper bound only.
    monkeypatch.setattr(ptestore.fleet.pool, "STOP_GRACE", 60.0)
    compiler = tmp_path / "compiler.py"
    compiler.write_text(COMPILER)
    marker, pidfile = f"ptestore-test-{uuid.uuid4().hex}", tmp_path / "compiler.pids"
    assert MLP.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["command@XnnpackBackend={sys.executable} {compiler} {marker} {pidfile}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n[devices.hang]\n[devices.a]\n'
    )
    result = run_job(load_job(job), workers=1, pair_timeout=LIMIT)
    assert [(p.device, p.status) for p in result.pairs] == [("hang", "failed"), ("a", "done")]
    assert result.pairs[0].error is not None
    assert result.pairs[0].error.endswith("was stopped (SIGTERM); the pair is not run again")
    program, grandchild = (int(pid) for pid in pidfile.read_text().split())
    assert _gone(program) and _gone(grandchild)
    assert not (tmp_path / "out" / "hang").exists() and _staging(tmp_path / "out") == []


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_limit_that_is_not_seconds_is_refused(tmp_path: Path, value: object) -> None:
    job = load_job(_job(tmp_path, '[devices.a]\nsoc = "x"\n'))
    with pytest.raises(ConfigurationError) as caught:
        run_job(job, pair_timeout=value)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"--pair-timeout must be a finite number of seconds > 0, got {value!r}"
    )
    assert not (tmp_path / "out").exists()  # refused before the preflight


def test_a_limit_on_dask_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dask task cannot be stopped while it runs: refused before anything is read,
    whether the scheduler is given or comes from the environment."""
    job = load_job(_job(tmp_path, '[devices.a]\nsoc = "x"\n'))
    tail = (
        ": a Dask task cannot be stopped while it runs; run the job on the local process "
        "pool (--workers N), or bound the backend itself (the command backend's timeout)"
    )
    with pytest.raises(ConfigurationError) as caught:
        run_job(job, scheduler="tcp://127.0.0.1:1", pair_timeout=30)
    assert str(caught.value) == (
        "--pair-timeout 30 cannot be kept on Dask (--scheduler tcp://127.0.0.1:1)" + tail
    )
    monkeypatch.setenv("PTESTORE_DASK_SCHEDULER", "tcp://127.0.0.1:2")
    with pytest.raises(ConfigurationError) as caught:
        run_job(job, pair_timeout=2.5)
    assert str(caught.value) == (
        "--pair-timeout 2.5 cannot be kept on Dask "
        "($PTESTORE_DASK_SCHEDULER=tcp://127.0.0.1:2)" + tail
    )
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_bad_limit_before_it_reads_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.toml"
    assert main(["fleet", "run", str(missing), "--pair-timeout", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "ptestore fleet: error: --pair-timeout must be a finite number of seconds > 0, got nan"
    )
    dask = ["--pair-timeout", "5", "--scheduler", "tcp://h:1"]
    assert main(["fleet", "run", str(missing), *dask]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "ptestore fleet: error: --pair-timeout 5 cannot be kept on Dask (--scheduler tcp://h:1): "
    )
