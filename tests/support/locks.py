"""Waiting on ``flock`` without waiting on the clock: ``/proc/locks`` lists the processes
(and threads) blocked on a lock ("->" lines), so a test can see that one is blocked."""

from __future__ import annotations

import os
import time
from pathlib import Path


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
