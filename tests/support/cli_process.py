"""``ptestore`` run in a process of its own, its streams redirected by ``sh`` where a test
asks (``>/dev/full``, ``>&-``: what a script's caller does to it), for the tests of what
a command says when its output cannot be written."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def ptestore_process(
    *argv: str, shell: str = "", stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """``python -m ptestore ARGV``: stdout redirected by ``sh`` (``shell``) or given,
    stderr captured, never raising on its exit status."""
    command = [sys.executable, "-m", "ptestore", *argv]
    if shell:
        command = ["sh", "-c", f'exec "$@" {shell}', "sh", *command]
    return subprocess.run(
        command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300, check=False
    )
