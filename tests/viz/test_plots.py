"""benchmarks/plots.py: the committed figures are what the script makes from
docs/benchmarks-data.json, well-formed SVG with one line per case and file system."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def test_committed_figures_are_current(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plots.py"),
            str(ROOT / "docs" / "benchmarks-data.json"),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    for name in ("bench-time.svg", "bench-space.svg", "bench-s3.svg"):
        made = (tmp_path / name).read_text()
        assert made == (ROOT / "docs" / "img" / name).read_text(), (
            f"docs/img/{name} is stale: run python benchmarks/plots.py "
            "docs/benchmarks-data.json --out docs/img"
        )
        assert len(made) < 100_000
    data = json.loads((ROOT / "docs" / "benchmarks-data.json").read_text())
    lines = sum(len(s["summary"]) for s in data["series"].values() if s["summary"])
    tree = ET.fromstring((tmp_path / "bench-time.svg").read_text())
    # one polyline per (file system, case), each through its sizes, plus the legend
    paths = tree.findall(f".//{SVG}path")
    cases = {(n.split("/")[0], c) for n, s in data["series"].items() for c in s["summary"]}
    assert len(paths) == len(cases)
    points = [c for c in tree.iter(f"{SVG}circle") if c.find(f"{SVG}title") is not None]
    assert len(points) == lines
    bars = ET.fromstring((tmp_path / "bench-s3.svg").read_text()).findall(f".//{SVG}rect")
    titles = [b.findtext(f"{SVG}title") or "" for b in bars]
    sent = data["s3_copy"]["streaming"]["bytes_sent"]
    assert f"streaming, sent: {sent:,} bytes" in titles
