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
thread gets the previous behaviour (in any other process, the handler puts the previous
handlers back and the signal is taken by them).

The previous handlers are the process's real ones: :func:`signal.signal` knows only
those Python installed (it reports None for a handler native code installed before
Python started, an app hosting Python, and a stale ``SIG_DFL`` for one installed since,
a native library's), so each scope saves the real action with ``sigaction`` (ctypes,
:mod:`ptestore._libc`; not needed, and not imported, where ``/proc/self/status``
confirms what Python says: the command line's SIGTERM and SIGHUP) and puts it back on
the way out, with the signals blocked in this thread while it does. Python's own table
is put back too; where it said None it says ``SIG_DFL`` afterwards (it takes no None),
as it does for a handler native code installed after it started. Where ``struct
sigaction`` cannot be read (not Linux nor macOS, or an unusual layout), a signal whose
handler Python did not install is left alone.

:func:`signals_held` is the opposite, for a step that must not stop half-way (an
in-place run from its journal's commit to the end of its apply): Ctrl-C, SIGTERM and
SIGHUP are held while inside and delivered on the way out, as they would have been,
with a message saying what was completed (a native handler's sent again, to it: the
call then goes on, as it would have); inside :func:`deferred_signals` (``ensure``
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

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross processes (a pool pickles a worker's): the signal rebuilds it.
        return (type(self), (self.signum,))

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


class _Before:
    """What took a signal before ptestore took it over: ``python``, what
    :func:`signal.getsignal` said (None: a handler Python did not install); ``action``,
    the process's real action (:func:`ptestore._libc.get_sigaction`) where Python's table
    does not tell it, else None; ``kind``, how the signal was taken: ``"python"`` (by
    ``python``, a callable), ``"default"`` (its default action), ``"ignore"`` or
    ``"native"`` (a handler native code installed: an app hosting Python, a native
    library)."""

    __slots__ = ("action", "kind", "python")

    def __init__(self, python: Any, action: bytes | None, kind: str) -> None:
        self.python = python
        self.action = action
        self.kind = kind

    def put_back(self, signum: int) -> None:
        """Python's table as it was (``SIG_DFL`` where it said None, which
        :func:`signal.signal` does not take), then the real action where it differs."""
        signal.signal(signum, signal.SIG_DFL if self.python is None else self.python)
        if self.action is not None:
            from . import _libc

            _libc.set_sigaction(signum, self.action)

    def take(self, signum: int, frame: FrameType | None) -> None:
        """``signum`` taken as it would have been (the previous handlers put back)."""
        if self.kind == "ignore":
            return
        if self.kind == "python" and callable(self.python):
            self.python(signum, frame)
            return
        os.kill(os.getpid(), signum)  # its default action, or the native handler


def _plain(python: Any) -> bool:
    """``python`` is the default action or ignored, as Python's table says: native code
    may have installed a handler since (Python's table does not see it)."""
    return python is signal.SIG_DFL or python is signal.SIG_IGN


def _python_tells(signum: int, python: Any, masks: tuple[int, int] | None) -> bool:
    """Whether Python's table is known to say what the process does with ``signum``:
    its default action or ignored, as ``/proc/self/status`` confirms (no ctypes)."""
    if masks is None:
        return False
    ignored, caught = (bool(m >> (signum - 1) & 1) for m in masks)
    if python is signal.SIG_DFL:
        return not ignored and not caught
    return python is signal.SIG_IGN and ignored


def _take(signals: tuple[int, ...], handler: Any) -> dict[int, _Before]:
    """``handler`` installed for ``signals``; what took each before. A signal whose
    handler native code installed is left alone where its action cannot be read (not
    Linux nor macOS): Python could not put it back."""
    from . import _libc

    masks = _libc.signal_masks()
    taken: dict[int, _Before] = {}
    try:
        for s in signals:
            python = signal.getsignal(s)
            tells = _python_tells(s, python, masks)
            action = None if tells else _libc.get_sigaction(s)
            if action is None and (python is None or (_plain(python) and not tells)):
                continue  # native or unknown, and its action unreadable: left alone
            # Recorded first, with the real action where read: a signal arriving as the
            # handler goes in puts back exactly what was. Its kind once Python's own C
            # handler is installed (what tells a Python handler from a native one).
            before = taken[s] = _Before(python, action, "native")
            signal.signal(s, handler)
            before.kind = _kind(python, action, s)
            if action is not None and _agrees(python, before.kind):
                before.action = None  # Python's table puts it back
    except BaseException:
        _put_back(taken)
        raise
    return taken


def _kind(python: Any, action: bytes | None, signum: int) -> str:
    from . import _libc

    if action is None:  # Python's table tells
        if python is signal.SIG_IGN:
            return "ignore"
        return "default" if python is signal.SIG_DFL else "python"
    handler = _libc.action_handler(action)
    if handler in (0, 1):
        return "ignore" if handler else "default"
    ours = _libc.get_sigaction(signum)  # Python's own C handler, installed just now
    return "python" if ours is not None and _libc.action_handler(ours) == handler else "native"


def _agrees(python: Any, kind: str) -> bool:
    """Whether Python's table, put back, also puts back the process's action."""
    if kind == "python":
        return callable(python)
    if kind == "native":
        return False
    return python is (signal.SIG_IGN if kind == "ignore" else signal.SIG_DFL)


def _put_back(taken: dict[int, _Before]) -> None:
    """Every signal's previous handler put back, even when one cannot be (the first
    error raised after)."""
    error: BaseException | None = None
    for s, before in taken.items():
        try:
            before.put_back(s)
        except BaseException as exc:  # raised below, once all are back
            error = error or exc
    if error is not None:
        raise error


def _blocked(signals: tuple[int, ...]) -> frozenset[int]:
    """Which of ``signals`` this thread blocks."""
    if not hasattr(signal, "pthread_sigmask"):
        return frozenset()
    return frozenset(signals) & frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def _give_back(
    taken: dict[int, _Before], blocked: frozenset[int], held: list[int] | None = None
) -> None:
    """Put back what took ``taken``'s signals before, with those signals blocked in this
    thread meanwhile (none lost between two handlers); with ``held``, one that arrived
    meanwhile is appended to it (taken by this scope: it came before the scope's end).
    A native handler is put back in two steps, Python's table (its default action,
    which :func:`signal.signal` installs) then the real action: a signal sent to the
    process in the microseconds between them and taken by another thread, which this
    one cannot block, gets the default action (Python offers no way to set its table
    without the action)."""
    signals = frozenset(taken)
    if not signals:
        return
    mask = hasattr(signal, "pthread_sigmask")
    try:
        if mask:  # also runs the Python handlers of the signals caught so far
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    finally:  # even when one of them raised
        try:
            _put_back(taken)
            if held is not None and hasattr(signal, "sigtimedwait"):  # not on macOS
                for s in sorted((signals - blocked) & signal.sigpending()):
                    if signal.sigtimedwait([s], 0) is not None:
                        held.append(s)
        finally:
            if mask:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, signals - blocked)


def _as_before(taken: dict[int, _Before], signum: int, frame: FrameType | None) -> None:
    """In a forked child (the handlers are the parent's scope's): every handler put
    back, and ``signum`` taken as it would have been."""
    _put_back(taken)
    before = taken.get(signum)
    if before is None:  # caught while the scope was being entered
        signal.signal(signum, signal.SIG_DFL)
        before = _Before(signal.SIG_DFL, None, "default")
    before.take(signum, frame)


_depth = 0
_lock = threading.Lock()


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` in this thread (the
    main thread; elsewhere this does nothing). Re-entrant; the previous handlers are
    restored on exit, native ones too (a handler the app hosting Python installed)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()
    taken: dict[int, _Before] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:  # a forked child: behave as if we were not installed
            _as_before(taken, signum, frame)
            return
        raise Terminated(signum)

    with _lock:
        _depth += 1
        outer = _depth == 1
    try:
        blocked: frozenset[int] = frozenset()
        if outer:
            blocked = _blocked(SIGNALS)
            taken.update(_take(SIGNALS, handler))
        try:
            yield
        finally:
            if outer:
                _give_back(taken, blocked)
    finally:
        with _lock:
            _depth -= 1


class _Hold:
    """Ctrl-C, SIGTERM and SIGHUP caught and kept (their previous handlers saved)."""

    def __init__(self, message: str) -> None:
        self.held: list[int] = []
        self.message = message
        self.pid = os.getpid()
        signals = (signal.SIGINT, *SIGNALS)
        self.blocked = _blocked(signals)
        self.previous: dict[int, _Before] = {}
        self.previous.update(_take(signals, self._catch))

    def _catch(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # forked (from another thread) during the hold
            _as_before(self.previous, signum, frame)
            return
        self.held.append(signum)

    def restore(self) -> None:
        _give_back(self.previous, self.blocked, self.held)

    def deliver(self) -> None:
        """The first signal held, delivered as its previous handler would have taken it
        (a :class:`KeyboardInterrupt` without a message gets :attr:`message`)."""
        if not self.held:
            return
        signum = self.held[0]
        before = self.previous[signum]
        try:
            before.take(signum, None)
        except KeyboardInterrupt as exc:
            if not exc.args:
                exc.args = (self.message,)
            raise
        if before.kind == "default":  # SIGINT's default, should the kill return
            raise KeyboardInterrupt(self.message)


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
