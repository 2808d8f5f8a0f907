"""Benchmark: what a fetch moves from the store when the device already holds the last
version of an artifact (delta fetch, issue 28 part 2).

    python benchmarks/bench_delta_fetch.py [--mib-per-key 256] [--changed-mib 16]
        [--server seaweedfs|moto] [--runs 3] [--dir DIR] [--xfs] [--moved]

The artifact is the real export ``mlp_xnnpack`` (tests/fixtures) with each of its four
named values ``--mib-per-key`` MiB of seeded noise (tests/support/large.py; 256: a
1 GiB program), specialized twice by a backend that rewrites ``--changed-mib`` MiB of
its first value from an offset that is not chunk-aligned (``support.delta.Rewrite``):
version 1 and version 2 differ in those bytes (and their trailers). With ``--moved``
the backend grows its first value instead (``support.delta.Grow``: seeded noise
appended, a replacement of another size, as packed weights are), by half of
``--changed-mib`` MiB + 12,345 B in version 1 and by ``--changed-mib`` MiB + 12,345 B
in version 2: every segment after it moves, in each version by another amount, and
``delta`` and ``portable`` find them where their base keeps them (``ptestore.fleet.shift``).
Version 2 is uploaded to
a local S3 server (SeaweedFS ``weed mini`` or moto, in its own process); each measured
fetch is a fresh process (``python -c``) that downloads version 2 through an HTTP proxy
in front of the server (tests/support/faulty_proxy.py, which counts the response bytes
the server sent, its side of "moved"), with the S3 client's own counts beside
(``ptestore.testing.s3_traffic``: object bytes received by ``GetObject``). Cases,
interleaved ``--runs`` times:

- ``full``: no base, every chunk downloaded and verified;
- ``delta``: ``--base`` version 1 (its trailer's chunk record trusted for planning,
  every chunk taken from it checked against version 2's record);
- ``portable``: ``--base`` the exporter's source (no record: its chunks hashed where
  they could match).

And ``cp``: ``cp --reflink=never`` of version 1 + ``sync FILE``, the cost of writing
the file on that disk at all (the floor of a delta fetch that copies).

Reported per case: bytes the server sent (proxy), object bytes the client received,
GET requests, bytes taken from the base, wall and CPU seconds of the child, the machine's
load; the medians across runs. The proxy is Python and buffers each response: the
times of ``full`` include its copy of every byte (compare the cases, not with ``curl``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _proxied import run_child  # noqa: E402  (beside this script)

CHILD = r"""
import json, os, sys, time
sys.path[:0] = sys.argv[2:4]
args = json.loads(sys.argv[1])
import aiobotocore.session
import ptestore
from ptestore.testing.s3_traffic import Traffic

