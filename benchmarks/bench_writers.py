"""Writer benchmarks: local throughput against ``cp``; S3 writer peak memory against moto.

Usage::

    python benchmarks/bench_writers.py local [--size-mib 1024] [--dir DIR] [--runs 3]
    python benchmarks/bench_writers.py s3 [--size-mib 1024] [--part-mib 8]

``local`` times, on a warm page cache, copying a SIZE file with ``cp``, ``cp`` + fsync
(what a durable publish costs), and ptestore's LocalFileWriter fed through Python
(``write()`` of 8 MiB chunks) and through ``copy_from`` (``copy_file_range``).

``s3`` starts moto's server in its *own* process (moto buffers every part in memory)
and runs each writer scenario in a fresh child process, reporting that child's peak
RSS (``ru_maxrss``), so moto's memory is not counted. Data is generated from one 1 MiB
pattern, so the source itself costs no memory.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

MiB = 1 << 20


def _fmt(seconds: float, size: int) -> str:
    return f"{seconds:6.2f} s  {size / MiB / seconds:8.0f} MiB/s"


def bench_local(size_mib: int, directory: str | None, runs: int) -> None:
    from ptestore.storage.loaders import LocalFileLoader
    from ptestore.writers import LocalFileWriter

    size = size_mib * MiB
    with tempfile.TemporaryDirectory(dir=directory, prefix="ptestore-bench-") as d:
        src = os.path.join(d, "src.bin")
        block = os.urandom(MiB)
        with open(src, "wb") as f:
            for _ in range(size_mib):
                f.write(block)
        with open(src, "rb") as f:  # warm the cache for every contender alike
            while f.read(64 * MiB):
                pass
        results: dict[str, list[float]] = {}

        def timed(name: str, fn: object) -> None:
            dst = os.path.join(d, "dst.bin")
            os.sync()  # start every run with no dirty pages from the previous one
            t = time.perf_counter()
            fn(dst)  # type: ignore[operator]
            results.setdefault(name, []).append(time.perf_counter() - t)
            os.unlink(dst)

        def cp(dst: str) -> None:
            subprocess.run(["cp", src, dst], check=True)

        def cp_fsync(dst: str) -> None:
            subprocess.run(["cp", src, dst], check=True)
            fd = os.open(dst, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            dfd = os.open(d, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

        def writer_python(dst: str) -> None:
            w = LocalFileWriter(dst)
            with open(src, "rb", buffering=0) as f:
                off = 0
                while chunk := f.read(8 * MiB):
                    w.write(chunk, off)
                    off += len(chunk)
            w.publish()

        def writer_copy_from(dst: str) -> None:
            w = LocalFileWriter(dst)
            with LocalFileLoader(src) as loader:
                w.copy_from(loader, 0, loader.size(), 0)
            w.publish()

        def writer_copy_from_nodurable(dst: str) -> None:
            w = LocalFileWriter(dst, durable=False)
            with LocalFileLoader(src) as loader:
                w.copy_from(loader, 0, loader.size(), 0)
            w.publish()

        contenders = [
            ("cp", cp),
            ("cp+fsync", cp_fsync),
            ("LocalFileWriter.write (8 MiB chunks, durable)", writer_python),
            ("LocalFileWriter.copy_from (copy_file_range, durable)", writer_copy_from),
            ("LocalFileWriter.copy_from (durable=False)", writer_copy_from_nodurable),
        ]
        for r in range(runs):  # interleaved, so drift hits every contender alike ...
            # ... and rotated: the run after a deleted 1 GiB output is slower here
            # (whichever contender it is), so each takes every place in turn
            k = r % len(contenders)
            for name, fn in contenders[k:] + contenders[:k]:
                timed(name, fn)
        print(f"local, {size_mib} MiB, warm cache, median of {runs} runs, {d}")
        for name, secs in results.items():
            print(f"  {name:<55} {_fmt(statistics.median(secs), size)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_CHILD = r"""
import json, os, resource, sys, time
from ptestore.writers import open_writer
cfg = json.loads(sys.argv[1])
MiB = 1 << 20
pattern = os.urandom(MiB)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
w = open_writer(cfg["url"], **cfg["options"])
n = cfg["size_mib"]
order = list(range(n))
if cfg["scenario"] == "first-part-last":
    order = order[8:] + order[:8]       # the .pte metadata region (part 1) written last
t = time.perf_counter()
for i in order:
    w.write(pattern, i * MiB)
res = w.publish()
took = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"baseline_kib": base, "peak_kib": peak, "seconds": took, "size": res.size,
                  "checksum": res.checksum}))
"""


def bench_s3(size_mib: int, part_mib: int) -> None:
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="x",
            aws_secret_access_key="x",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="bench")
        options = {
            "endpoint_url": endpoint,
            "key": "x",
            "secret": "x",
            "client_kwargs": {"region_name": "us-east-1"},
            "part_size": part_mib * MiB,
        }
        print(f"s3 (moto server in its own process), {size_mib} MiB, {part_mib} MiB parts")
        for scenario, extra in [
            ("sequential", {}),
            ("first-part-last", {}),
            ("sequential", {"spool": False}),
        ]:
            cfg = {
                "url": f"s3://bench/{scenario}.bin",
                "options": {**options, **extra},
                "size_mib": size_mib,
                "scenario": scenario,
            }
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, json.dumps(cfg)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            label = scenario + (" spool=False" if extra else "")
            print(
                f"  {label:<28} writer peak RSS {r['peak_kib'] / 1024:7.1f} MiB "
                f"(after imports {r['baseline_kib'] / 1024:6.1f} MiB), "
                f"{_fmt(r['seconds'], r['size'])}"
            )
            client.delete_object(Bucket="bench", Key=f"{scenario}.bin")
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("local")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--dir", default=None, help="where to put the files (default: temp dir)")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("s3")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--part-mib", type=int, default=8)
    args = parser.parse_args()
    if args.what == "local":
        bench_local(args.size_mib, args.dir, args.runs)
    else:
        bench_s3(args.size_mib, args.part_mib)


if __name__ == "__main__":
    main()
