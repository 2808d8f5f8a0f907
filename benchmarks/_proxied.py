"""A measured fetch process behind the counting proxy (tests/support/faulty_proxy.py),
for ``bench_delta_fetch.py`` and ``bench_packed_delta.py`` (imported, never run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_child(code: str, args: dict[str, Any], proxy: Any, what: str) -> dict[str, Any]:
    """Run ``code`` (``python -c``, its arguments: ``args`` as JSON, then the tree and its
    tests directory for its ``sys.path``) in a fresh process; its last output line (a JSON
    object) with the bytes the server sent meanwhile (``server_sent``, counted by
    ``proxy``) and the machine's load (``loadavg``). Exits naming ``what`` on failure."""
    before = sum(proxy.sent.values())
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args), str(ROOT), str(ROOT / "tests")],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what}: {proc.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    got["server_sent"] = sum(proxy.sent.values()) - before
    got["loadavg"] = os.getloadavg()[0]
    return got
