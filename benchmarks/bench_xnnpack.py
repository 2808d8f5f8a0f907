"""XNNPACK packed-weight files: load + first run in a fresh process, with and without.

    python benchmarks/bench_xnnpack.py [--models fp32_1g,int8_256m] [--repeats 3] [--cold]
        [--workdir /tmp/ptestore-bench-xnnpack]

For each program (exported into ``--workdir`` by scripts/make_xnnpack_models.py on first
use; never committed): the one-time cost of making the file (``make_cache``: three
runtime loads in two child processes, checks included), its size against the program's,
then ``--repeats`` fresh processes per mode, each timing :func:`ptestore.xnnpack.load`
(with a file: its check included, as an app pays it) + the first run of ``forward``
inside the process (interpreter and torch import excluded) and reporting its peak RSS.
The file's check (as ptestore checks it before it hands it out) is also timed on its
own: the quick check (record, identity, size, mode, index, and the inode stamp recorded
at publish; ``verify_cache(full=False)``) in every measured run, the full one (the
SHA-256 of the whole file) in two extra warm runs. The artifact's digest is passed in,
as the device cache does (it knows its entry's). The page cache is warm (one unmeasured
run first); ``--cold`` (root) also drops it (``echo 3 > /proc/sys/vm/drop_caches``)
before each run. The 1-minute load average is printed beside each figure: the machine
may be shared. Output: one JSON line per measurement,
then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODELS: dict[str, dict[str, Any]] = {
    "fp32_1g": {
        "layers": 64,
        "dim": 2048,
        "int8": False,
        "what": "1 GiB fp32, 64 Linear 2048x2048",
    },
    "int8_256m": {
        "layers": 16,
        "dim": 4096,
        "int8": True,
        "what": "256 MiB int8 dynamic-quant, 16 Linear 4096x4096",
    },
    "fp32_4g": {
        "layers": 64,
        "dim": 4096,
        "int8": False,
        "what": "4 GiB fp32, 64 Linear 4096x4096",
    },
    "fp32_small": {"layers": 4, "dim": 256, "int8": False, "what": "1 MiB fp32 (a smoke run)"},
}

CHILD = r"""
import json, resource, sys, time
import numpy as np
import torch
from ptestore.xnnpack import load
from ptestore.xnnpack.cache import verify_cache
pte, cache, dim, mode, digest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
full = mode == "full"
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
verify_s = None
if cache != "-":  # the check alone, timed apart (load() makes it again, as an app does)
    t = time.perf_counter()
    verify_cache(cache, pte=pte, pte_sha256=digest, full=full)
    verify_s = time.perf_counter() - t
x = np.random.default_rng(0).standard_normal((1, dim), dtype=np.float32)
t = time.perf_counter()
if cache == "-":
    prog = load(pte)
else:
    prog = load(pte, cache=cache, pte_sha256=digest, full=full)
out = prog.run("forward", [x])
load_s = time.perf_counter() - t
print(json.dumps({"load_first_run_s": load_s, "verify_s": verify_s,
                  "rss_before_load_kib": rss0,
                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "out_crc": int(np.frombuffer(out[0].tobytes(), np.uint8).sum())}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _export(name: str, workdir: Path) -> Path:
    spec = MODELS[name]
    pte = workdir / f"{name}.pte"
    if pte.is_file():
        return pte
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "make_xnnpack_models.py"),
        "linear",
        str(pte),
        "--layers",
        str(spec["layers"]),
        "--dim",
        str(spec["dim"]),
    ] + (["--int8"] if spec["int8"] else [])
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=_env(), stdout=subprocess.DEVNULL)
    print(f"# exported {pte} ({pte.stat().st_size} bytes) in {time.perf_counter() - t:.1f} s")
    return pte


