"""The pairs of a run on a local process pool (:func:`run_pool`): spawned worker
processes, one :func:`~.worker.run_noted_pair` per pair, and what a worker process that
dies does to the pool and to the pairs it held (see :mod:`.runner`)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .worker import WorkerUnfit

if TYPE_CHECKING:
    from .plan import PlannedPair
    from .work import PairResult, PairTask

    _Item = tuple[int, PlannedPair, PairTask]

__all__ = ["POOL_IDLE_BREAKS", "run_pool"]

#: Pool breaks in a row in which no pair had started before the run gives up the pool.
POOL_IDLE_BREAKS = 3


def run_pool(
    todo: Iterable[_Item],
    workers: int,
    done: Callable[[int, PlannedPair, PairResult], None],
    stopped: Callable[[], bool],
) -> None:
    """The pairs on a process pool. A worker process that dies breaks the whole pool
    (every pending future fails): the pairs it had not started are submitted again to a
    new pool, and each pair that had started and not finished runs again alone, in a
    pool of one (it first checks its destination, so one a dead worker published is
    skipped as current); a pair whose worker dies again when it runs alone is failed.
    After :data:`POOL_IDLE_BREAKS` breaks in a row before any pair started, the rest
    fail."""
    pending = list(todo)
    idle = 0
    while pending and not stopped():
        suspects, pending, death = _pool_round(pending, workers, done, stopped)
        if death is None:
            return
        idle = 0 if suspects else idle + 1
        if idle >= POOL_IDLE_BREAKS:
            for i, p, _task in pending:
                why = f"worker processes died {idle} times before any pair started: {death}"
                done(i, p, p.result("failed", why))
            return
        for item in suspects:
            if stopped():
                return
            _, _, again = _pool_round([item], 1, done, stopped)
            if again is not None:
                i, p, _task = item
                why = (
                    "its worker process died while it ran, and again when it ran alone: "
                    f"{again}"
                )
                done(i, p, p.result("failed", why))


def _pool_round(
    items: list[_Item],
    workers: int,
    done: Callable[[int, PlannedPair, PairResult], None],
    stopped: Callable[[], bool],
) -> tuple[list[_Item], list[_Item], str | None]:
    """``items`` on a new pool until it ends or breaks: ``(started, not started, why)``
    of the pairs left unfinished by a break (``why`` None: no break)."""
    from .worker import note_starts

    ctx = multiprocessing.get_context("spawn")
    began = ctx.SimpleQueue()
    pool = cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=note_starts, initargs=(began,)
    )
    try:
        left, death = _drain_pool(pool, items, done, stopped)
    except WorkerUnfit:
        pool.shutdown(wait=True, cancel_futures=True)  # running pairs finish
        raise
    except KeyboardInterrupt:
        # Stop promptly: nothing pending starts, running workers are terminated (a pair
        # killed before its publish leaves no trace; see docs/fleet.md on crashes).
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.terminate()
        raise
    pool.shutdown(wait=True)
    started = set()
    while not began.empty():
        started.add(began.get())
    began.close()
    return (
        [x for x in left if x[0] in started],
        [x for x in left if x[0] not in started],
        death,
    )


def _drain_pool(
    pool: cf.ProcessPoolExecutor,
    items: list[_Item],
    done: Callable[[int, PlannedPair, PairResult], None],
    stopped: Callable[[], bool],
) -> tuple[list[_Item], str | None]:
    """Run ``items`` on ``pool``: the items a break left unfinished and why."""
    from .worker import run_noted_pair

    futures = {pool.submit(run_noted_pair, i, task): (i, p, task) for i, p, task in items}
    left: list[_Item] = []
    death: str | None = None
    for fut in cf.as_completed(futures):
        if fut.cancelled():
            continue
        i, p, task = futures[fut]
        try:
            r = fut.result()
        except WorkerUnfit:
            raise
        except cf.process.BrokenProcessPool as exc:  # a worker process died
            left.append((i, p, task))
            death = f"{type(exc).__name__}: {exc}"
            continue
        except Exception as exc:  # the result could not come back
            r = p.result("failed", f"worker process failed: {type(exc).__name__}: {exc}")
        done(i, p, r)
        if stopped():
            for other in futures:
                other.cancel()  # those not started; running ones finish
    left.sort(key=lambda x: x[0])
    return left, death
