"""The check before a packed-weight file is handed out, as an app calls it: digests given
or not, quick or full.

    python benchmarks/bench_xnnpack_check.py [--model fp32_1g] [--runs 5] [--base REV]
        [--workdir /tmp/ptestore-bench-xnnpack]

The program is exported into ``--workdir`` (scripts/make_xnnpack_models.py, as
bench_xnnpack.py does; never committed) and its file made once with ``make_cache``.
Then each case runs ``--runs`` times, each in a fresh process, timed inside it around
the one call (interpreter and imports excluded), warm page cache:

- ``verify, digest given, quick``: ``verify_cache(path, pte=, pte_sha256=, full=False)``,
  what the device cache does (it keeps its entry's digests);
- ``verify, quick``: ``verify_cache(path, pte=, full=False)``, what
  ``load(pte, cache=path, full=False)`` calls when the app passes no digest;
- ``find, quick``: ``find_cache(pte, directory=, full=False)``;
- ``verify, full``: ``verify_cache(path, pte=)``, ``load``'s default.

``--base REV`` runs the same cases with ptestore from a ``git worktree`` of ``REV`` as
well (same program, same file: the record's fields that a later version added are
ignored by an earlier one). One JSON line per run, then a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_xnnpack import MODELS, REPO, _export

CHILD = r"""
import json, sys, time
from pathlib import Path
from ptestore.xnnpack import find_cache, verify_cache
case, pte, path, digest = sys.argv[1:5]
t = time.perf_counter()
if case == "verify, digest given, quick":
    got = verify_cache(path, pte=pte, pte_sha256=digest, full=False)
elif case == "verify, quick":
    got = verify_cache(path, pte=pte, full=False)
elif case == "find, quick":
    got = find_cache(pte, directory=Path(path).parent, full=False)
else:
    got = verify_cache(path, pte=pte)
seconds = time.perf_counter() - t
assert got is not None and str(got.path) == path, got
print(json.dumps({"seconds": seconds}))
"""

CASES = ("verify, digest given, quick", "verify, quick", "find, quick", "verify, full")


def _run(tree: Path, case: str, pte: Path, path: Path, digest: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(pte), str(path), digest],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,  # "-c" puts the working directory first on sys.path
    )
    seconds: float = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="fp32_1g", choices=sorted(MODELS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--base", help="also run the cases with ptestore at this revision")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ptestore-bench-xnnpack"))
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    pte = _export(args.model, args.workdir)
    sys.path.insert(0, str(REPO))
    from ptestore.xnnpack import make_cache

    made = make_cache(pte, directory=args.workdir / f"{args.model}-check")
    print(f"# {pte} ({pte.stat().st_size} B), file {made.path} ({made.size} B)")
    trees: dict[str, Path] = {"this tree": REPO}
    worktree = None
    if args.base:
        worktree = Path(tempfile.mkdtemp(prefix="ptestore-base-"))
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), args.base],
            check=True,
            capture_output=True,
        )
        trees = {args.base: worktree, **trees}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.runs):  # interleaved: a noisy minute hits every case alike
            for label, tree in trees.items():
                for case in CASES:
                    s = _run(tree, case, pte, made.path, made.identity.pte_sha256)
                    times.setdefault((label, case), []).append(s)
                    print(json.dumps({"tree": label, "case": case, "seconds": round(s, 4)}))
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                check=False,
            )
            shutil.rmtree(worktree, ignore_errors=True)
    print(f"\n| case ({MODELS[args.model]['what']}) | " + " | ".join(trees) + " |")
    print("|---|" + "---|" * len(trees))
    for case in CASES:
        cells = []
        for label in trees:
            got = times[(label, case)]
            spread = ", ".join(f"{v:.3f}" for v in got)
            cells.append(f"{statistics.median(got):.3f} s ({spread})")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
