"""Benchmark: fleet throughput (pairs per minute) and bytes through the client per pair.

    python benchmarks/bench_fleet.py [--devices 20] [--workers 2] [--server seaweedfs]
    python benchmarks/bench_fleet.py --profile 12 [--server seaweedfs]

Three real fixtures (tests/fixtures: mlp_xnnpack, conv_xnnpack, mlp_xnnpack_ext with its
.ptd) x ``--devices`` device profiles, specialized by a backend that rescales every
float32 weight by a device option, published to a real S3 server on 127.0.0.1:
SeaweedFS (``weed mini``, the default) or moto (``--server moto``), each in its own
process. Each engine runs the same job into its own prefix, from empty:

- the local process pool (``--workers`` processes),
- a Dask ``LocalCluster`` with ``--workers`` worker processes, one thread each
  (the cluster is started before the clock starts).

Then a second run of the pool's job (everything skipped) shows what a rerun costs.
Times are end to end: the plan (each source read and hashed once, one ranged read of
each destination's end) plus the run. Each row also gives the CPU time of the whole run
(this process and its children, the S3 server excluded) per pair.

``--profile N`` runs pairs in this process (``workers=1``) instead, after one warm-up
pair: N without a profiler (wall and CPU time per pair in a warm worker), then N under
cProfile (the functions that take the most of it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
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


@contextlib.contextmanager
def _server(kind: str) -> Iterator[tuple[str, str, str]]:
    """(endpoint, access key, secret key) of a running S3 server."""
    if kind == "moto":
        moto, endpoint = _start_moto()
        try:
            yield endpoint, "testing", "testing"
        finally:
            moto.terminate()
            moto.wait()
        return
    from ptestore.testing.seaweedfs import seaweedfs_s3_server

    with seaweedfs_s3_server() as s3:
        yield s3.endpoint_url, s3.access_key, s3.secret_key


def _job(path: Path, server: tuple[str, str, str], bucket: str, prefix: str, devices: int) -> Path:
    from support.fixtures import get_fixture

    endpoint, key, secret = server
    lines = [
        f'destination = "s3://{bucket}/{prefix}/{{device}}/{{model}}.pte"',
        'backends = ["support.fleet_backend:Scaler=1.0"]',
        "[storage_options]",
        f'endpoint_url = "{endpoint}"',
        f'key = "{key}"',
        f'secret = "{secret}"',
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


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _row(name: str, result: Any, cpu: float) -> dict[str, Any]:
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
        "cpu_ms_per_pair": round(cpu / n * 1000),
    }


def _profile(job: Any, count: int) -> None:
    """Profile ``count`` pairs inline: this thread, and fsspec's I/O thread (where s3fs
    and aiobotocore run every request) with a profiler of its own."""
    import cProfile
    import pstats
    import threading

    import fsspec.asyn

    from ptestore.fleet import plan_job
    from ptestore.fleet.work import run_pair

    tasks = [p.task for p in plan_job(job).pairs if p.task is not None]
    assert len(tasks) > 2 * count, "--profile needs more than 2N pairs (raise --devices)"
    run_pair(tasks[0])  # warm-up: imports, the backend, first connections
    # The first N pairs without a profiler: what a pair costs in a warm worker.
    c0, t0 = _cpu(), time.perf_counter()
    plain = [run_pair(t) for t in tasks[1 : count + 1]]
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    assert all(r.status == "done" for r in plain), [r.error for r in plain]
    print(
        f"{count} pairs inline, no profiler: {wall / count * 1000:.1f} ms wall, "
        f"{cpu / count * 1000:.1f} ms CPU per pair"
    )
    tasks = tasks[count:]
    loop = fsspec.asyn.get_loop()
    main, io = cProfile.Profile(), cProfile.Profile()

    def on_loop(fn: Any) -> None:
        ready = threading.Event()
        loop.call_soon_threadsafe(lambda: (fn(), ready.set()))
        ready.wait()

    c0, t0 = _cpu(), time.perf_counter()
    on_loop(io.enable)
    main.enable()
    results = [run_pair(t) for t in tasks[1 : count + 1]]
    main.disable()
    on_loop(io.disable)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    assert all(r.status == "done" for r in results), [r.error for r in results]
    print(
        f"{count} pairs inline: {wall / count * 1000:.1f} ms wall, "
        f"{cpu / count * 1000:.1f} ms CPU per pair (profiler overhead included)"
    )
    print("== the calling thread ==")
    pstats.Stats(main).sort_stats("cumulative").print_stats(40)
    print("== fsspec's I/O thread (s3fs, aiobotocore) ==")
    pstats.Stats(io).sort_stats("tottime").print_stats(40)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--server", choices=("seaweedfs", "moto"), default="seaweedfs")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()

    import boto3
    import distributed
    from support.fixtures import get_fixture

    from ptestore.fleet import load_job, plan_job, run_plan

    with _server(args.server) as server:
        endpoint, key, secret = server
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
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
        if args.profile:
            job = load_job(_job(tmp / "p.toml", server, bucket, "p", args.devices))
            _profile(job, args.profile)
            return 0

        def timed(name: str, job: Any, **engine: Any) -> None:
            # End to end: the plan (one read per source, one ranged read per
            # destination) and the run.
            c0, t0 = _cpu(), time.perf_counter()
            result = run_plan(plan_job(job), **engine)
            result.seconds = time.perf_counter() - t0
            rows.append(_row(name, result, _cpu() - c0))

        pool_job = load_job(_job(tmp / "pool.toml", server, bucket, "pool", args.devices))
        timed(f"process pool ({args.workers} processes)", pool_job, workers=args.workers)
        cluster = distributed.LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
        try:
            with distributed.Client(cluster) as c:
                c.run(lambda: __import__("ptestore.fleet"))  # warm the workers' imports
            dask_job = load_job(_job(tmp / "dask.toml", server, bucket, "dask", args.devices))
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
        print(
            "| engine | pairs | done / skipped / failed | time | pairs/min | bytes/pair "
            "| CPU/pair |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['engine']} | {r['pairs']} | {r['done']} / {r['skipped']} / {r['failed']} "
                f"| {r['seconds']} s | **{r['pairs_per_minute']}** | {r['bytes_per_pair']:,} "
                f"| {r['cpu_ms_per_pair']} ms |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
