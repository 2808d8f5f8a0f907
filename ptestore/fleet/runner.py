"""Running a planned job: inline, on a local process pool, or on Dask distributed.

Each pair that must run is one call of :func:`~ptestore.fleet.work.run_pair`:

- ``workers=1``: in this process, one after the other;
- ``workers=N``: a :class:`concurrent.futures.ProcessPoolExecutor` (spawned processes);
  a worker process that dies breaks the pool: the pairs not started run on a new one,
  those it broke while running run again alone, and only a pair that dies again alone
  fails (:mod:`.pool`). With ``pair_timeout`` a pair that runs longer is failed and its
  worker process stopped (SIGTERM, then SIGKILL), and ``workers=1`` runs the pairs on
  a pool of one (a pair inline could not be stopped);
- ``scheduler="tcp://host:port"`` (or ``PTESTORE_DASK_SCHEDULER``): one Dask task per
  pair on that cluster. Dask reschedules the tasks of a worker that dies (up to the
  scheduler's ``distributed.scheduler.allowed-failures``); a pair that still cannot run
  is reported failed. A worker that stops sending heartbeats (killed, hung, cut off) is
  removed after ``missed_heartbeats`` of them, not after the scheduler's 5 minutes, and
  pairs no worker is left to run fail (:mod:`.watch`). ``dask[distributed]`` is
  imported only here (``ptestore[fleet]``). ``pair_timeout`` is refused there: a
  running task cannot be stopped.

A pool or Dask worker checks, once per process, that every backend of the job loads
there (:func:`run_pair_on_worker`): one that does not ends the whole run with one
:class:`~.job.JobError` (exit 2), not one failure per pair.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from .._dataclass import dataclass, field
from .._log import get_logger
from ..errors import ConfigurationError
from .estimate import human_bytes
from .index_store import shards_line
from .job import Job, JobError
from .plan import Plan, PlannedPair, plan_job
from .pool import run_pool
from .watch import MISSED_HEARTBEATS
from .work import PairResult, PairTask, run_pair
from .worker import WorkerUnfit, run_pair_on_worker

log = get_logger(__name__)

__all__ = [
    "SCHEDULER_ENV",
    "FleetResult",
    "WorkerUnfit",
    "check_pair_timeout",
    "run_job",
    "run_pair_on_worker",
    "run_plan",
]

SCHEDULER_ENV = "PTESTORE_DASK_SCHEDULER"

Progress = Callable[[PairResult], None]


@dataclass
class FleetResult:
    """Every pair's result, in job order, and the totals."""

    pairs: list[PairResult]
    seconds: float = 0.0
    engine: str = "inline"
    #: URL of the index the run published (None when nothing is indexed).
    index: str | None = None
    #: Why the index could not be published (the run's artifacts are unaffected), or,
    #: with ``index`` set, why some pairs were not indexed (:func:`.index.index_entries`),
    #: or some models' entries not published: the messages of ``index_errors``, joined.
    index_error: str | None = None
    #: Each reason pairs were left out of the index, ``{"model", "device", "index",
    #: "error"}``: a pair whose artifact names another device or whose trailer cannot be
    #: read, a model whose entries could not be published (``device`` null; the other
    #: models' were), or the index itself (``model`` null too) (:func:`.index.publish_pairs`).
    index_errors: list[dict[str, Any]] = field(default_factory=list)
    #: What publishing the index did: its version, each shard touched with its
    #: compare-and-swap attempts and conflicts (``IndexReport.to_dict``).
    index_shards: dict[str, Any] | None = None
    #: Dask workers the run declared lost (no heartbeat for ``missed_heartbeats``
    #: intervals) and removed from the cluster: address -> why.
    lost_workers: dict[str, str] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for p in self.pairs if p.status == status)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.pairs)

    @property
    def exit_code(self) -> int:
        """0 when every pair is done or skipped and indexed; 1 when any failed, or when
        a pair done or skipped was left out of the index (``index_error``: the index
        could not be published, or a destination's trailer names another pair)."""
        return 1 if self.count("failed") or self.index_error is not None else 0

    def to_json(self) -> dict[str, Any]:
        """The ``fleet run --json`` object."""
        return {
            "done": self.count("done"),
            "skipped": self.count("skipped"),
            "failed": self.count("failed"),
            "index": self.index,
            "index_error": self.index_error,
            "index_errors": [dict(e) for e in self.index_errors],
            "index_shards": self.index_shards,
            "lost_workers": dict(self.lost_workers),
            "pairs": [p.to_dict() for p in self.pairs],
        }

    def summary(self) -> str:
        """The summary table (and one line per failed pair)."""
        rows = [
            ("done", str(self.count("done"))),
            ("skipped", str(self.count("skipped"))),
            ("failed", str(self.count("failed"))),
            ("bytes through the client", human_bytes(self.bytes)),
            ("time", f"{self.seconds:.2f} s ({self.engine})"),
        ]
        if self.index is not None:
            rows.append(("index", self.index))
        if self.index_shards is not None:
            rows.append(("index shards", shards_line(self.index_shards)))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        for p in self.pairs:
            if p.status == "failed":
                lines.append(f"failed: {p.model} on {p.device} -> {p.destination}: {p.error}")
            elif p.xnnpack is not None and "refused" in p.xnnpack:
                lines.append(f"xnnpack: {p.model} on {p.device}: {p.xnnpack}")
            if p.unspecialized is not None:
                lines.append(
                    f"unspecialized: {p.model} on {p.device} -> {p.destination}: published "
                    f"as the portable source, {p.unspecialized}"
                )
        lines += index_lines(self.index, self.index_error, self.index_errors)
        if self.index_shards is not None and self.index_shards.get("superseded"):
            from .index_pins import superseded_line

            lines += [f"superseded: {superseded_line(s)}" for s in self.index_shards["superseded"]]
        lines += [f"lost: {why}" for why in self.lost_workers.values()]
        return "\n".join(lines)