session = aiobotocore.session.AioSession()
traffic = Traffic().attach(session)
opts = {**args["opts"], "session": session}
t = os.times(); cpu0 = t.user + t.system; t0 = time.perf_counter()
result = ptestore.fetch(args["url"], args["dest"], base=args["base"], storage_options=opts)
seconds = time.perf_counter() - t0
t = os.times()
(f,) = result.files
s = traffic.summary()
print(json.dumps({
    "seconds": seconds, "cpu_seconds": t.user + t.system - cpu0,
    "client_data_received": s["data_received"], "gets": s["calls"].get("GetObject", 0),
    "received": f["received"], "from_base": f["from_base"], "cloned": f["cloned"],
    "verified": f["verified"],
}))
"""


def _make(d: Path, mib_per_key: int, changed_mib: int, moved: bool) -> tuple[Path, Path, Path]:
    from support.delta import Grow, Rewrite, differing, program

    import ptestore

    src = program(d, mib_per_key << 20)
    out = []
    for stamp in ("1", "2"):
        path = d / f"v{stamp}{'-moved' if moved else ''}.pte"
        if moved:
            extra = (changed_mib << 20) // (3 - int(stamp)) + 12345
            backend: Any = Grow(extra, stamp)
        else:
            backend = Rewrite(stamp, changed_mib << 20)
        ptestore.specialize(src, path, backends=[backend])
        out.append(path)
    changed = "moved layouts" if moved else f"chunks that differ: {differing(out[0], out[1])}"
    print(f"made {src.stat().st_size >> 20} MiB; {changed}", file=sys.stderr)
    return src, out[0], out[1]


def _one(
    case: str, url: str, base: Path | None, opts: dict[str, Any], tmp: Path, proxy: Any
) -> Any:
    dest = tmp / f"dl-{case}-{time.monotonic_ns()}" / "m.pte"
    args = {"url": url, "dest": str(dest), "base": None if base is None else str(base)}
    args["opts"] = opts
    got = run_child(CHILD, args, proxy, case)
    dest.unlink()
    return got


def _copy(base: Path, work: Path) -> dict[str, Any]:
    """The reference: a durable local copy of the base (``cp --reflink=never`` +
    ``sync FILE``), what any full rewrite of the file costs on this disk."""
    dest = work / f"cp-{time.monotonic_ns()}.pte"
    t0 = time.perf_counter()
    subprocess.run(["cp", "--reflink=never", str(base), str(dest)], check=True)
    subprocess.run(["sync", str(dest)], check=True)
    seconds = time.perf_counter() - t0
    dest.unlink()
    return {"seconds": seconds, "loadavg": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib-per-key", type=int, default=256)
    ap.add_argument("--changed-mib", type=int, default=16)
    ap.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="working directory (default: a temporary one)")
    ap.add_argument(
        "--xfs",
        action="store_true",
        help="put the bases and the downloads on a loop-mounted XFS with reflink (root, "
        "mkfs.xfs): chunks from a base are cloned, not copied",
    )
    ap.add_argument(
        "--moved",
        action="store_true",
        help="versions whose first value grew (by half of --changed-mib, then by all of "
        "it): the segments after it moved",
    )
    args = ap.parse_args()
    from support.faulty_proxy import faulty_proxy

    with ExitStack() as stack:
        tmp = Path(args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        tmp.mkdir(parents=True, exist_ok=True)
        src, v1, v2 = _make(tmp, args.mib_per_key, args.changed_mib, args.moved)
        if args.server == "seaweedfs":
            from ptestore.testing.seaweedfs import seaweedfs_s3_server

            server: Any = stack.enter_context(seaweedfs_s3_server(tmp))
        else:
            from ptestore.testing.moto import moto_s3_server

            server = stack.enter_context(moto_s3_server())
        if args.xfs:
            import shutil

            from support.xfs import xfs_reflink_mount

            mount = stack.enter_context(xfs_reflink_mount("4G"))
            for name in ("src", "v1"):
                path = {"src": src, "v1": v1}[name]
                shutil.copyfile(path, mount.path / path.name)
            src, v1 = mount.path / src.name, mount.path / v1.name
            work = mount.path
        else:
            work = tmp
        bucket = server.new_bucket()
        server.client().upload_file(str(v2), bucket, "m/v2.pte")
        endpoint, proxy = stack.enter_context(faulty_proxy(server.endpoint_url, every=0))
        opts = {**server.storage_options, "endpoint_url": endpoint}
        url = f"s3://{bucket}/m/v2.pte"
        cases = {"full": None, "delta": v1, "portable": src}
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in [*cases, "cp"]}
        for _ in range(args.runs):
            for case, base in cases.items():
                runs[case].append(_one(case, url, base, opts, work, proxy))
            runs["cp"].append(_copy(v1, work))
        summary: dict[str, Any] = {}
        for case, rs in runs.items():
            summary[case] = {
                k: statistics.median(r[k] for r in rs)
                for k in rs[0]
                if isinstance(rs[0][k], int | float)
            }
            if "verified" in rs[0]:
                summary[case]["verified"] = rs[0]["verified"]
        out = {
            "server": args.server,
            "file_system": "xfs (reflink)" if args.xfs else "the --dir's",
            "artifact_bytes": v2.stat().st_size,
            "changed_bytes": args.changed_mib << 20,
            "moved": args.moved,
            "runs": args.runs,
            "median": summary,
            "all": runs,
        }
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
