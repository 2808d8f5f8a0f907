"""Running a planned job's pairs on Dask distributed (:func:`run_dask`), one task per
pair; ``dask[distributed]`` is imported only here (``ptestore[fleet]``). See
:mod:`.runner` for what the run guarantees and :mod:`.watch` for how long it waits for
a silent worker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .worker import WorkerUnfit, run_pair_as

if TYPE_CHECKING:
    from .plan import PlannedPair
    from .work import PairResult, PairTask

__all__ = ["connect", "packer_hosts", "run_dask"]


def packer_hosts(client: Any, job_path: str, tasks: list[PairTask]) -> dict[str, list[str]]:
    """For every CPU fingerprint the ``tasks`` ask packed-weight files for, the hosts of
    the cluster's workers with that CPU and the ExecuTorch runtime (each worker asked,
    :func:`~.packing.worker_cpu`); a :class:`~.job.JobError` before any pair runs when a
    fingerprint has none (:func:`~.packing.check_packers`)."""
    wanted = [(t.device.name, t.xnnpack_cpu) for t in tasks if t.xnnpack_cpu is not None]
    if not wanted:
        return {}
    from distributed.comm.addressing import get_address_host

    from .packing import check_packers, worker_cpu

    have = client.run(worker_cpu)
    able = check_packers(job_path, wanted, have)
    return {cpu: sorted({get_address_host(a) for a in addrs}) for cpu, addrs in able.items()}


def connect(scheduler: str, connect_timeout: float) -> Any:
    """A client of the Dask scheduler at ``scheduler``; a
    :class:`~ptestore.errors.ConfigurationError` when Dask distributed is not installed
    or the scheduler cannot be reached within ``connect_timeout`` seconds. The caller
    closes it."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise ConfigurationError(
            f"--scheduler {scheduler}: Dask distributed is not installed: install "
            f"ptestore[fleet] ({exc})"
        ) from exc
    try:
        return Client(scheduler, timeout=connect_timeout)  # type: ignore[no-untyped-call]
    except OSError as exc:
        raise ConfigurationError(
            f"--scheduler {scheduler}: cannot reach the Dask scheduler within "
            f"{connect_timeout:g} s: {exc}"
        ) from exc


def run_dask(
    todo: list[tuple[int, PlannedPair, PairTask]],
    client: Any,
    scheduler: str,
    done: Callable[[int, PlannedPair, PairResult], None],
    stopped: Callable[[], bool],
    missed_heartbeats: int,
    lost: dict[str, str],
    hosts: dict[str, list[str]],
) -> None:
    """Run ``todo`` on the Dask cluster of ``client`` (:func:`connect`: the caller
    closes it), one task per pair (see :mod:`.runner`); ``done`` gets each result. A
    pair whose device asks for XNNPACK's packed-weight file runs only on the ``hosts``
    of workers with its CPU (:func:`packer_hosts`, asked before the run: every
    fingerprint of ``todo`` is there)."""
    from .. import _log

    command = _log.COMMAND  # the workers' records in the command's form
    run_id = uuid.uuid4().hex[:8]
    futures: dict[Any, tuple[int, PlannedPair]] = {}
    restricted: dict[Any, tuple[str, list[str]]] = {}
    try:
        for i, p, task in todo:
            key = f"ptestore-pair-{run_id}-{i}-{task.model}-{task.device.name}"
            where: dict[str, Any] = {}
            if task.xnnpack_cpu is not None:
                where = {"workers": hosts[task.xnnpack_cpu], "allow_other_workers": False}
            fut = client.submit(run_pair_as, command, task, key=key, pure=False, **where)
            futures[fut] = (i, p)
            if task.xnnpack_cpu is not None:
                restricted[fut] = (task.xnnpack_cpu, hosts[task.xnnpack_cpu])
        # distributed.wait() waits through the *current* client: inside a caller's own
        # ``with Client(...)`` that is the caller's, whose event loop then owns the
        # futures' events, and a result lost with a worker is awaited on this client's
        # loop: "Event ... is bound to a different event loop". This run's, always.
        with client.as_current():
            _drain_dask(
                client, futures, scheduler, done, stopped, missed_heartbeats, lost, restricted
            )
    except KeyboardInterrupt:
        client.cancel([f for f in futures if not f.done()])
        raise


def _drain_dask(
    client: Any,
    futures: dict[Any, tuple[int, PlannedPair]],
    scheduler: str,
    done: Callable[[int, PlannedPair, PairResult], None],
    stopped: Callable[[], bool],
    missed_heartbeats: int,
    lost: dict[str, str],
    restricted: dict[Any, tuple[str, list[str]]],
) -> None:
    """Wait for the pairs' tasks, one heartbeat interval at a time: a worker that stops
    sending heartbeats is removed (its pairs rescheduled), and pairs no worker is left
    to run are failed (see :mod:`.watch`): also a pair ``restricted`` to the hosts of the
    workers with its device's CPU (``future -> (CPU, hosts)``) once none is there."""
    import asyncio

    from distributed import wait

    from .watch import WorkerWatch

    watch = WorkerWatch(client, scheduler, missed_heartbeats)
    watch.lost = lost  # the run's result reports them
    pending = set(futures)
    while pending:
        try:
            finished, pending = wait(  # type: ignore[no-untyped-call]
                pending, timeout=watch.interval, return_when="FIRST_COMPLETED"
            )
        except (TimeoutError, asyncio.TimeoutError):
            finished = set()
        for fut in sorted(finished, key=lambda f: futures[f][0]):
            i, p = futures[fut]
            try:
                # Its result is on the worker that ran it, which may hang now: fetched
                # a heartbeat interval at a time (a lost worker's is computed again).
                r = fut.result(timeout=watch.interval)
            except (TimeoutError, asyncio.TimeoutError):
                pending.add(fut)
                continue
            except WorkerUnfit:
                client.cancel([f for f in futures if not f.done()])
                raise
            except Exception as exc:  # KilledWorker after too many worker losses, ...
                why_lost = watch.describe()
                r = p.lost(
                    f"Dask task failed: {type(exc).__name__}: {exc}"
                    + (f" (lost workers: {why_lost})" if why_lost else ""),
                )
            done(i, p, r)
            if stopped():
                client.cancel([f for f in futures if not f.done()])
                return
        watch.poll()
        why = watch.stranded()
        if why is not None and pending:
            client.cancel(list(pending))
            for fut in sorted(pending, key=lambda f: futures[f][0]):
                i, p = futures[fut]
                done(i, p, p.lost(why))
            return
        gone = [f for f in pending if f in restricted and watch.hosts_gone(restricted[f][1])]
        for fut in sorted(gone, key=lambda f: futures[f][0]):
            pending.discard(fut)
            client.cancel([fut])
            cpu, hosts = restricted[fut]
            i, p = futures[fut]
            done(
                i,
                p,
                p.lost(
                    f"no Dask worker of {scheduler} is left on {', '.join(hosts)} (the hosts "
                    f"with the CPU {cpu!r}) and none joined there within {watch.missed} "
                    f"heartbeat intervals ({watch.limit:g} s): its XNNPACK packed-weight "
                    "file is made nowhere else",
                ),
            )
