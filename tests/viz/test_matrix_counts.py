"""What the fleet matrix counts (issue 29 item 18): a shared content-addressed ``.ptd``
once, a job-wide error once, the run's wall time (and the pairs' summed time, labelled),
and a plan's estimate next to the run's bytes, each counting the same thing."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job
from ptestore.viz.html import human
from ptestore.viz.matrix import matrix_html

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _job(tmp: Path) -> Path:
    """``ext`` on three devices (b and c scale alike: one shared .ptd for both), and a
    malformed model that fails the same way on every device."""
    (tmp / "broken.pte").write_bytes(b"not a program at all")
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "ext"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        f'[[models]]\nname = "gone"\nsource = "{tmp}/broken.pte"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\n[devices.c]\nsoc = "z"\n'
    )
    return job


def _text(html: str, element: str) -> str:
    found = re.search(rf'<[a-z]+ [^>]*id="{element}"[^>]*>(.*?)</(div|table)>', html, re.S)
    assert found is not None, element
    return found.group(1)


def test_a_shared_ptd_and_a_job_wide_error_count_once(tmp_path: Path) -> None:
    job = _job(tmp_path)
    plan_json = tmp_path / "plan.json"
    assert main(["fleet", "plan", str(job), "--report", str(plan_json)]) == 0
    plan_data = json.loads(plan_json.read_text())
    # The plan's cells carry the estimate the plan prints, labelled as such.
    plan = plan_job(load_job(job))
    assert plan_data["totals"]["estimated_client_bytes"] == plan.estimate.client_bytes > 0
    assert [c["estimated_client_bytes"] for c in plan_data["pairs"]] == [
        p.estimate.client_bytes for p in plan.pairs
    ]
    plan_totals = _text(matrix_html(plan_data), "totals")
    assert "estimated through the client by a run&#x27;s pairs" in plan_totals

    report = tmp_path / "run.json"
    assert main(["fleet", "run", str(job), "--workers", "1", "-q", "--report", str(report)]) == 1
    data = json.loads(report.read_text())
    ext = {c["device"]: c for c in data["pairs"] if c["model"] == "ext"}
    assert ext["b"]["ptd_destination"] == ext["c"]["ptd_destination"]
    assert ext["a"]["ptd_destination"] != ext["b"]["ptd_destination"]
    on_disk = sum(f.stat().st_size for f in (tmp_path / "out").rglob("*.pt[ed]"))
    assert len(list((tmp_path / "out/_shared/sha256-tree").iterdir())) == 2
    # Every file once: the three .pte and the two .ptd objects, not three .ptd.
    assert data["totals"]["artifact_bytes"] == on_disk
    assert data["totals"]["ptd_objects"] == 2
    assert sum(c["size"] for c in ext.values()) == on_disk + ext["c"]["ptd_size"]

    html = matrix_html(data)
    totals = _text(html, "totals")
    assert f"wall time {data['seconds']:.2f} s" in totals
    assert f"the pairs&#x27; own times summed {data['totals']['pair_seconds']:.2f} s" in totals
    assert "each shared .ptd counted once: 2" in totals
    # The pairs' bytes are what the plan estimated (the planner's reads apart).
    planner = data["totals"]["planner_bytes"]
    assert f"the planner {human(planner)})" in totals
    pairs_bytes = data["totals"]["bytes"] - planner
    estimate = plan_data["totals"]["estimated_client_bytes"]
    assert abs(pairs_bytes - estimate) <= 0.35 * estimate, (pairs_bytes, estimate)

    # gone fails identically on a, b and c: one row naming its three pairs.
    failures = _text(html, "failures")
    rows = re.findall(r'<tr data-i="\d+" data-pairs="(\d+)">(.*?)</tr>', failures)
    assert [n for n, _ in rows] == ["3"]
    assert "gone" in rows[0][1] and "a, b, c (3 pairs)" in rows[0][1]
    assert "broken.pte: file identifier (bytes 4..8) = b&#x27;a pr&#x27;" in rows[0][1]
