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

:func:`signals_held` is the opposite, for a step that must not stop half-way (an
in-place run from its journal's commit to the end of its apply): Ctrl-C, SIGTERM and
SIGHUP are held while inside and delivered on the way out, as they would have been,
with a message saying what was completed; inside :func:`deferred_signals` (``ensure``
recording the file it rewrote), they are delivered when that scope ends instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = [
    "SIGNALS",
    "Terminated",
    "deferred_signals",
    "signals_held",
    "termination_as_interrupt",
]

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


class _Hold:
    """Ctrl-C, SIGTERM and SIGHUP caught and kept (their previous handlers saved)."""

    def __init__(self, message: str) -> None:
        self.held: list[int] = []
        self.message = message
        self.previous = {s: signal.signal(s, self._catch) for s in (signal.SIGINT, *SIGNALS)}

    def _catch(self, signum: int, frame: FrameType | None) -> None:
        self.held.append(signum)

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)

    def deliver(self) -> None:
        """The first signal held, delivered as its previous handler would have taken it
        (a :class:`KeyboardInterrupt` without a message gets :attr:`message`)."""
        if not self.held:
            return
        signum = self.held[0]
        handler = self.previous[signal.Signals(signum)]
        if handler is signal.SIG_IGN:
            return
        if not callable(handler):  # the default action (SIGTERM without our handler)
            os.kill(os.getpid(), signum)
            raise KeyboardInterrupt(self.message)  # SIGINT's default, should the kill return
        try:
            handler(signum, None)
        except KeyboardInterrupt as exc:
            if not exc.args:
                exc.args = (self.message,)
            raise


_hold: _Hold | None = None
_deferring = 0


@contextlib.contextmanager
def signals_held(message: str) -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while inside (in the main thread; elsewhere this
    does nothing), then deliver the first one held as it would have been, a
    :class:`KeyboardInterrupt` saying ``message`` (``while ...``: the CLI prints
    ``interrupted while ...``). When the body raises, the held signal is dropped (the
    error ends the call anyway). Nested, the outermost scope delivers, with the
    innermost message; inside :func:`deferred_signals`, that scope does."""
    global _hold
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = _hold is None
    if _hold is None:
        _hold = _Hold(message)
    hold = _hold
    hold.message = message
    done = False
    try:
        yield
        done = True
    finally:
        if owner and not _deferring:
            _hold = None
            hold.restore()
            if done:
                hold.deliver()


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Signals held by a :func:`signals_held` inside stay held until this scope ends
    (what the body does after that step, recording its result, is not interrupted
    either), and are delivered then, unless the body raised."""
    global _hold, _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    done = False
    try:
        yield
        done = True
    finally:
        _deferring -= 1
        if not _deferring and _hold is not None:
            hold, _hold = _hold, None
            hold.restore()
            if done:
                hold.deliver()
