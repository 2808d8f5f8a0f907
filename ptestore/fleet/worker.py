"""What a pool or Dask worker process runs for each pair: the job's backends checked
once per process (one that does not load there ends the whole run with one error), then
:func:`~.work.run_pair`."""

from __future__ import annotations

import os
import time
from types import FrameType
from typing import Any

from .._signals import Terminated
from ..errors import PteStoreError
from .work import PairResult, PairTask, run_pair

__all__ = ["WorkerUnfit", "note_starts", "run_noted_pair", "run_pair_as", "run_pair_on_worker"]


class WorkerUnfit(Exception):
    """A worker process cannot run any pair of the job (a backend does not load there)."""


#: The worker's preflight, once per process and list of backends: None or the error.
_worker_checks: dict[tuple[str, ...], str | None] = {}
#: Where a pool worker says which pair it starts (:func:`note_starts`), or None.
_started: Any = None
#: What a pool worker does on SIGTERM: ``"idle"`` end at once (the default action),
#: ``"pair"`` raise :class:`Terminated` in the pair, ``"stopping"`` nothing (it already
#: did: the pair is cleaning up).
_on_term = "idle"


def note_starts(queue: Any, command: str | None = None) -> None:
    """A pool worker's initializer: :func:`run_noted_pair` puts ``(number, pid, start)``
    of each pair it starts on ``queue`` (a ``SimpleQueue``: written at once, so a worker
    that dies right after has still said it; ``start`` is ``time.monotonic()``, one clock
    for every process of this machine), so that the runner knows which pairs a pool that
    broke had started, and for how long a pair has run (:mod:`.pool`).

    SIGTERM (the runner stopping a pair that ran too long, or a broken pool ending its
    workers) raises :class:`~ptestore._signals.Terminated` in a running pair, as Ctrl-C
    would: its writers discard (a staging file removed, a multipart upload aborted) and
    a command backend stops its program's process group; then the process ends. Outside
    a pair it ends the process at once, as by default.

    ``command``: the command line's command the pool runs for (``"fleet"``), None for a
    library caller: the worker's records are then escaped and printed in its form, as
    the command's own process prints them (:mod:`ptestore._log`)."""
    import signal

    global _started
    _started = queue
    signal.signal(signal.SIGTERM, _sigterm)
    if command is not None:
        from .._log import command_started

        command_started(command)  # for the life of the worker


def _sigterm(signum: int, frame: FrameType | None) -> None:
    global _on_term
    if _on_term == "pair":
        _on_term = "stopping"
        raise Terminated(signum)
    if _on_term == "idle":
        import signal

        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def run_noted_pair(number: int, task: PairTask) -> PairResult:
    """:func:`run_pair_on_worker`, after saying that pair ``number`` starts; a SIGTERM
    while it runs ends the process once the pair has cleaned up (:func:`note_starts`)."""
    global _on_term
    if _started is not None:
        _started.put((number, os.getpid(), time.monotonic()))
        _on_term = "pair"
    try:
        return run_pair_on_worker(task)
    except Terminated as stop:
        os._exit(128 + stop.signum)  # as a shell reports a signal's end; the pool breaks
    finally:
        _on_term = "idle"


def run_pair_as(command: str | None, task: PairTask) -> PairResult:
    """:func:`run_pair_on_worker` on a Dask worker for the command line's ``command``
    (None: a library caller): its records printed in that command's form meanwhile."""
    if command is None:
        return run_pair_on_worker(task)
    from .._log import command_ended, command_started

    token = command_started(command)
    try:
        return run_pair_on_worker(task)
    finally:
        command_ended(token)


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