def index_lines(index: str | None, error: str | None, errors: list[dict[str, Any]]) -> list[str]:
    """The summary's lines of what was left out of the index (``FleetResult``'s
    ``index``, ``index_error`` and ``index_errors``): one per reason."""
    if not errors:  # a result made without them: its one message
        if error is None:
            return []
        return [f"{'index not published' if index is None else 'not indexed'}: {error}"]
    out = []
    for e in errors:
        if e["model"] is None:
            out.append(f"index not published: {e['error']}")
        elif e["device"] is None:
            out.append(f"index not published for model {e['model']}: {e['error']}")
        else:
            out.append(f"not indexed: {e['error']}")
    return out


class FleetInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; ``result`` has every pair that finished (the others are
    reported failed, ``interrupted``), and the index holds the published ones."""

    def __init__(self, result: FleetResult) -> None:
        done = [p for p in result.pairs if p.status == "done"]
        names = ", ".join(f"{p.model} on {p.device}" for p in done)
        super().__init__(
            f"after {len(done)} pair(s) were published ({names})"
            if done
            else "before any pair was published"
        )
        self.result = result

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross processes: the result rebuilds it (and its message).
        return (type(self), (self.result,))


def run_job(
    job: Job,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 30.0,
    fail_fast: bool = False,
    missed_heartbeats: int = MISSED_HEARTBEATS,
    pair_timeout: float | None = None,
) -> FleetResult:
    """Preflight and plan ``job``, then run every pair that is not current (see
    :func:`run_plan` and :func:`~.preflight.preflight`). As for :func:`run_plan`, a
    script that calls it guards its entry point with ``if __name__ == "__main__":``."""
    from .preflight import preflight

    check_pair_timeout(pair_timeout, scheduler)
    preflight(job, write=True)
    return run_plan(
        plan_job(job),
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        connect_timeout=connect_timeout,
        fail_fast=fail_fast,
        missed_heartbeats=missed_heartbeats,
        pair_timeout=pair_timeout,
    )


def check_pair_timeout(pair_timeout: object, scheduler: str | None = None) -> None:
    """Refuse a ``pair_timeout`` (``--pair-timeout``) that is not None nor a finite
    number of seconds > 0, and one for a run on Dask (``scheduler``, or
    ``$PTESTORE_DASK_SCHEDULER``): a Dask task cannot be stopped while it runs."""
    if pair_timeout is None:
        return
    if (
        isinstance(pair_timeout, bool)
        or not isinstance(pair_timeout, (int, float))
        or not math.isfinite(pair_timeout)
        or pair_timeout <= 0
    ):
        raise ConfigurationError(
            f"--pair-timeout must be a finite number of seconds > 0, got {pair_timeout!r}"
        )
    where = scheduler or os.environ.get(SCHEDULER_ENV)
    if where:
        origin = f"--scheduler {where}" if scheduler else f"${SCHEDULER_ENV}={where}"
        raise ConfigurationError(
            f"--pair-timeout {pair_timeout:g} cannot be kept on Dask ({origin}): a Dask "
            "task cannot be stopped while it runs; run the job on the local process pool "
            "(--workers N), or bound the backend itself (the command backend's timeout)"
        )


def run_plan(
    plan: Plan,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 30.0,
    fail_fast: bool = False,
    missed_heartbeats: int = MISSED_HEARTBEATS,
    pair_timeout: float | None = None,
) -> FleetResult:
    """Run the pairs of ``plan`` marked ``run``; ``progress`` is called once per pair
    (skipped ones first). ``connect_timeout`` bounds the wait for a Dask scheduler;
    ``missed_heartbeats`` how long a run waits for a Dask worker that stopped sending
    heartbeats (then it is removed and its pairs rescheduled; see :mod:`.watch`).
    With ``fail_fast`` the first failed pair stops the run: pairs not started yet are
    reported failed (``not started: ...``). With ``pair_timeout`` (seconds, None: no
    limit; not on Dask: :func:`check_pair_timeout`) the pairs run on the process pool,
    one worker process at least, and a pair that runs longer is failed, its worker
    process stopped (:mod:`.pool`).

    The local pool starts its worker processes with ``spawn``: each imports the main
    module again, so a script that calls this must guard its entry point with
    ``if __name__ == "__main__":`` (unguarded, every worker runs the script again and
    the pool breaks before any pair starts)."""
    check_pair_timeout(pair_timeout, scheduler)
    if workers is not None and workers < 1:
        raise ConfigurationError(f"--workers must be >= 1, got {workers}")
    if isinstance(missed_heartbeats, bool) or not isinstance(missed_heartbeats, int):
        raise ConfigurationError(f"missed_heartbeats must be an int, got {missed_heartbeats!r}")
    if missed_heartbeats < 1:
        raise ConfigurationError(f"missed_heartbeats must be >= 1, got {missed_heartbeats}")
    scheduler = scheduler or os.environ.get(SCHEDULER_ENV) or None
    started = time.perf_counter()
    from ..writers._dirs import remove_empty_tree
    from .preflight import make_root

    # The run makes a local destination root and removes it (and the empty directories
    # its pairs left under it) once they have ended: pair writers running at once, each
    # removing only what it made, left it empty when interrupted.
    made = make_root(plan.job)
    client = None
    try:
        if scheduler:
            from .cluster import connect

            client = connect(scheduler, connect_timeout)
        return _run(
            plan,
            started,
            client,
            scheduler,
            workers,
            progress,
            fail_fast,
            missed_heartbeats,
            pair_timeout,
        )
    finally:
        remove_empty_tree(made)
        if client is not None:
            client.close()


def _run(
    plan: Plan,
    started: float,
    client: Any,
    scheduler: str | None,
    workers: int | None,
    progress: Progress | None,
    fail_fast: bool,
    missed_heartbeats: int,
    pair_timeout: float | None,
) -> FleetResult:
    """:func:`run_plan` once its arguments are checked and its Dask ``client`` (None:
    inline or the process pool) connected. What refuses the whole run (no worker with a
    device's CPU) does so before any hold is written: a refused run holds nothing."""
    from .reuse import hold_reused

    hosts = _packers(plan, [p for p in plan.pairs if p.action == "run"], client)

    def unable(p: PlannedPair) -> str | None:
        """Why this run cannot make ``p`` again (a skipped pair whose object is gone
        since the plan), or None: only its device's CPU can be missing."""
        cpu = p.pair.xnnpack_cpu
        if cpu is None or cpu in hosts:
            return None
        try:
            hosts.update(_packers(plan, [p], client))
        except JobError as exc:
            return str(exc)
        return None

    hold_reused(plan, unable)  # what the skipped pairs reuse, kept from gc until indexed
    results: dict[int, PairResult] = {}
    todo: list[tuple[int, PlannedPair, PairTask]] = []
    for i, p in enumerate(plan.pairs):
        if p.action == "skip":
            results[i] = p.result("skipped")
        elif p.action == "fail" or p.task is None:
            results[i] = p.result("failed", p.reason)
        else:
            todo.append((i, p, p.task))
        if i in results and progress is not None:
            progress(results[i])

    stop: list[str] = []  # set once a pair failed with fail_fast

    def done(i: int, p: PlannedPair, r: PairResult) -> None:
        r.bytes += p.bytes
        results[i] = r
        # Once this line is logged (``-v``), an interrupt reports the pair as it is here.
        log.info("pair %s on %s: %s", r.model, r.device, r.status)
        if fail_fast and r.status == "failed" and not stop:
            stop.append(f"{r.model} on {r.device}")
        if progress is not None:
            progress(r)

    def stopped() -> bool:
        return bool(stop)

    n = workers or min(len(todo), os.cpu_count() or 1) or 1
    inline = n == 1 and pair_timeout is None  # a pair inline cannot be stopped
    processes = f"{n} process" + ("es" if n > 1 else "")
    engine = f"dask {scheduler}" if scheduler else ("inline" if inline else processes)
    interrupted = False
    lost: dict[str, str] = {}
    try:
        if scheduler:
            from .cluster import run_dask

            run_dask(todo, client, scheduler, done, stopped, missed_heartbeats, lost, hosts)
        elif inline:
            for i, p, task in todo:
                if stopped():
                    break
                done(i, p, run_pair(task))
        else:
            run_pool(todo, n, done, stopped, pair_timeout)
    except KeyboardInterrupt:
        interrupted = True  # the pool and Dask tasks are cancelled: report what finished
    except WorkerUnfit as exc:  # the pool and Dask tasks are cancelled
        raise JobError(f"{plan.job.path}: backends: {exc}") from None
    for i, p, _task in todo:
        if i not in results:
            why = (
                "interrupted before it finished"
                if interrupted
                else f"not started: --fail-fast after {stop[0]} failed"
            )
            results[i] = p.result("failed", why)
    result = FleetResult(
        [results[i] for i in range(len(plan.pairs))],
        time.perf_counter() - started,
        engine,
        lost_workers=lost,
    )
    from .index import publish_pairs

    ok = [(p.model, p.device) for p in result.pairs if p.status in ("done", "skipped")]
    result.index, result.index_error, report = publish_pairs(plan.job, ok, result.index_errors)
    result.index_shards = None if report is None else report.to_dict()
    if interrupted:
        raise FleetInterrupted(result)
    return result


def _packers(plan: Plan, pairs: list[PlannedPair], client: Any) -> dict[str, list[str]]:
    """For every CPU fingerprint ``pairs`` ask packed-weight files for, where they are
    made: on Dask (``client``) the hosts of the workers with that CPU and the ExecuTorch
    runtime (:func:`~.cluster.packer_hosts`), inline and on the process pool this
    machine; a :class:`JobError` when a fingerprint has none
    (:func:`~.packing.check_packers`)."""
    if client is not None:
        from .cluster import packer_hosts

        return packer_hosts(client, plan.job.path, [p.task for p in pairs if p.task])
    wanted = [
        (p.pair.device.name, p.pair.xnnpack_cpu) for p in pairs if p.pair.xnnpack_cpu is not None
    ]
    if not wanted:
        return {}
    import socket

    from .packing import check_packers, worker_cpu

    here = f"this machine ({socket.gethostname()})"
    return check_packers(plan.job.path, wanted, {here: worker_cpu()})
