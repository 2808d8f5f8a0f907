"""Benchmark: fleet throughput (pairs per minute) and bytes through the client per pair.

    python benchmarks/bench_fleet.py [--devices 20] [--workers 2]

Three real fixtures (tests/fixtures: mlp_xnnpack, conv_xnnpack, mlp_xnnpack_ext with its
.ptd) x ``--devices`` device profiles, specialized by a backend that rescales every
float32 weight by a device option, published to moto's S3 server (in its own process).
Each engine runs the same job into its own prefix, from empty:

- the local process pool (``--workers`` processes),
- a Dask ``LocalCluster`` with ``--workers`` worker processes, one thread each
  (the cluster is started before the clock starts).

Then a second run of the pool's job (everything skipped) shows what a rerun costs.
Times are end to end: the plan (each source read and hashed once, one ranged read of
each destination's end) plus the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

FIXTURES = ["mlp_xnnpack", "conv_xnnpack", "mlp_xnnpack_ext"]


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, S3_UPLOAD_PART_MIN_SIZE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except Exception:
            time.sleep(0.1)
    return proc, url


def _job(path: Path, endpoint: str, bucket: str, prefix: str, devices: int) -> Path:
    from support.fixtures import get_fixture

    lines = [
        f'destination = "s3://{bucket}/{prefix}/{{device}}/{{model}}.pte"',
        'backends = ["support.fleet_backend:Scaler=1.0"]',
        "[storage_options]",
        f'endpoint_url = "{endpoint}"',
        'key = "testing"',
        'secret = "testing"',
        "[storage_options.client_kwargs]",
        'region_name = "us-east-1"',
    ]
    for name in FIXTURES:
        fx = get_fixture(name)
        lines += ["[[models]]", f'name = "{name}"', f'source = "s3://{bucket}/src/{name}.pte"']
        if fx.ptd_path is not None:
            lines.append(f'ptd = "s3://{bucket}/src/{name}.ptd"')
    for i in range(devices):
        lines += [f"[devices.dev{i:03d}]", f'soc = "soc-{i % 4}"', f"scale = {1 + i / 16}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _row(name: str, result: Any) -> dict[str, Any]:
    n = len(result.pairs)
    return {
        "engine": name,
        "pairs": n,
        "done": result.count("done"),
        "skipped": result.count("skipped"),
        "failed": result.count("failed"),
        "seconds": round(result.seconds, 2),
        "pairs_per_minute": round(n / result.seconds * 60, 1),
        "bytes_per_pair": round(result.bytes / n),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import boto3
    import distributed
    from support.fixtures import get_fixture

    from ptestore.fleet import load_job, plan_job, run_plan

    moto, endpoint = _start_moto()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        for name in FIXTURES:
            fx = get_fixture(name)
            assert fx.pte_path is not None
            client.put_object(Bucket=bucket, Key=f"src/{name}.pte", Body=fx.pte_path.read_bytes())
            if fx.ptd_path is not None:
                client.put_object(
                    Bucket=bucket, Key=f"src/{name}.ptd", Body=fx.ptd_path.read_bytes()
                )
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-fleet-{uuid.uuid4().hex[:6]}"
        tmp.mkdir()
        rows = []

        def timed(name: str, job: Any, **engine: Any) -> None:
            # End to end: the plan (one read per source, one ranged read per
            # destination) and the run.
            t0 = time.perf_counter()
            result = run_plan(plan_job(job), **engine)
            result.seconds = time.perf_counter() - t0
            rows.append(_row(name, result))

        pool_job = load_job(_job(tmp / "pool.toml", endpoint, bucket, "pool", args.devices))
        timed(f"process pool ({args.workers} processes)", pool_job, workers=args.workers)
        cluster = distributed.LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
        try:
            with distributed.Client(cluster) as c:
                c.run(lambda: __import__("ptestore.fleet"))  # warm the workers' imports
            dask_job = load_job(_job(tmp / "dask.toml", endpoint, bucket, "dask", args.devices))
            timed(
                f"Dask LocalCluster ({args.workers} workers)",
                dask_job,
                scheduler=cluster.scheduler_address,
            )
        finally:
            cluster.close()
        timed("rerun of the pool's job (all skipped)", pool_job, workers=1)
        print(json.dumps(rows, indent=2))
        print()
        print("| engine | pairs | done / skipped / failed | time | pairs/min | bytes/pair |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['engine']} | {r['pairs']} | {r['done']} / {r['skipped']} / {r['failed']} "
                f"| {r['seconds']} s | **{r['pairs_per_minute']}** | {r['bytes_per_pair']:,} |"
            )
    finally:
        moto.terminate()
        moto.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
