"""Child processes started together: each touches its ``ready`` file once it has
imported what it needs, then waits for the ``go`` file; the test touches ``go`` when all
are ready, so that their work overlaps (index races and soaks)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["run_together"]


def run_together(
    commands: Sequence[Sequence[str]],
    ready: Sequence[Path],
    go: Path,
    *,
    timeout: float,
    ceiling: float = 300.0,
) -> list[tuple[int, bytes]]:
    """Start ``commands`` (the i-th touches ``ready[i]``, then waits for ``go``), touch
    ``go`` once each has touched its ``ready`` file or exited (a generous ``ceiling`` in
    seconds, not a timing assumption), and wait up to ``timeout`` seconds for each: its
    return code and its stderr. A child still running when this returns or fails is
    killed."""
    procs = [subprocess.Popen(list(c), stderr=subprocess.PIPE) for c in commands]
    try:
        end = time.monotonic() + ceiling
        for p, r in zip(procs, ready, strict=True):
            while not r.exists() and p.poll() is None and time.monotonic() < end:
                threading.Event().wait(0.001)
        go.touch()
        return [(p.wait(timeout=timeout), p.stderr.read() if p.stderr else b"") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
