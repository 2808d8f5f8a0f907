"""Benchmark: interpreter start-up with ``import ptestore`` and ``ptestore --help``.

    python benchmarks/bench_startup.py [--runs 10]

Runs each command ``--runs`` times in a fresh interpreter (the same one as this script,
from the current directory, so the tree's ``ptestore`` is the one imported) and reports
the minimum and median wall time and the minimum CPU time (user + sys of the child),
each also over a bare ``python -c pass``: the cost ptestore adds. Minimums, because
other load on the machine only ever adds time; CPU time is the steadier figure on a
loaded machine.
Also prints the modules ``--help`` loads that the CLI promises not to.
"""

from __future__ import annotations

import argparse
import resource
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


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run."""
    c0, t0 = _cpu(), time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _cpu() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    wall: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):  # interleaved, so that load spikes hit every command
        for name, argv in COMMANDS.items():
            w, c = timed(argv)
            wall[name].append(w * 1e3)
            cpu[name].append(c * 1e3)
    bare_w, bare_c = min(wall["python -c pass"]), min(cpu["python -c pass"])
    print(
        f"{'command':<50} {'wall min':>9} {'median':>8} {'- bare':>8} "
        f"{'CPU min':>8} {'- bare':>8}   (ms, {args.runs} runs)"
    )
    for name in COMMANDS:
        lo, med, c = min(wall[name]), statistics.median(wall[name]), min(cpu[name])
        print(f"{name:<50} {lo:9.1f} {med:8.1f} {lo - bare_w:8.1f} {c:8.1f} {c - bare_c:8.1f}")
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
