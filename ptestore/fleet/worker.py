"""What a pool or Dask worker process runs for each pair: the job's backends checked
once per process (one that does not load there ends the whole run with one error), then
:func:`~.work.run_pair`."""

from __future__ import annotations

import os
from typing import Any

from ..errors import PteStoreError
from .work import PairResult, PairTask, run_pair

__all__ = ["WorkerUnfit", "note_starts", "run_noted_pair", "run_pair_on_worker"]


class WorkerUnfit(Exception):
    """A worker process cannot run any pair of the job (a backend does not load there)."""


#: The worker's preflight, once per process and list of backends: None or the error.
_worker_checks: dict[tuple[str, ...], str | None] = {}
#: Where a pool worker says which pair it starts (:func:`note_starts`), or None.
_started: Any = None


def note_starts(queue: Any) -> None:
    """A pool worker's initializer: :func:`run_noted_pair` puts the number of each pair
    it starts on ``queue`` (a ``SimpleQueue``: written at once, so a worker that dies
    right after has still said it), so that the runner knows which pairs a pool that
    broke had started (:mod:`.runner`)."""
    global _started
    _started = queue


def run_noted_pair(number: int, task: PairTask) -> PairResult:
    """:func:`run_pair_on_worker`, after saying that pair ``number`` starts."""
    if _started is not None:
        _started.put(number)
    return run_pair_on_worker(task)


def run_pair_on_worker(task: PairTask) -> PairResult:
    """:func:`~.work.run_pair` on a pool or Dask worker, after checking (once per process)
    that every backend of the job loads here; raises :class:`WorkerUnfit` if one does
    not, which the runner turns into one job-wide error."""
    if task.backends not in _worker_checks:
        from ..backends.registry import load_backend

        error = None
        for spec in task.backends:
            try:
                load_backend(spec)
            except PteStoreError as exc:
                import socket

                error = f"on worker process {os.getpid()} of {socket.gethostname()}: {exc}"
                break
        _worker_checks[task.backends] = error
    error = _worker_checks[task.backends]
    if error is not None:
        raise WorkerUnfit(error)
    return run_pair(task)