_DIGESTS: dict[Path, str] = {}


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _one(pte: Path, cache: str, dim: int, verify: str = "quick") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(pte), cache, str(dim), verify, _DIGESTS[pte]],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"measured child failed ({done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="fp32_1g,int8_256m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also with a dropped page cache")
    parser.add_argument("--workdir", default="/tmp/ptestore-bench-xnnpack")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from ptestore.xnnpack import make_cache

    rows = []
    for name in args.models.split(","):
        spec = MODELS[name]
        pte = _export(name, workdir)
        load_make = os.getloadavg()[0]
        cache_dir = workdir / f"{name}.cache"
        shutil.rmtree(cache_dir, ignore_errors=True)  # measure the making every time
        made = make_cache(pte, directory=cache_dir)
        _DIGESTS[pte] = made.identity.pte_sha256
        row: dict[str, Any] = {
            "model": name,
            "what": spec["what"],
            "pte_bytes": pte.stat().st_size,
            "file_bytes": made.size,
            "make_s": made.make_seconds,
            "make_load": load_make,
        }
        print(json.dumps({"make": row}), flush=True)
        modes = [("warm", False)] + ([("cold", True)] if args.cold else [])
        for label, cold in modes:
            for with_file in (False, True):
                cache = str(made.path) if with_file else "-"
                if not cold:
                    _one(pte, cache, spec["dim"])  # warm the page cache, unmeasured
                runs = []
                for _ in range(args.repeats):
                    if cold:
                        _drop_caches()
                    la = os.getloadavg()[0]
                    r = _one(pte, cache, spec["dim"])
                    r["load1"] = la
                    runs.append(r)
                    print(
                        json.dumps({"model": name, "mode": label, "file": with_file, **r}),
                        flush=True,
                    )
                key = f"{label}_{'file' if with_file else 'nofile'}"
                row[key + "_s"] = statistics.median(r["load_first_run_s"] for r in runs)
                row[key + "_rss_mib"] = max(r["peak_rss_kib"] for r in runs) / 1024
                row[key + "_rss_delta_mib"] = (
                    max(r["peak_rss_kib"] - r["rss_before_load_kib"] for r in runs) / 1024
                )
                row[key + "_load1"] = statistics.median(r["load1"] for r in runs)
                if with_file:
                    row[key + "_verify_s"] = statistics.median(r["verify_s"] for r in runs)
                    if not cold:  # the full check (SHA-256 of the whole file), timed apart
                        full = [_one(pte, cache, spec["dim"], "full") for _ in range(2)]
                        row["full_verify_s"] = statistics.median(r["verify_s"] for r in full)
                        print(json.dumps({"model": name, "full_verify": full}), flush=True)
                crcs = {r["out_crc"] for r in runs}
                row.setdefault("crcs", set()).update(crcs)
        row["bit_identical_sum"] = len(row.pop("crcs")) == 1
        rows.append(row)
    print()
    print(
        "| program | mode | no file: load + first run | with the file | ratio | quick check "
        "| peak RSS no file -> file (of which the load) | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for label in ("warm", "cold"):
            if f"{label}_nofile_s" not in row:
                continue
            a, b = row[f"{label}_nofile_s"], row[f"{label}_file_s"]
            print(
                f"| {row['what']} | {label} | {a:.3f} s | {b:.3f} s | {a / b:.1f}x | "
                f"{row[f'{label}_file_verify_s']:.3f} s | "
                f"{row[f'{label}_nofile_rss_mib']:.0f} -> {row[f'{label}_file_rss_mib']:.0f} MiB "
                f"({row[f'{label}_nofile_rss_delta_mib']:.0f} -> "
                f"{row[f'{label}_file_rss_delta_mib']:.0f} MiB) | "
                f"{row[f'{label}_nofile_load1']:.2f} / {row[f'{label}_file_load1']:.2f} |"
            )
    print()
    print("| program | .pte | packed-weight file | making it (once) | full check | load avg |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['what']} | {row['pte_bytes'] / 2**20:.0f} MiB | "
            f"{row['file_bytes'] / 2**20:.0f} MiB ({row['file_bytes'] / row['pte_bytes']:.2f}x) | "
            f"{row['make_s']:.1f} s | {row.get('full_verify_s', float('nan')):.2f} s | "
            f"{row['make_load']:.2f} |"
        )


if __name__ == "__main__":
    main()
