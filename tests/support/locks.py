"""Waiting on ``flock`` without waiting on the clock: ``/proc/locks`` lists the processes
(and threads) blocked on a lock ("->" lines), so a test can see that one is blocked."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def blocked_on(path: Path) -> bool:
    """Whether someone is blocked waiting for an ``flock`` on the file at ``path``."""
    ino = os.stat(path).st_ino
    with open("/proc/locks", encoding="ascii") as f:
        for line in f:
            fields = line.split()
            if "->" in fields and fields[fields.index("->") + 1] == "FLOCK":
                where = fields[fields.index("->") + 5]
                if where.rsplit(":", 1)[-1] == str(ino):
                    return True
    return False


def wait_until(condition: object, what: str, ceiling: float = 120.0) -> None:
    """Poll ``condition()`` until it holds; fail (naming ``what``) after a generous
    ceiling that only a hung test reaches."""
    deadline = time.monotonic() + ceiling
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {ceiling:g} s for {what}")
        time.sleep(0.01)


def child_forked_under_them_takes(locks: Callable[[], Sequence[Any]]) -> bool:
    """Whether a child forked while another thread of this process held ``locks()``
    (each a ``threading``/``_thread`` lock) takes every one of ``locks()`` as it finds
    them after the fork (a module that makes its locks anew in the child: yes; one that
    keeps the parent's, held for ever there: no, after a ceiling only the failure
    waits for)."""
    import threading

    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        taken = list(locks())
        for lock in taken:
            lock.acquire()
        held.set()
        release.wait(120)
        for lock in reversed(taken):
            lock.release()

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(120)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            got = all(lock.acquire(timeout=30) for lock in locks())
            os._exit(0 if got else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join()
    return os.waitstatus_to_exitcode(status) == 0
