"""Benchmark: one in-place run of two commits in alternation (an A/B), whole processes,
so a change of a few milliseconds shows through a noisy disk.

    python benchmarks/bench_inplace_ab.py --work /tmp/bench-digests --base HEAD~1 --rounds 15

The program and the benchmark backend are :mod:`bench_digests`'s (its ``--sizes-mib``
program, *known*: it carries a trailer; ``--never``: the one without). Each round, for
``--base`` and then this tree: a fresh copy of the program (made and ``sync``-ed before
the timer starts) specialized in place with one 16 MiB value reversed, ``python -m
ptestore specialize --quiet M M --in-place --backend bench_digests_backend:Reverse``,
with the tree first on ``PYTHONPATH`` (both trees' bytecode compiled first). Each
tree's wall time and CPU time (user + system of the process and its threads: the work
it did, whatever the disk's waits) are reported. ``--base``
is checked out in a git worktree under ``--work``, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_digests import _make  # noqa: E402 - the same program and backend


def _run(tree: Path, work: Path, src: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, the process and its threads) of one run."""
    target = work / "ab.pte"
    shutil.copyfile(src, target)
    os.sync()
    cmd = [sys.executable, "-m", "ptestore", "specialize", "--quiet", str(target), str(target)]
    cmd += ["--in-place", "--backend", "bench_digests_backend:Reverse"]
    run_env = {**env, "PYTHONPATH": os.pathsep.join([str(tree), str(work)])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    # in ``work``: ``python -m`` puts the current directory first on the path, so run from
    # this tree's root both trees were this one
    subprocess.run(cmd, check=True, env=run_env, stdout=subprocess.DEVNULL, cwd=work)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/bench-digests")
    ap.add_argument("--sizes-mib", default="16,336,336,336")
    ap.add_argument("--base", required=True, help="the commit to compare this tree with")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--never", action="store_true", help="the program without a trailer")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    never, known = _make(work, [int(n) for n in args.sizes_mib.split(",")])
    base = work / "ab-base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True
    )
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-f", "-q", "--detach", str(base), args.base],
        check=True,
    )
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled once, then read by every run
    try:
        trees = {args.base: base, "this tree": ROOT}
        for tree in trees.values():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "compileall",
                    "-q",
                    str(tree / "ptestore"),
                    str(work / "bench_digests_backend.py"),
                ],
                check=True,
                env=env,
            )
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                times[name].append(_run(tree, work, never if args.never else known, env))
        for name, runs in times.items():
            wall, cpu = [w for w, _ in runs], [c for _, c in runs]
            print(
                f"{name:12s} wall median {statistics.median(wall) * 1000:6.1f} ms, min "
                f"{min(wall) * 1000:6.1f} ms; CPU median {statistics.median(cpu) * 1000:6.1f} ms "
                f"({len(runs)} runs)"
            )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            capture_output=True,
        )
        (work / "ab.pte").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
