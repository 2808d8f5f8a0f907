"""Benchmark: specialize a large .pte with one replaced blob, against ``cp``.

    python benchmarks/bench_specialize.py LARGE.pte [--out-dir DIR] [--runs 3]

The backend doubles the largest named weight (64 MiB in the 1 GiB model made by
``benchmarks/make_large_pte.py``). Each specialization runs in a fresh child process so
its peak RSS (``ru_maxrss``) is its own; the baseline RSS of a child that only imports
ptestore and numpy is reported beside it. ``cp`` copies the same file to the same
directory (then ``sync FILE`` for the durable comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time
import numpy as np
import ptestore
from ptestore.backends import BackendData, BackendInterface

class DoubleLargest(BackendInterface):
    name = "XnnpackBackend"
    def initialize_backend_data(self, context, output):
        for _ in context:
            pass
        named = context.get_named_data_map()
        key = LARGEST  # chosen from the parsed container, without loading any blob
        data = np.frombuffer(named.get_data(key), dtype=np.float32) * 2
        output.write_named_data(key, BackendData(data.tobytes()))

mode = sys.argv[1]
src, dst = sys.argv[2], sys.argv[3]
if mode == "baseline":
    print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
    raise SystemExit
from ptestore.format.reader import read_container
from ptestore.storage.loaders import open_loader
with open_loader(src) as l:
    c = read_container(l).container
sizes = {e.key: c.segments[e.segment_index].size for e in c.named_data}
LARGEST = max(sizes, key=sizes.get)
t0 = time.perf_counter()
report = ptestore.specialize(src, dst, backends=[DoubleLargest()], provenance=False)
elapsed = time.perf_counter() - t0
print(json.dumps({
    "seconds": elapsed,
    "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "replaced_bytes": report.files[0].bytes_replaced,
    "copied_bytes": report.files[0].bytes_copied,
}))
"""


def child(mode: str, src: str, dst: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, src, dst], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.path))
    dst = os.path.join(out_dir, "bench-specialized.pte")
    cp_dst = os.path.join(out_dir, "bench-cp.pte")

    base = child("baseline", args.path, dst)
    runs = []
    cps: list[float] = []
    cp_syncs: list[float] = []
    for _ in range(args.runs):
        for p in (dst, cp_dst):
            if os.path.exists(p):
                os.unlink(p)
        t0 = time.perf_counter()
        subprocess.run(["cp", args.path, cp_dst], check=True)
        cps.append(time.perf_counter() - t0)
        subprocess.run(["sync", cp_dst], check=True)  # fsync the copy, like a durable publish
        cp_syncs.append(time.perf_counter() - t0)
        os.unlink(cp_dst)
        runs.append(child("run", args.path, dst))
    for p in (dst, cp_dst):
        if os.path.exists(p):
            os.unlink(p)
    result = {
        "file_size": os.path.getsize(args.path),
        "replaced_bytes": runs[0]["replaced_bytes"],
        "specialize_s_median": round(statistics.median(r["seconds"] for r in runs), 3),
        "cp_s_median": round(statistics.median(cps), 3),
        "cp_and_fsync_s_median": round(statistics.median(cp_syncs), 3),
        "peak_rss_mib": round(max(r["maxrss_kib"] for r in runs) / 1024, 1),
        "baseline_rss_mib": round(base["maxrss_kib"] / 1024, 1),
        "self_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
