"""Benchmark: a job of one model with a large .ptd for many devices stores the .ptd once.

    python benchmarks/bench_shared_ptd.py [--ptd-mib 1024] [--devices 20] [--server seaweedfs]

The model is the real export mlp_xnnpack_ext (tests/fixtures) with every named value
of its .ptd made ``--ptd-mib`` / (number of keys) MiB of seeded random bytes by ptestore
itself (tests/support/large.py's ``Inflate``: real metadata and keys; the weights are
noise). It is uploaded to a local S3 server (SeaweedFS ``weed mini`` or moto, each in its
own process), then one fleet job specializes it for ``--devices`` device profiles
inline (``--workers 1``) with a backend that leaves the weights alone (passthrough of
the XNNPACK id: every .pte is the device's own, by its provenance). Reported:

- stored: the bytes and objects under the job's prefix (index excluded), against the
  naive layout (every device its own .pte and .ptd);
- bytes through the client: what ptestore counts (``fleet run --json`` ``bytes``, an
  upper bound: it counts every byte an output has, also those the service copied) and
  the HTTP body bytes every S3 client of the run really sent and received (botocore
  event hooks on one session given to every side, ``ptestore.testing.s3_traffic``), with
  the calls per operation;
- time and CPU time of the first run and of a rerun (every pair skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _make(tmp: Path, ptd_mib: int) -> tuple[Path, Path]:
    from support.fixtures import get_fixture
    from support.large import Inflate

    import ptestore
    from ptestore.backends import BackendInterface  # noqa: F401  (the Inflate base)

    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    from ptestore.format.reader import read_container
    from ptestore.storage.loaders import open_loader

    loader = open_loader(fx.ptd_path)
    try:
        keys = len(read_container(loader).container.named_data)
    finally:
        loader.close()
    pte, ptd = tmp / "big.pte", tmp / "big.ptd"
    per_key = (ptd_mib << 20) // max(1, keys)
    ptestore.specialize(
        fx.pte_path, pte, ptd=(fx.ptd_path, ptd), backends=[Inflate("XnnpackBackend", per_key)]
    )
    return pte, ptd


def _stored(client: Any, bucket: str) -> tuple[int, int, int]:
    total = count = ptds = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="out/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("ptestore-index.json"):
                continue
            total += obj["Size"]
            count += 1
            ptds += obj["Key"].endswith(".ptd")
    return total, count, ptds


def _run(job: Path) -> dict[str, Any]:
    import dataclasses

    import aiobotocore.session

    from ptestore.fleet import load_job, run_job
    from ptestore.testing.s3_traffic import Traffic

    session = aiobotocore.session.AioSession()
    traffic = Traffic().attach(session)
    loaded = load_job(job)
    loaded = dataclasses.replace(
        loaded, storage_options={**loaded.storage_options, "session": session}
    )
    cpu0, t0 = _cpu(), time.perf_counter()
    result = run_job(loaded, workers=1)
    seconds = time.perf_counter() - t0
    statuses = sorted({p.status for p in result.pairs})
    assert statuses in (["done"], ["skipped"]), [p.error for p in result.pairs]
    t = traffic.summary()
    return {
        "status": statuses[0],
        "seconds": round(seconds, 2),
        "cpu_seconds": round(_cpu() - cpu0, 2),
        "ptestore_bytes": result.bytes,
        "bytes_sent": t["bytes_sent"],
        "bytes_received": t["bytes_received"],
        "calls": t["calls"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ptd-mib", type=int, default=1024)
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs")
    args = ap.parse_args()
    from contextlib import ExitStack

    with tempfile.TemporaryDirectory(prefix="bench-shared-") as d, ExitStack() as stack:
        tmp = Path(d)
        t0 = time.perf_counter()
        pte, ptd = _make(tmp, args.ptd_mib)
        made = time.perf_counter() - t0
        if args.server == "seaweedfs":
            from ptestore.testing.seaweedfs import seaweedfs_s3_server

            server: Any = stack.enter_context(seaweedfs_s3_server(tmp))
        else:
            from ptestore.testing.moto import moto_s3_server

            server = stack.enter_context(moto_s3_server())
        bucket = server.new_bucket()
        client = server.client()
        client.upload_file(str(pte), bucket, "src/m.pte")
        client.upload_file(str(ptd), bucket, "src/m.ptd")
        opts = server.storage_options
        devices = "".join(f'[devices.d{i:02d}]\nsoc = "s{i}"\n' for i in range(args.devices))
        job = tmp / "job.toml"
        job.write_text(
            f'destination = "s3://{bucket}/out/{{device}}/{{model}}.pte"\n'
            'backends = ["ptestore.backends.passthrough:PassthroughBackend=XnnpackBackend"]\n'
            f'[storage_options]\nendpoint_url = "{opts["endpoint_url"]}"\n'
            f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
            '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
            f'[[models]]\nname = "m"\nsource = "s3://{bucket}/src/m.pte"\n'
            f'ptd = "s3://{bucket}/src/m.ptd"\n' + devices
        )
        first = _run(job)
        stored, objects, ptds = _stored(client, bucket)
        second = _run(job)
        pte_size, ptd_size = pte.stat().st_size, ptd.stat().st_size
        out = {
            "server": args.server,
            "devices": args.devices,
            "source_pte_bytes": pte_size,
            "source_ptd_bytes": ptd_size,
            "make_seconds": round(made, 1),
            "stored_bytes": stored,
            "stored_objects": objects,
            "stored_ptd_objects": ptds,
            "naive_bytes": args.devices * (pte_size + ptd_size),
            "first_run": first,
            "rerun": second,
            "loadavg": os.getloadavg(),
        }
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
