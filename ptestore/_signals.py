"""SIGTERM and SIGHUP handled as Ctrl-C is handled.

A service manager stops a process with SIGTERM, a closed terminal sends SIGHUP; by
default both end the process at once, like SIGKILL: a staging file stays, and on S3
pending multipart uploads (billed) stay until gc. Inside :func:`termination_as_interrupt`
both raise :class:`Terminated`, a :class:`KeyboardInterrupt`, in the main thread, so
they take exactly the path an interrupt takes: writers discard their staging (or report
what was published, or that the publish is uncertain), and the CLI prints its
``interrupted`` message and exits with status 130.

Wiring: the ``ptestore`` command line enters it in :func:`ptestore.cli.main` and in
every publishing sub-command (``guarded(..., publishes=True)``: ``specialize``,
``fleet run``, and any command added later with that decorator, such as ``ensure`` or
``fetch``). Library callers who want the same can wrap their own calls::

    from ptestore._signals import termination_as_interrupt

    with termination_as_interrupt():
        ptestore.specialize(src, dst)

Only the process and thread that entered it are affected: a forked worker or another
thread gets the previous behaviour (the handler re-delivers the signal with the
default action in any other process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["SIGNALS", "Terminated", "termination_as_interrupt"]

#: The signals handled as Ctrl-C.
SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s
)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: raised where Ctrl-C's KeyboardInterrupt would be."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


_depth = 0
_lock = threading.Lock()


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` in this thread (the
    main thread; elsewhere this does nothing). Re-entrant; the previous handlers are
    restored on exit."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:  # a forked child: behave as if we were not installed
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(signum)

    with _lock:
        _depth += 1
        outer = _depth == 1
    previous: dict[signal.Signals, Any] = {}
    if outer:
        for s in SIGNALS:
            previous[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        if outer:
            for s, h in previous.items():
                signal.signal(s, h)
        with _lock:
            _depth -= 1
