"""Benchmark: interpreter start-up with ``import ptestore``, ``ptestore --help``, an
``ensure`` cache hit and a local ``specialize``.

    python benchmarks/bench_startup.py [--runs 10] [--work DIR]

Runs each command ``--runs`` times in a fresh interpreter (the same one as this script,
from the current directory, so the tree's ``ptestore`` is the one imported) and reports
the minimum and median wall time and the minimum CPU time (user + sys of the child),
each also over a bare ``python -c pass``: the cost ptestore adds. Minimums, because
other load on the machine only ever adds time; CPU time is the steadier figure on a
loaded machine.
Also prints the modules ``--help``, the ``ensure`` hit and the local ``specialize`` load
that they promise not to.

The ``ensure`` hit is ``ptestore ensure tests/fixtures/mlp_xnnpack.pte --cache-dir
WORK/cache --backend passthrough`` after a first call has made the entry (so every timed
run is a hit); the ``specialize`` is ``ptestore specialize`` of the same fixture with
``--backend passthrough --quiet`` to ``WORK/out.pte`` (replaced each run), a whole local
passthrough run of a 6 KiB model: start-up, imports and the fixed cost of a run, with
the command line's default provenance trailer and again with ``--no-provenance``.
Bytecode: a ``PYTHONDONTWRITEBYTECODE`` environment compiles every module of the tree
in every run; the script warns when it is set (use ``PYTHONPYCACHEPREFIX``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mlp_xnnpack.pte"

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import ptestore'": [sys.executable, "-c", "import ptestore"],
    "python -c 'import ptestore; ptestore.specialize'": [
        sys.executable,
        "-c",
        "import ptestore; ptestore.specialize",
    ],
    "python -m ptestore --help": [sys.executable, "-m", "ptestore", "--help"],
}

HEAVY = ("fsspec", "asyncio", "numpy", "tenacity", "s3fs", "tqdm", "importlib.metadata")
#: What a local ensure hit and a local passthrough specialize promise not to load.
LOCAL_HEAVY = ("fsspec", "asyncio", "numpy", "tenacity", "s3fs", "tqdm")


def device_commands(work: Path) -> dict[str, list[str]]:
    """The ``ensure`` hit and the local ``specialize``, with their entry made once."""
    cli = [sys.executable, "-m", "ptestore"]
    ensure = [*cli, "ensure", str(FIXTURE), "--cache-dir", str(work / "cache")]
    ensure += ["--backend", "passthrough"]
    subprocess.run(ensure, check=True, stdout=subprocess.DEVNULL)  # the entry: later runs hit
    out = str(work / "out.pte")
    specialize = [*cli, "specialize", str(FIXTURE), out, "--backend", "passthrough"]
    specialize += ["--quiet"]
    return {
        "python -m ptestore ensure (cache hit)": ensure,
        "python -m ptestore specialize (local, passthrough)": specialize,
        "  ... --no-provenance": [*specialize, "--no-provenance"],
    }


def loaded_by(argv: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` the ptestore command line ``argv`` (after ``-m ptestore``)
    loads, run in a fresh interpreter."""
    probe = (
        "import sys\nfrom ptestore.cli import main\ntry:\n"
        f"    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(' '.join(m for m in {modules!r} if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return done.stderr.strip().splitlines()[-1].split() if done.stderr.strip() else []


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
    ap.add_argument("--work", default="/tmp/ptestore-bench-startup", help="cache and output")
    args = ap.parse_args()
    if sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("warning: PYTHONDONTWRITEBYTECODE is set: every run compiles ptestore's modules")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    commands = {**COMMANDS, **device_commands(work)}
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):  # interleaved, so that load spikes hit every command
        for name, argv in commands.items():
            w, c = timed(argv)
            wall[name].append(w * 1e3)
            cpu[name].append(c * 1e3)
    bare_w, bare_c = min(wall["python -c pass"]), min(cpu["python -c pass"])
    print(
        f"{'command':<52} {'wall min':>9} {'median':>8} {'- bare':>8} "
        f"{'CPU min':>8} {'- bare':>8}   (ms, {args.runs} runs)"
    )
    for name in commands:
        lo, med, c = min(wall[name]), statistics.median(wall[name]), min(cpu[name])
        print(f"{name:<52} {lo:9.1f} {med:8.1f} {lo - bare_w:8.1f} {c:8.1f} {c - bare_c:8.1f}")
    print(f"heavy modules loaded by --help: {loaded_by(['--help'], HEAVY)}")
    for name, argv in list(commands.items())[len(COMMANDS) :]:
        print(f"heavy modules loaded by {name}: {loaded_by(argv[3:], LOCAL_HEAVY)}")


if __name__ == "__main__":
    main()
