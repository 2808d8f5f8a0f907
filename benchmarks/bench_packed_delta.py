"""Benchmark: what a device downloads to get the XNNPACK packed-weight file of a model's
new version when it holds the last version's (delta delivery, ``ptestore.fleet.packed_chunks``).

    python benchmarks/bench_packed_delta.py [--layers 64] [--dim 2048] [--factor 2]
        [--server seaweedfs|moto] [--runs 2] [--dir DIR] [--reshape]

The model is a real export (``scripts/make_xnnpack_models.py linear``: ``--layers`` x
Linear(dim, dim) with bias, fp32; 64 x 2048 is the 1 GiB program). A real fleet run
(SeaweedFS ``weed mini`` or moto, in its own process) specializes it for one device
that declares this machine's CPU (``xnnpack_cpu``), so the run makes the packed-weight
file with the stock runtime and records its chunk digests; version 1 uses
``support.delta:Scale=1`` (values unchanged), version 2 ``Scale=--factor`` (the first
named value in key order multiplied: one weight, or one bias, changed). With
``--reshape`` version 2 is another export instead: the same layers but two in the middle
of other shapes (Linear(dim, 1.5 dim), Linear(1.5 dim, dim)), so their packed regions
are new and every region after them moved.

The device fetches version 1 with ``xnnpack_cache=True`` (its packed file delivered
whole), then version 2's ``.pte`` with ``--base`` its own (not counted here:
``bench_delta_fetch.py``). Then, each a fresh process, through an HTTP proxy in front
of the server that counts the bytes it sent (tests/support/faulty_proxy.py), ``--runs``
times interleaved:

- ``whole``: version 2 with its packed file into an empty directory (no earlier file:
  downloaded whole, hashed as it arrives);
- ``delta``: the same into a directory that holds version 1's packed file (the chunks
  it holds at the same offsets cloned or copied and checked, the others downloaded).

Reported: the packed file's size, the bytes of its chunks that differ from the old
file's at the same offsets (what a delivery that does not follow moved regions
downloads), per case the bytes the server sent, the packed file's bytes from the store
and from the earlier file, and the child's wall seconds (the ``.pte``'s own fetch with
its base included: it takes every chunk from the base, reading its tail only).
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
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]

from _proxied import run_child  # noqa: E402  (beside this script)

CHILD = r"""
import json, sys, time
sys.path[:0] = sys.argv[2:4]
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
import ptestore
got = ptestore.fetch(args["index"], args["dest"], model="m", device="phone",
                     storage_options=args["opts"], xnnpack_cache=True, base=args["base"])
out = {k: got.xnnpack[k] for k in ("size", "received", "from_base")}
out["seconds"] = time.perf_counter() - t0
print(json.dumps(out))
"""

MiB = 1 << 20


def _run(job: Path, env: dict[str, str]) -> str:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", "1", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"fleet run {job}: {proc.stderr[-3000:]}")
    run = json.loads(proc.stdout)
    print(
        f"{job.name}: {run['pairs'][0].get('xnnpack')} in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    return str(run["index"])


def _one(case: str, index: str, dest: Path, opts: dict[str, Any], proxy: Any) -> dict[str, Any]:
    args = {"index": index, "dest": str(dest), "base": str(dest), "opts": opts}
    return run_child(CHILD, args, proxy, case)


def _reshaped(d: Path, layers: int, dim: int) -> tuple[Path, Path]:
    """The ``linear`` program and the same with layers ``layers // 2`` and the next of
    other shapes (the other layers' weights the same)."""
    import torch
    from make_xnnpack_models import _lower
    from torch import nn

    torch.manual_seed(0)
    a = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)]).eval()
    mid, wide = layers // 2, dim * 3 // 2
    b = nn.Sequential(*a[:mid], nn.Linear(dim, wide), nn.Linear(wide, dim), *a[mid + 2 :]).eval()
    x = (torch.randn(1, dim),)
    out = []
    for name, module in (("a", a), ("b", b)):
        path = d / f"reshape-{name}-{layers}x{dim}.pte"
        if not path.exists():
            _lower(module, x, path, False)
        out.append(path)
    return out[0], out[1]


def _changed(a: Path, b: Path) -> int:
    """Bytes of the 4 MiB chunks of ``b`` that ``a`` does not hold at the same offsets."""
    n, chunk = 0, 4 * MiB
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if not y:
                return n
            n += len(y) if x != y else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--factor", default="2")
    ap.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", help="working directory (default: a temporary one)")
    ap.add_argument("--reshape", action="store_true", help="version 2: two layers reshaped")
    args = ap.parse_args()
    from support.delta import packed_job
    from support.faulty_proxy import faulty_proxy
    from support.s3job import s3_options_toml

    from ptestore.fleet.index import load_index

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    with ExitStack() as stack:
        tmp = Path(args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        tmp.mkdir(parents=True, exist_ok=True)
        if args.reshape:
            sources = _reshaped(tmp, args.layers, args.dim)
            factors = ("1", "1")
        else:
            source = tmp / f"linear-{args.layers}x{args.dim}.pte"
            if not source.exists():
                from make_xnnpack_models import export_linear_stack

                export_linear_stack(source, layers=args.layers, dim=args.dim)
            sources, factors = (source, source), ("1", args.factor)
        if args.server == "seaweedfs":
            from ptestore.testing.seaweedfs import seaweedfs_s3_server

            server: Any = stack.enter_context(seaweedfs_s3_server(tmp))
        else:
            from ptestore.testing.moto import moto_s3_server

            server = stack.enter_context(moto_s3_server())
        bucket = server.new_bucket()
        opts = server.storage_options
        options = s3_options_toml(opts)
        import ptestore

        index = _run(packed_job(tmp, sources[0], f"s3://{bucket}/fleet", factors[0], options), env)
        first = tmp / "v1" / "m.pte"
        shutil.rmtree(first.parent, ignore_errors=True)
        old = ptestore.fetch(
            index, first, model="m", device="phone", storage_options=opts, xnnpack_cache=True
        ).xnnpack
        assert old is not None and old["path"]
        index = _run(packed_job(tmp, sources[1], f"s3://{bucket}/fleet", factors[1], options), env)
        field = load_index(index, **opts)["entries"][0]["xnnpack"]
        ptestore.fetch(index, first, model="m", device="phone", storage_options=opts, base=first)
        endpoint, proxy = stack.enter_context(faulty_proxy(server.endpoint_url, every=0))
        via = {**opts, "endpoint_url": endpoint}
        runs: dict[str, list[dict[str, Any]]] = {"whole": [], "delta": []}
        changed = None
        for r in range(args.runs):
            for case in runs:
                d = tmp / f"dev-{case}-{r}"
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir()
                shutil.copyfile(first, d / "m.pte")
                if case == "delta":
                    shutil.copyfile(old["path"], d / Path(old["path"]).name)
                runs[case].append(_one(case, index, d / "m.pte", via, proxy))
                if changed is None:
                    new = [p for p in d.glob("xnnpack-*.xpwc") if p.name != Path(old["path"]).name]
                    changed = _changed(Path(old["path"]), new[0])
                shutil.rmtree(d, ignore_errors=True)
        summary = {
            case: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for case, rs in runs.items()
        }
        out = {
            "server": args.server,
            "model": f"{args.layers} x Linear({args.dim}, {args.dim}) fp32",
            "reshape": args.reshape,
            "pte_bytes": first.stat().st_size,
            "packed_bytes": field["size"],
            "changed_chunk_bytes": changed,
            "runs": args.runs,
            "median": summary,
            "all": runs,
        }
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
