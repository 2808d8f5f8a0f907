"""Worker loss on Dask, soaked: a worker killed (SIGKILL) or hung (SIGSTOP: alive, but
silent) at random points of six runs (a new seed each time); each run ends, every pair
done or failed with a clear error, a hung worker is removed after a bounded number of
missed heartbeats (not the scheduler's 5-minute ``worker-ttl``), and a run whose every
worker hangs fails its pairs instead of waiting. The seed of the random points is
printed for a rerun (``PTESTORE_SOAK_SEED``)."""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import distributed
import pytest
from support.fixtures import get_fixture

from ptestore.fleet import PairResult, load_job, run_job
from ptestore.fleet.runner import FleetResult

pytestmark = pytest.mark.slow

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
PAIRS = 8
#: Three kills and three hangs per run: a new seed each run covers other points (CI time
#: is a budget: ten rounds took two minutes).
ROUNDS = 6
#: Heartbeats a worker may miss before the run removes it (3 s on a small cluster).
MISSED = 6
#: A ceiling for one run, far above what a healthy one takes and below the scheduler's
#: own 5-minute wait for a silent worker (which is what a hang used to cost).
CEILING = 120.0


def _job(tmp: Path, name: str) -> Any:
    path = tmp / f"{name}.toml"
    devices = "".join(f'[devices.d{i}]\nsoc = "s{i}"\nscale = {1.0 + i}\n' for i in range(PAIRS))
    path.write_text(
        f'destination = "{tmp}/{name}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return load_job(path)


def _cluster(workers: int) -> distributed.LocalCluster:
    return distributed.LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    )


def _bounded(job: Any, scheduler: str, progress: Any) -> FleetResult:
    """``run_job`` on the cluster, failing the test if it does not end by the ceiling."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = run_job(
                job, scheduler=scheduler, progress=progress, missed_heartbeats=MISSED
            )
        except BaseException as exc:  # reported below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(CEILING)
    if t.is_alive():
        import sys
        import traceback

        frame = sys._current_frames().get(t.ident or 0)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "?"
        pytest.fail(f"the run was still waiting after {CEILING:g} s, in:\n{stack}")
    if "error" in box:
        raise box["error"]
    result: FleetResult = box["result"]
    return result


def _busy_worker(client: distributed.Client, rng: random.Random) -> tuple[str, int, bool]:
    """A worker running a pair now (else any), its pid, and whether it runs one."""
    busy = sorted(a for a, keys in client.processing().items() if keys)
    pids = client.run(os.getpid)
    addr = rng.choice(busy) if busy else rng.choice(sorted(pids))
    return addr, pids[addr], bool(busy)


def _round(
    cluster: distributed.LocalCluster,
    client: distributed.Client,
    job: Any,
    hang: bool,
    at: int,
    rng: random.Random,
    where: str,
) -> None:
    """One run; after ``at`` pairs finished a busy worker is killed or hung."""
    hit: dict[str, Any] = {}
    finished: list[PairResult] = []

    def progress(r: PairResult) -> None:
        finished.append(r)
        if len(finished) == at and not hit:
            addr, pid, busy = _busy_worker(client, rng)
            os.kill(pid, signal.SIGSTOP if hang else signal.SIGKILL)
            hit.update(addr=addr, pid=pid, busy=busy)

    try:
        result = _bounded(job, cluster.scheduler_address, progress)
    finally:
        if hit and hang:  # let the nanny replace the hung process
            os.kill(hit["pid"], signal.SIGKILL)
    assert hit, where
    assert len(result.pairs) == PAIRS and len(finished) == PAIRS, where
    for p in result.pairs:
        # skipped: a lost worker published it before its result could be fetched, and
        # the pair run again elsewhere found it current.
        assert p.status in ("done", "skipped", "failed"), (where, p)
        if p.status == "failed":
            assert p.error and p.error.startswith("Dask task failed: "), (where, p)
            assert "event loop" not in p.error, (where, p)  # the run's own client only
    if hang and hit["busy"]:
        # It held a pair: the run went on only because it removed the worker.
        assert hit["addr"] in result.lost_workers, (where, result.lost_workers)
        assert result.lost_workers[hit["addr"]] == (
            f"Dask worker {hit['addr']} sent no heartbeat for {MISSED} heartbeat "
            f"intervals ({MISSED * 0.5:g} s) and was removed as lost (killed, hung "
            "or cut off)"
        )
        assert f"lost: {result.lost_workers[hit['addr']]}" in result.summary()
    # What failed is done by a rerun; then every pair is current.
    rerun = run_job(job, workers=1)
    assert {p.status for p in rerun.pairs} <= {"done", "skipped"}, where
    assert {p.status for p in run_job(job, workers=1).pairs} == {"skipped"}, where


def test_workers_killed_or_hung_at_random_points(tmp_path: Path) -> None:
    seed = int(os.environ.get("PTESTORE_SOAK_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"PTESTORE_SOAK_SEED={seed}")
    rng = random.Random(seed)
    for round_ in range(ROUNDS):
        hang = round_ % 2 == 1
        at = rng.randrange(1, PAIRS - 1)  # after this many pairs finished
        where = f"round {round_} (seed {seed}, {'hang' if hang else 'kill'} after {at})"
        with _cluster(2) as cluster, distributed.Client(cluster) as client:
            _round(cluster, client, _job(tmp_path, f"r{round_}"), hang, at, rng, where)


def test_a_run_whose_every_worker_hangs_fails_its_pairs(tmp_path: Path) -> None:
    c = _cluster(1)
    stopped: list[int] = []
    try:
        with distributed.Client(c) as client:
            (pid,) = client.run(os.getpid).values()

            def progress(r: PairResult) -> None:
                if not stopped:
                    os.kill(pid, signal.SIGSTOP)  # the only worker, mid-run
                    stopped.append(pid)

            result = _bounded(_job(tmp_path, "all"), c.scheduler_address, progress)
    finally:
        for p in stopped:
            os.kill(p, signal.SIGKILL)
        c.close()
    assert stopped and len(result.lost_workers) == 1
    failed = [p for p in result.pairs if p.status == "failed"]
    assert failed, result.pairs
    (lost,) = result.lost_workers.values()
    for p in failed:
        assert p.error is not None
        assert p.error == (
            f"every Dask worker of {c.scheduler_address} was lost and none joined within "
            f"{MISSED} heartbeat intervals ({MISSED * 0.5:g} s): {lost}"
        ) or p.error.startswith("Dask task failed: "), p
    assert any(p.error and p.error.startswith("every Dask worker of ") for p in failed)
