"""The pairs of a run on a local process pool (:func:`run_pool`): spawned worker
processes, one :func:`~.worker.run_noted_pair` per pair, what a worker process that dies
does to the pool and to the pairs it held, and the pairs that run longer than the run's
``pair_timeout`` (their worker process stopped, :class:`_Watch`). See :mod:`.runner`."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .worker import WorkerUnfit

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from .plan import PlannedPair
    from .work import PairResult, PairTask

    _Item = tuple[int, PlannedPair, PairTask]
    _Done = Callable[[int, PlannedPair, PairResult], None]

__all__ = ["POOL_IDLE_BREAKS", "STOP_GRACE", "run_pool", "stop_processes"]

#: Pool breaks in a row in which no pair had started before the run gives up the pool.
POOL_IDLE_BREAKS = 3
#: Seconds a worker process has to end after SIGTERM (its pair's writers discard, a
#: command backend stops its program) before it is killed (SIGKILL): longer than the
#: command backend's own grace for its program (``backends.command.STOP_GRACE``), so
#: that a program deaf to SIGTERM is killed by the worker, never left running.
STOP_GRACE = 5.0


def run_pool(
    todo: Iterable[_Item],
    workers: int,
    done: _Done,
    stopped: Callable[[], bool],
    limit: float | None = None,
) -> None:
    """The pairs on a process pool. A worker process that dies breaks the whole pool
    (every pending future fails): the pairs it had not started are submitted again to a
    new pool, and each pair that had started and not finished runs again alone, in a
    pool of one (it first checks its destination, so one a dead worker published is
    skipped as current); a pair whose worker dies again when it runs alone is failed.
    After :data:`POOL_IDLE_BREAKS` breaks in a row before any pair started, the rest
    fail. A pair that runs longer than ``limit`` seconds (None: no limit) is failed and
    its worker process stopped (:class:`_Watch`): the pool breaks, and the pair is not
    run again (the others the break stopped are, alone)."""
    pending = list(todo)
    idle = 0
    while pending and not stopped():
        suspects, pending, death, began = _pool_round(pending, workers, done, stopped, limit)
        if death is None:
            return
        idle = 0 if began else idle + 1
        if idle >= POOL_IDLE_BREAKS:
            for i, p, _task in pending:
                why = f"worker processes died {idle} times before any pair started: {death}"
                why += _spawn_hint()
                done(i, p, p.lost(why))
            return
        for item in suspects:
            if stopped():
                return
            started, waiting, again, _ = _pool_round([item], 1, done, stopped, limit)
            if again is not None and (started or waiting):  # not: failed as timed out
                i, p, _task = item
                why = f"its worker process died while it ran, and again when it ran alone: {again}"
                done(i, p, p.lost(why))


def _spawn_hint() -> str:
    """What a pool that broke before any pair started most often means when the main
    module is a script: each spawned worker imports it again, and one without the
    ``__main__`` guard runs the whole run again there (whether it has one cannot be
    told from here: said whenever the main module is a file)."""
    import sys

    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) is None:
        return ""
    return (
        " (run_plan starts its workers with spawn: a script must guard its entry point "
        "with `if __name__ == '__main__':`)"
    )


def _pool_round(
    items: list[_Item],
    workers: int,
    done: _Done,
    stopped: Callable[[], bool],
    limit: float | None,
) -> tuple[list[_Item], list[_Item], str | None, bool]:
    """``items`` on a new pool until it ends or breaks: ``(started, not started, why,
    began)``: the pairs left unfinished by a break, why it broke (None: no break), and
    whether any pair started on it."""
    from .. import _log
    from .worker import note_starts

    ctx = multiprocessing.get_context("spawn")
    began = ctx.SimpleQueue()
    pool = cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=note_starts,
        initargs=(began, _log.COMMAND),  # the workers' records in the command's form
    )
    watch = _Watch(pool, began, limit)
    try:
        left, death = _drain_pool(pool, items, done, stopped, watch)
    except WorkerUnfit:
        pool.shutdown(wait=True, cancel_futures=True)  # running pairs finish
        raise
    except KeyboardInterrupt:
        # Stop promptly: nothing pending starts, running workers are stopped (a pair
        # stopped before its publish leaves no trace; see docs/fleet.md on crashes).
        processes = watch.processes()
        pool.shutdown(wait=False, cancel_futures=True)
        stop_processes(processes)
        raise
    if death is not None:
        # The broken pool terminated its workers and waits for each to end: one that
        # does not (a call that never returns to Python) is killed, else it would wait
        # forever.
        stop_processes(watch.processes())
    pool.shutdown(wait=True)
    watch.read()
    began.close()
    return (
        [x for x in left if x[0] in watch.starts],
        [x for x in left if x[0] not in watch.starts],
        death,
        bool(watch.starts),
    )


def _drain_pool(
    pool: cf.ProcessPoolExecutor,
    items: list[_Item],
    done: _Done,
    stopped: Callable[[], bool],
    watch: _Watch,
) -> tuple[list[_Item], str | None]:
    """Run ``items`` on ``pool``: the items a break left unfinished and why. With a
    limit, it waits no longer than until the first running pair's end and stops the
    pairs that overran it (:meth:`_Watch.stop_overdue`)."""
    from .worker import run_noted_pair

    futures = {pool.submit(run_noted_pair, i, task): (i, p, task) for i, p, task in items}
    left: list[_Item] = []
    death: str | None = None
    pending = set(futures)
    while pending:
        running = {futures[f][0]: futures[f][1] for f in pending}
        finished, pending = cf.wait(
            pending, timeout=watch.wait_time(running), return_when=cf.FIRST_COMPLETED
        )
        for fut in sorted(finished, key=lambda f: futures[f][0]):
            if fut.cancelled():
                continue
            i, p, task = futures[fut]
            try:
                r = fut.result()
            except WorkerUnfit:
                raise
            except cf.process.BrokenProcessPool as exc:  # a worker process died
                death = f"{type(exc).__name__}: {exc}"
                if i not in watch.timed_out:
                    left.append((i, p, task))
                    continue
                r = watch.failure(p, i)
            except Exception as exc:  # the result could not come back
                r = (
                    watch.failure(p, i)
                    if i in watch.timed_out
                    else p.lost(f"worker process failed: {type(exc).__name__}: {exc}")
                )
            done(i, p, r)
            if stopped():
                for other in futures:
                    other.cancel()  # those not started; running ones finish
        watch.stop_overdue({futures[f][0]: futures[f][1] for f in pending})
    left.sort(key=lambda x: x[0])
    return left, death


class _Watch:
    """The pairs a pool's workers started, each with its worker's pid and the time it
    started (:func:`~.worker.note_starts`), and, with a ``limit``, the pairs that ran
    longer: their worker processes stopped (:func:`stop_processes`), why each failed."""

    def __init__(self, pool: cf.ProcessPoolExecutor, began: Any, limit: float | None) -> None:
        self.pool = pool
        self.began = began
        self.limit = limit
        #: Pair number -> (pid of its worker, ``time.monotonic()`` when it started).
        self.starts: dict[int, tuple[int, float]] = {}
        #: Pair number -> (why it failed, seconds it had run when it was stopped).
        self.timed_out: dict[int, tuple[str, float]] = {}

    def processes(self) -> list[BaseProcess]:
        """The pool's worker processes (private to the pool: read, never changed)."""
        return list((getattr(self.pool, "_processes", None) or {}).values())

    def read(self) -> None:
        """Take in what the workers said since the last read."""
        while not self.began.empty():
            number, pid, start = self.began.get()
            self.starts[number] = (pid, start)

    def wait_time(self, running: dict[int, PlannedPair]) -> float | None:
        """How long to wait for a result: until the first end of a pair in ``running``
        that started, else a whole ``limit`` (a pair that starts meanwhile ends later);
        None without a limit."""
        if self.limit is None:
            return None
        self.read()
        ends = [
            self.starts[i][1] + self.limit
            for i in running
            if i in self.starts and i not in self.timed_out
        ]
        now = time.monotonic()
        return max(0.0, min(ends, default=now + self.limit) - now)

    def stop_overdue(self, running: dict[int, PlannedPair]) -> None:
        """Stop the worker process of each pair in ``running`` that has run for
        ``limit`` seconds or more; the pool then breaks and :meth:`failure` says why."""
        if self.limit is None:
            return
        self.read()
        now = time.monotonic()
        overdue = {
            i: now - self.starts[i][1]
            for i in running
            if i in self.starts
            and i not in self.timed_out
            and now - self.starts[i][1] >= self.limit
        }
        if not overdue:
            return
        by_pid = {proc.pid: proc for proc in self.processes()}
        found = {i: by_pid.get(self.starts[i][0]) for i in overdue}
        ended = stop_processes([proc for proc in found.values() if proc is not None])
        for i, seconds in overdue.items():
            pid = self.starts[i][0]
            pair = running[i].pair
            self.timed_out[i] = (
                f"{pair.model.name} on {pair.device.name} ran for {seconds:.1f} s, past "
                f"--pair-timeout {self.limit:g} s: its worker process {pid} was stopped "
                f"({ended.get(pid, 'it had already ended')}); the pair is not run again",
                seconds,
            )

    def failure(self, p: PlannedPair, i: int) -> PairResult:
        """The result of pair ``i``, stopped for running too long."""
        why, seconds = self.timed_out[i]
        r = p.lost(why)
        r.seconds = seconds
        return r


def stop_processes(processes: Iterable[BaseProcess], grace: float | None = None) -> dict[int, str]:
    """SIGTERM to each process still running, SIGKILL to those not ended ``grace``
    seconds later (:data:`STOP_GRACE`); each one is waited for. Returns pid -> how it
    ended: ``"SIGTERM"`` or ``"SIGKILL after 5 s: ..."``."""
    grace = STOP_GRACE if grace is None else grace
    alive = [proc for proc in processes if proc.exitcode is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + grace
    ended: dict[int, str] = {}
    for proc in alive:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            ended[proc.pid or 0] = f"SIGKILL after {grace:g} s: it did not end on SIGTERM"
        else:
            ended[proc.pid or 0] = "SIGTERM"
    return ended
