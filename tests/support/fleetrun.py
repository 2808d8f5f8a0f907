"""A ``fleet run`` of a job file through the CLI (one worker, ``--json``), for tests that
need the index a real run publishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptestore.cli import main

__all__ = ["fleet_run", "fleet_run_json"]


def fleet_run_json(job: Path, capsys: Any) -> dict[str, Any]:
    """Run ``job`` (it must succeed) and return the run's JSON report."""
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def fleet_run(job: Path, capsys: Any) -> str:
    """Run ``job`` (it must succeed) and return the URL of the index it published."""
    index: str = fleet_run_json(job, capsys)["index"]
    return index
