"""Benchmark: inspect a large .pte (metadata only).

    python benchmarks/bench_inspect.py LARGE.pte [--runs 20]

Reports, for ``read_container`` through a LocalFileLoader (what ``ptestore inspect``
does), the wall time (median and max over runs) and the bytes read, plus the wall time of
the whole ``ptestore inspect --json`` command (interpreter start included).
Make LARGE.pte with ``benchmarks/make_large_pte.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from ptestore.format.reader import read_container
from ptestore.inspection import describe
from ptestore.storage.loaders import LocalFileLoader


class CountingLoader(LocalFileLoader):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.bytes_read = 0
        self.reads = 0

    def load(self, offset: int, size: int) -> bytes:
        self.bytes_read += size
        self.reads += 1
        return super().load(offset, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    times = []
    loader = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        loader = CountingLoader(args.path)
        parsed = read_container(loader)
        describe(parsed.container)
        times.append(time.perf_counter() - t0)
        loader.close()
    assert loader is not None
    cli = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "ptestore", "inspect", "--json", args.path],
            check=True,
            capture_output=True,
        )
        cli.append(time.perf_counter() - t0)
    result = {
        "file_size": os.path.getsize(args.path),
        "segments": len(parsed.container.segments),
        "parse_ms_median": round(statistics.median(times) * 1000, 3),
        "parse_ms_max": round(max(times) * 1000, 3),
        "bytes_read": loader.bytes_read,
        "reads": loader.reads,
        "cli_ms_median": round(statistics.median(cli) * 1000, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
