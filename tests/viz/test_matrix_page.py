"""The fleet matrix (``ptestore fleet plan|run JOB --report FILE``) in a real browser: one
cell per pair with its status, the error of a failed pair on selection, filters and
sorting, the JSON form, and a 50 x 100 fleet."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.browser import Browser, distinct_colours
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job
from ptestore.viz.matrix import matrix_data, matrix_html

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _job(tmp: Path) -> Path:
    """Two real models and a malformed one (it fails at run time, in each pair: a
    missing source would be a job-wide preflight error instead)."""
    (tmp / "broken.pte").write_bytes(b"not a program at all")
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        f'[[models]]\nname = "ext"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        f'[[models]]\nname = "gone"\nsource = "{tmp}/broken.pte"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\n'
    )
    return job


def _open(browser: Browser, path: Path) -> float:
    seconds = browser.open(path)
    assert browser.console_errors() == []
    assert browser.requests(path) == [path.resolve().as_uri()]
    return seconds


def _cells(browser: Browser) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = browser.js(
        "return Array.from(document.querySelectorAll('td.cell[data-i]')).map(e => ({"
        "model: e.dataset.model, device: e.dataset.device, status: e.dataset.status,"
        "dim: e.classList.contains('dim'), hidden: e.hidden || e.parentNode.hidden}))"
    )
    return out


def _click(browser: Browser, selector: str) -> str:
    browser.js(f"document.querySelector({json.dumps(selector)}).click()")
    text: str = browser.js("return document.getElementById('details').innerText")
    return text


def test_plan_and_run_reports_in_a_browser(browser: Browser, tmp_path: Path) -> None:
    job = _job(tmp_path)
    plan_page = tmp_path / "plan.html"
    assert main(["fleet", "plan", str(job), "--report", str(plan_page)]) == 0
    _open(browser, plan_page)
    cells = _cells(browser)
    assert len(cells) == 6
    status = {(c["model"], c["device"]): c["status"] for c in cells}
    assert status == {
        ("mlp", "a"): "would run",
        ("mlp", "b"): "would run",
        ("ext", "a"): "would run",
        ("ext", "b"): "would run",
        ("gone", "a"): "would run",
        ("gone", "b"): "would run",
    }
    details = _click(browser, "td.cell[data-model=mlp][data-device=b]")
    assert "mlp on b" in details and f"no artifact at {tmp_path}/out/b/mlp.pte" in details

    run_page = tmp_path / "run.html"
    report = tmp_path / "run.json"
    assert main(["fleet", "run", str(job), "--workers", "1", "-q", "--report", str(run_page)]) == 1
    _open(browser, run_page)
    cells = _cells(browser)
    assert sorted(c["status"] for c in cells) == ["done"] * 4 + ["failed"] * 2
    details = _click(browser, "td.cell[data-model=gone][data-device=a]")
    assert f"{tmp_path}/broken.pte: file identifier (bytes 4..8) = b'a pr'" in details
    details = _click(browser, "td.cell[data-model=ext][data-device=a]")
    assert "compatibility XnnpackBackend: scaler;soc=x;v=1.0" in details
    embedded = json.loads(browser.js("return document.getElementById('ptestore-data').textContent"))
    (ext_a,) = [p for p in embedded["pairs"] if (p["model"], p["device"]) == ("ext", "a")]
    # The .ptd is the one the job stored once by content.
    ptd = Path(ext_a["ptd_destination"])
    assert ptd.parent == tmp_path / "out/_shared/sha256-tree"
    size = (tmp_path / "out/a/ext.pte").stat().st_size + ptd.stat().st_size
    assert ext_a["size"] == size and ext_a["seconds"] > 0 and ext_a["bytes"] > 0
    totals = browser.js("return document.getElementById('totals').innerText")
    assert "6 pairs (3 models x 2 devices)" in totals and "bytes through the client" in totals
    # gone fails the same way on a and b: one row for both pairs
    assert browser.js("return document.querySelectorAll('#failures tr[data-i]').length") == 1

    # filters: a model substring, a device regex, a status
    browser.js(
        "const f = document.getElementById('filter-model'); f.value = 'ml';"
        "f.dispatchEvent(new Event('input'))"
    )
    shown = [c for c in _cells(browser) if not c["hidden"]]
    assert {c["model"] for c in shown} == {"mlp"}
    browser.js(
        "const f = document.getElementById('filter-model'); f.value = '';"
        "f.dispatchEvent(new Event('input'));"
        "const d = document.getElementById('filter-device'); d.value = '/^b$/';"
        "d.dispatchEvent(new Event('input'))"
    )
    assert {c["device"] for c in _cells(browser) if not c["hidden"]} == {"b"}
    browser.js("document.querySelector('input[name=status][value=failed]').click()")
    dim = {(c["model"], c["device"]) for c in _cells(browser) if c["dim"]}
    assert dim == {("gone", "a"), ("gone", "b")}
    # sorting: failed models first; devices by name reversed through "time"
    browser.js(
        "const s = document.getElementById('sort-model'); s.value = 'failed';"
        "s.dispatchEvent(new Event('change'))"
    )
    rows = browser.js(
        "return Array.from(document.querySelectorAll('#matrix tbody tr')).map(r => r.dataset.model)"
    )
    assert rows[0] == "gone" and sorted(rows) == ["ext", "gone", "mlp"]
    shot = browser.screenshot(tmp_path / "run.png")
    assert distinct_colours(browser, shot)[2] > 20

    # the same data as JSON (a second run: every pair current now, skipped)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q", "--report", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["kind"] == "run" and data["totals"]["skipped"] == 4
    assert data["totals"]["failed"] == 2 and data["totals"]["pairs"] == 6
    assert [(p["model"], p["device"]) for p in data["pairs"]] == [
        (p["model"], p["device"]) for p in embedded["pairs"]
    ]
    assert data == matrix_data(plan_job(load_job(job)), None) | {
        "kind": "run",
        "engine": data["engine"],
        "seconds": data["seconds"],
        "index": str(tmp_path / "out/ptestore-index.json"),
        "index_errors": [],
        "index_shards": data["index_shards"],
        "totals": data["totals"],
        "pairs": data["pairs"],
    }
    # What publishing the index did, shard by shard (a second run: read, nothing written).
    shards = data["index_shards"]
    assert shards["version"] == 3 and shards["written"] == 0
    assert {s["kind"] for s in shards["shards"]} == {"root", "leaf", "catalog"}


def synthetic_fleet(models: int = 50, devices: int = 100) -> dict[str, Any]:
    """matrix_data()-shaped data of a models x devices run with every status."""
    statuses = ["done", "skipped", "done", "would run", "done", "skipped", "failed"]
    pairs = []
    for m in range(models):
        for d in range(devices):
            s = statuses[(m * 5 + d * 3 + m * d) % len(statuses)]
            pairs.append(
                {
                    "model": f"model-{m:02d}",
                    "device": f"device-{d:03d}",
                    "destination": f"s3://fleet/device-{d:03d}/model-{m:02d}.pte",
                    "ptd_destination": None,
                    "status": s,
                    "reason": "stale: backends differ" if s != "skipped" else "current",
                    "error": "backend XnnpackBackend failed: out of memory"
                    if s == "failed"
                    else None,
                    "seconds": 0.5 + (m * d) % 17 / 10 if s == "done" else 0.0,
                    "bytes": (m + 1) * 1_000_000 if s == "done" else 4096,
                    "size": (m + 1) * 1_000_000 if s in ("done", "skipped") else None,
                    "compatibility": ["XnnpackBackend: xnn;v=1"]
                    if s in ("done", "skipped")
                    else [],
                }
            )
    totals: dict[str, Any] = {
        k.replace(" ", "_"): sum(p["status"] == k for p in pairs) for k in set(statuses)
    }
    totals.update(
        pairs=len(pairs),
        bytes=sum(p["bytes"] for p in pairs),
        artifact_bytes=sum(p["size"] or 0 for p in pairs),
        pair_seconds=sum(p["seconds"] for p in pairs),
    )
    return {
        "job": "fleet.toml",
        "kind": "run",
        "engine": "dask tcp://scheduler:8786",
        "seconds": 812.5,
        "backends": ["xnnpack"],
        "models": [f"model-{m:02d}" for m in range(models)],
        "devices": [f"device-{d:03d}" for d in range(devices)],
        "totals": totals,
        "pairs": pairs,
    }


def test_a_50_by_100_fleet_stays_usable(browser: Browser, tmp_path: Path) -> None:
    data = synthetic_fleet()
    t0 = time.perf_counter()
    html = matrix_html(data)
    build = time.perf_counter() - t0
    page = tmp_path / "fleet.html"
    page.write_text(html)
    seconds = _open(browser, page)
    assert browser.js("return document.querySelectorAll('td.cell[data-i]').length") == 5000
    t1 = time.perf_counter()
    browser.js(
        "const s = document.getElementById('sort-device'); s.value = 'failed';"
        "s.dispatchEvent(new Event('change'));"
        "const f = document.getElementById('filter-device'); f.value = 'device-01';"
        "f.dispatchEvent(new Event('input'))"
    )
    interact = time.perf_counter() - t1
    shown = browser.js("return document.getElementById('shown').textContent")
    assert shown == "50 models, 10 devices, 500 pairs shown"
    details = _click(browser, "td.cell[data-status=failed]")
    assert "out of memory" in details
    print(
        f"50 x 100 fleet: page {len(html)} bytes, built in {build:.3f} s, ready in the "
        f"browser in {seconds:.3f} s, sort + filter {interact:.3f} s"
    )


def test_report_path_as_a_file_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--report file:///x/page.html`` is checked (and written) as ``/x/page.html``,
    not as a path under the current directory."""
    job = _job(tmp_path)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert main(["fleet", "plan", str(job), "--report", f"file://{tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"--report file://{tmp_path}: is a directory (give a file name)" in err
    page = tmp_path / "plan.html"
    assert main(["fleet", "plan", str(job), "--report", f"file://{page}"]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert list((tmp_path / "cwd").iterdir()) == []


def test_report_path_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path)
    assert main(["fleet", "plan", str(job), "--report", str(tmp_path)]) == 2
    assert f"--report {tmp_path}: is a directory (give a file name)" in capsys.readouterr().err
    missing = tmp_path / "no" / "fleet.html"
    assert main(["fleet", "run", str(job), "--report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--report {missing}: the directory {missing.parent} does not exist" in err
    assert not (tmp_path / "out").exists()  # refused before anything ran
    # a page that cannot be written after the run: the pairs are published, exit 1
    (tmp_path / "keep.toml").write_text(
        job.read_text().split('[[models]]\nname = "gone"')[0] + '[devices.a]\nsoc = "x"\n'
    )
    code = main(
        [
            "fleet",
            "run",
            str(tmp_path / "keep.toml"),
            "--workers",
            "1",
            "-q",
            "--report",
            "/proc/ptestore-report.html",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "the report was not written: /proc/ptestore-report.html: cannot write the page" in err
    assert (tmp_path / "out" / "a" / "mlp.pte").exists()


def test_models_named_like_object_properties_sort(browser: Browser, tmp_path: Path) -> None:
    """Model names are plain names, so ``__proto__`` and ``constructor`` are names too:
    the page's per-name tables never take them for an object's own properties."""
    data = synthetic_fleet(3, 4)
    names = {"model-00": "__proto__", "model-01": "constructor", "model-02": "plain"}
    failed = {"__proto__": 0, "constructor": 2, "plain": 3}  # not the names' order
    seen: dict[str, int] = {}
    for p in data["pairs"]:
        p["model"] = names[p["model"]]
        n = seen[p["model"]] = seen.get(p["model"], 0) + 1
        p["status"] = "failed" if n <= failed[p["model"]] else "done"
    data["models"] = list(names.values())
    page = tmp_path / "fleet.html"
    page.write_text(matrix_html(data))
    _open(browser, page)
    for how, want in (("failed", ["plain", "constructor", "__proto__"]), ("name", None)):
        browser.js(
            "const s = document.getElementById('sort-model');"
            f"s.value = {json.dumps(how)}; s.dispatchEvent(new Event('change'))"
        )
        rows = browser.js(
            "return Array.from(document.querySelectorAll('#matrix tbody tr'))"
            ".map(r => r.dataset.model)"
        )
        assert rows == (want or sorted(names.values())), how
    assert browser.console_errors() == []


def test_a_device_header_sorts_its_failed_pairs_first(browser: Browser, tmp_path: Path) -> None:
    """A click on a device's header sorts the models by their status on it: failed first
    (its rank is 0, which the page took for "no pair", ranked last), then done, skipped,
    and models without a pair there."""
    data = synthetic_fleet(5, 2)
    device = data["devices"][0]
    statuses = ["done", "failed", "skipped", "done"]
    for p in data["pairs"]:
        if p["device"] == device:
            i = data["models"].index(p["model"])
            p["status"] = statuses[i] if i < len(statuses) else "done"
            p["error"] = "boom" if p["status"] == "failed" else None
    data["pairs"] = [
        p for p in data["pairs"] if not (p["device"] == device and p["model"] == data["models"][4])
    ]
    page = tmp_path / "fleet.html"
    page.write_text(matrix_html(data))
    _open(browser, page)
    browser.js(f"document.querySelector('th.dev[data-device={json.dumps(device)}]').click()")
    rows = browser.js(
        "return Array.from(document.querySelectorAll('#matrix tbody tr')).map(r => r.dataset.model)"
    )
    m = data["models"]
    assert rows == [m[1], m[0], m[3], m[2], m[4]]
    # A long unbroken error or compatibility string wraps (64 KiB of it made the page
    # 473,662 px wide).
    wraps = browser.js(
        "return ['details', 'failures'].map(id => getComputedStyle("
        "id === 'details' ? document.getElementById(id) : document.querySelector('#failures td')"
        ").overflowWrap)"
    )
    assert wraps == ["anywhere", "anywhere"]
    assert browser.console_errors() == []
