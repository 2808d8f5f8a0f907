"""One piece of work in a thread of its own, whose result (or exception) the caller
collects later, and which the caller can stop.

The run uses it to read and hash while it does something else: the source's SHA-256
while backends run, an output's digest while the output is being copied. Both are I/O
and hashing that release the GIL (``preadv``, :mod:`hashlib`, :func:`zlib.crc32`), so on
two cores or more they cost little extra time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from queue import SimpleQueue

__all__ = ["Background", "Cancelled", "Pending", "Worker", "started"]

T = TypeVar("T")


def started(thread: threading.Thread) -> bool:
    """Start ``thread``; False where it cannot start (``RuntimeError: can't start new
    thread``: out of memory or of threads, a process under ``ulimit -v`` or ``-u``), and
    the caller does its work in its own thread instead."""
    try:
        thread.start()
    except RuntimeError:
        return False
    return True


class Cancelled(Exception):
    """Raised inside the work when its caller cancelled it (never reaches the caller)."""


class Background(Generic[T]):
    """``work(cancelled)`` in a daemon thread named ``name``. ``work`` checks the
    :class:`threading.Event` it is given between pieces and raises :class:`Cancelled`
    once it is set.

    :meth:`result` waits and returns what ``work`` returned, or raises what it raised
    (in the caller's thread); :meth:`cancel` sets the event and waits for the thread.

    Where the thread cannot start (:func:`started`), ``work`` runs in the caller's
    thread when :meth:`result` is first called (never, once cancelled): the same result,
    without the overlap."""

    def __init__(self, name: str, work: Callable[[threading.Event], T]) -> None:
        self.cancelled = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._thread: threading.Thread | None = thread if started(thread) else None
        self._deferred: Callable[[threading.Event], T] | None = (
            None if self._thread is not None else work
        )
        #: Held while the deferred work runs in a caller: callers of other threads wait
        #: for its result (they got None while it ran), and so does :meth:`cancel`.
        self._running = threading.Lock()

    def _run(self, work: Callable[[threading.Event], T]) -> None:
        try:
            self._value = work(self.cancelled)
        except BaseException as exc:  # handed to the thread that asks for the result
            self._error = exc

    def result(self) -> T:
        if self._thread is not None:
            self._thread.join()
        else:
            with self._running:  # the first caller runs it; the others wait for it
                if (work := self._deferred) is not None:
                    self._deferred = None
                    if self.cancelled.is_set():
                        self._error = Cancelled()
                    else:
                        self._run(work)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def done(self) -> bool:
        """Whether :meth:`result` would return at once (the thread ended; deferred work
        that ran)."""
        if self._thread is not None:
            return not self._thread.is_alive()
        return self._deferred is None and not self._running.locked()

    def cancel(self) -> None:
        self.cancelled.set()
        if self._thread is not None:
            self._thread.join()
        else:
            with self._running:  # a deferred run in progress sees the event and ends
                pass


class Pending(threading.Event):
    value: object = None
    error: BaseException | None = None

    def result(self) -> object:
        self.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Worker:
    """One daemon thread running the calls handed to it, one at a time, in order: a
    second thread for a loop that hands it half of each step (what
    ``ThreadPoolExecutor(1)`` would do, without importing :mod:`concurrent.futures` and
    :mod:`logging` at start-up: about 9 ms of a device's CLI run).

    :meth:`submit` returns a pending call whose ``result()`` waits and returns or raises
    what the call did; :meth:`close` ends the thread once the calls handed to it are
    done (also when the worker is garbage-collected, without waiting). Where its thread
    cannot start (:func:`started`), each call runs in :meth:`submit`, in the caller's
    thread: the same results, in the same order, without the overlap."""

    def __init__(self, name: str) -> None:
        import weakref
        from queue import SimpleQueue

        todo: SimpleQueue[tuple[Callable[..., object], tuple[object, ...], Pending] | None]
        todo = SimpleQueue()
        self._todo = todo
        thread = threading.Thread(target=self._loop, args=(todo,), name=name, daemon=True)
        self._thread: threading.Thread | None = thread if started(thread) else None
        self._finalizer = weakref.finalize(self, todo.put, None)

    @staticmethod
    def _loop(
        todo: SimpleQueue[tuple[Callable[..., object], tuple[object, ...], Pending] | None],
    ) -> None:
        while (item := todo.get()) is not None:
            fn, args, pending = item
            try:
                pending.value = fn(*args)
            except BaseException as exc:  # handed to the thread that asks for the result
                pending.error = exc
            pending.set()

    def submit(self, fn: Callable[..., object], *args: object) -> Pending:
        pending = Pending()
        self._todo.put((fn, args, pending))
        if self._thread is None:  # no thread to run it: run it here, now
            self._todo.put(None)
            self._loop(self._todo)
        return pending

    def close(self) -> None:
        self._finalizer()  # puts the end marker once
        if self._thread is not None:
            self._thread.join()


def check(cancelled: threading.Event | None) -> None:
    """Raise :class:`Cancelled` when ``cancelled`` is set (for the work's loops)."""
    if cancelled is not None and cancelled.is_set():
        raise Cancelled
