"""How long a Dask run waits for a worker: a bound in heartbeats, not a guess in seconds.

Every Dask worker sends the scheduler a heartbeat (every 0.5 s on a cluster of up to 10
workers, longer on larger ones: ``distributed.scheduler.heartbeat_interval``), and the
scheduler records when it last heard from each (``last_seen``). A worker that was
killed, hangs (stopped, swapping, a lost host) or was cut off stops sending them; the
scheduler alone waits ``distributed.scheduler.worker-ttl`` (5 minutes) for such a worker,
and a run whose pairs it held waits with it.

:class:`WorkerWatch` asks the scheduler for its workers while the run waits, and a
worker whose ``last_seen`` has not moved for ``missed`` heartbeat intervals is **lost**:
it is removed from the cluster, so that the scheduler reschedules its tasks on the
others (a pair retried; after ``distributed.scheduler.allowed-failures`` losses Dask
fails it with ``KilledWorker``, and the runner reports the pair failed, naming the lost
workers). When every worker is lost and none joins within the same bound, the pairs
still waiting are failed (:meth:`WorkerWatch.stranded`); so is a pair restricted to some
hosts (one that needs a worker with its device's CPU) once no worker has been on them
for that long (:meth:`WorkerWatch.hosts_gone`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

__all__ = ["MISSED_HEARTBEATS", "WorkerWatch"]

#: How many heartbeat intervals without a heartbeat make a worker lost (10 s on a small
#: cluster): far above a busy worker's jitter, far below the scheduler's 5 minutes.
MISSED_HEARTBEATS = 20


def _heartbeat_interval(workers: int) -> float:
    from distributed.scheduler import heartbeat_interval

    return float(heartbeat_interval(max(workers, 1)))


class WorkerWatch:
    """The liveness of a Dask cluster's workers, by their heartbeats (see the module)."""

    def __init__(self, client: Any, scheduler: str, missed: int = MISSED_HEARTBEATS) -> None:
        self.client = client
        self.scheduler = scheduler
        self.missed = missed
        #: address -> why it was declared lost
        self.lost: dict[str, str] = {}
        self._seen: dict[str, tuple[object, float]] = {}
        self._workers = 0
        self._had_workers = False
        self._empty_since: float | None = None
        self._polled = float("-inf")
        self._started = time.monotonic()
        #: host -> when a worker was last seen there (:meth:`hosts_gone`)
        self._hosts: dict[str, float] = {}

    @property
    def interval(self) -> float:
        """The heartbeat interval of the cluster as it is now (seconds)."""
        return _heartbeat_interval(self._workers)

    @property
    def limit(self) -> float:
        """``missed`` heartbeat intervals (seconds)."""
        return self.missed * self.interval

    def poll(self) -> None:
        """Ask the scheduler for its workers (at most once per heartbeat interval), and
        remove each that missed ``missed`` heartbeats."""
        now = time.monotonic()
        if now - self._polled < self.interval:
            return
        self._polled = now
        workers: dict[str, Any] = self.client.scheduler_info(n_workers=-1).get("workers", {})
        self._workers = len(workers)
        for addr, w in workers.items():
            if addr not in self.lost:
                self._hosts[str(w.get("host") or _host_of(addr))] = now
            last = w.get("last_seen", w.get("last-seen"))
            prev = self._seen.get(addr)
            if prev is None or prev[0] != last:
                self._seen[addr] = (last, now)
            elif now - prev[1] > self.limit and addr not in self.lost:
                self.lost[addr] = (
                    f"Dask worker {addr} sent no heartbeat for {self.missed} heartbeat "
                    f"intervals ({self.limit:g} s) and was removed as lost (killed, hung "
                    "or cut off)"
                )
                self._remove(addr)
        if workers:
            self._had_workers, self._empty_since = True, None
        elif self._had_workers and self._empty_since is None:
            self._empty_since = now

    def _remove(self, addr: str) -> None:
        """Remove ``addr`` from the cluster: the scheduler reschedules what it held."""

        async def remove(dask_scheduler: Any, address: str) -> object:
            # Defined here so that it is pickled by value: the scheduler needs no ptestore.
            return await dask_scheduler.remove_worker(
                address, stimulus_id="ptestore-lost-worker", close=True
            )

        try:
            self.client.run_on_scheduler(remove, address=addr)
        except Exception as exc:  # the scheduler refused: the runner fails its pairs
            self.lost[addr] += f" (the scheduler could not remove it: {exc})"

    def stranded(self) -> str | None:
        """Why the pairs still waiting cannot run (every worker lost, none joined within
        ``missed`` heartbeat intervals), or None."""
        if self._empty_since is None or time.monotonic() - self._empty_since <= self.limit:
            return None
        lost = "; ".join(self.lost.values()) or "they left the cluster"
        return (
            f"every Dask worker of {self.scheduler} was lost and none joined within "
            f"{self.missed} heartbeat intervals ({self.limit:g} s): {lost}"
        )

    def hosts_gone(self, hosts: Iterable[str]) -> bool:
        """Whether no worker has been on any of ``hosts`` for ``missed`` heartbeat
        intervals (counted from the watch's start for a host it never saw)."""
        last = max((self._hosts.get(h, self._started) for h in hosts), default=self._started)
        return time.monotonic() - last > self.limit

    def describe(self) -> str:
        """The lost workers, for the error of a pair that failed (or "")."""
        return "; ".join(self.lost.values())


def _host_of(address: str) -> str:
    from distributed.comm.addressing import get_address_host

    return str(get_address_host(address))
