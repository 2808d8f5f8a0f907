"""Benchmark: interpreter start-up with ``import ptestore`` and ``ptestore --help``.

    python benchmarks/bench_startup.py [--runs 10]

Runs each command ``--runs`` times in a fresh interpreter (the same one as this script,
from the current directory, so the tree's ``ptestore`` is the one imported) and reports
the minimum and median wall time, and the minimum over a bare ``python -c pass``: the
cost ptestore adds. Minimums, because other load on the machine only ever adds time.
Also prints the modules ``--help`` loads that the CLI promises not to.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import ptestore'": [sys.executable, "-c", "import ptestore"],
    "python -c 'import ptestore; ptestore.specialize'": [
        sys.executable,
        "-c",
        "import ptestore; ptestore.specialize",
    ],
    "python -m ptestore --help": [sys.executable, "-m", "ptestore", "--help"],
}

HEAVY = ("fsspec", "numpy", "tenacity", "s3fs", "tqdm", "importlib.metadata")


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    results: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):  # interleaved, so that load spikes hit every command
        for name, argv in COMMANDS.items():
            results[name].append(timed(argv))
    bare = min(results["python -c pass"])
    print(f"{'command':<52} {'min':>8} {'median':>8} {'min - bare':>11}")
    for name, times in results.items():
        lo, med = min(times) * 1e3, statistics.median(times) * 1e3
        print(f"{name:<52} {lo:7.1f}ms {med:7.1f}ms {lo - bare * 1e3:9.1f}ms")
    probe = (
        "import sys\nfrom ptestore.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stderr.strip()
    print(f"heavy modules loaded by --help: {loaded}")


if __name__ == "__main__":
    main()
