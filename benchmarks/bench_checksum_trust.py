"""Benchmark: what it costs to trust a 1 GiB artifact on S3 (SeaweedFS), by how it was
uploaded, before and after ptestore trusted the checksums S3 keeps (issue 28 part 4).

    python benchmarks/bench_checksum_trust.py --work /tmp/bench-trust --size-mib 1024 --runs 3

The artifact is a real program made by ptestore from the ``mlp_xnnpack`` fixture
(``tests/support/large.py``: every named value ``size / 4`` bytes of seeded random
bytes), passed through ``ptestore.specialize`` with the default provenance trailer
(its record names the content's SHA-256, CRC-32 and, with awscrt, ``content.crcs``).
It is put on a SeaweedFS ``weed mini`` started for the run
(``ptestore.testing.seaweedfs``) three ways:

- ``upload_file``: boto3's ``upload_file`` with its defaults (``TransferConfig()``:
  8 MiB parts; botocore 1.43 sends a CRC-32 per part: a *composite* CRC-32), what
  ``aws s3 cp`` and most SDKs do;
- ``ptestore``: the same program specialized by ptestore straight into S3 (what a
  fleet run publishes: its ``S3Writer`` with its defaults, 8 MiB parts and a full-object
  CRC64NVME; its record made for S3, so it names the content's CRC64NVME);
- ``no-checksum``: a single ``put_object`` from a client with
  ``request_checksum_calculation="when_required"`` (no checksum sent: AWS would store
  CRC64NVME, SeaweedFS stores none).

For each, the check ``fleet plan`` and ``fleet run`` make of a destination
(``ptestore.fleet.binding.bytes_mismatch``: are its bytes the ones its record names)
is timed on a fresh loader after reading its trailer, *before* (the rule of the base
commit, kept here verbatim: trust only a stored full-object CRC-32, else read the bytes
and compare the SHA-256) and *after* (``trust_by_head``), interleaved ``--runs`` times.
Bytes are those the loader fetched from the store (``bytes_fetched``: the object's
bytes; the trailer read is excluded from both), requests those the check made.

``--hashing`` measures instead what recording the CRCs costs a run: the
``ContentHasher`` of ``--size-mib`` bytes in memory (8 MiB pieces, as a run feeds it),
with the CRC-32C and CRC64NVME of every chunk (an output to S3) and with the per-chunk
CRC-32 only (a local output), interleaved ``--runs`` times.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 1 << 20


def _make(work: Path, size_mib: int) -> tuple[Path, Path]:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from support.large import inflated

    import ptestore

    plain, art = work / "plain.pte", work / "artifact.pte"
    inflated(plain, (size_mib << 20) // 4)
    if not art.exists():
        ptestore.specialize(plain, art, allow_unchanged=True)
    return art, plain


def _upload(server: Any, bucket: str, art: Path, plain: Path) -> dict[str, str]:
    from boto3.s3.transfer import TransferConfig
    from support.s3clients import no_checksum_client

    import ptestore

    c = server.client()
    c.upload_file(str(art), bucket, "upload_file.pte", Config=TransferConfig())
    # what a fleet run publishes: the same program specialized into S3 (its record made
    # for a store that keeps checksums)
    ptestore.specialize(
        plain,
        f"s3://{bucket}/ptestore.pte",
        allow_unchanged=True,
        storage_options=server.storage_options,
    )
    bare = no_checksum_client(server.storage_options)
    with open(art, "rb") as f:
        bare.put_object(Bucket=bucket, Key="no-checksum.pte", Body=f)
    from ptestore.storage.s3checksum import stored_checksum

    out = {}
    for name in ("upload_file", "ptestore", "no-checksum"):
        h = c.head_object(Bucket=bucket, Key=f"{name}.pte", ChecksumMode="ENABLED")
        out[name] = str(stored_checksum(h) or "none")
    return out


def _before(loader: Any, trailer: Any, prov: Any) -> tuple[str | None, int]:
    """The base commit's rule (fleet/binding.py before issue 28 part 4)."""
    import fsspec.asyn

    from ptestore.provenance.digest import content_digest, object_crc32

    fs, path = loader.fs, loader.path
    bucket, key, _ = fs.split_path(path)
    head = fsspec.asyn.sync(
        fs.loop, fs._call_s3, "head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED"
    )
    value, kind = head.get("ChecksumCRC32"), head.get("ChecksumType")
    crc = None
    if isinstance(value, str) and "-" not in value and kind in (None, "FULL_OBJECT"):
        crc = int.from_bytes(base64.b64decode(value), "big")
    if crc is not None:
        ok = crc == object_crc32(prov.content, trailer.raw())
        return (None if ok else "crc"), 1
    got = content_digest(loader, trailer.content_size)
    return (None if got.sha256 == prov.content.sha256 else "sha"), 1 + (
        -(-trailer.content_size // (8 * MiB))
    )


def _after(loader: Any, trailer: Any, prov: Any) -> tuple[str | None, int]:
    from ptestore.fleet.binding import trust_by_head
    from ptestore.provenance.crcs import expected_checksums
    from ptestore.provenance.digest import content_digest

    verdict = trust_by_head(loader, expected_checksums(prov.content, trailer.raw()))
    if verdict.trusted is not None:
        return (None if verdict.trusted else verdict.reason), verdict.requests
    got = content_digest(loader, trailer.content_size)
    reads = -(-trailer.content_size // (8 * MiB))
    return (None if got.sha256 == prov.content.sha256 else "sha"), verdict.requests + reads


def _measure(url: str, options: dict[str, Any], rule: Any) -> dict[str, Any]:
    from ptestore.provenance import Provenance, read_trailer
    from ptestore.storage.loaders import open_loader

    loader = open_loader(url, **options)
    try:
        trailer = read_trailer(loader)
        assert trailer is not None
        prov = Provenance.from_dict(trailer.record(), url)
        before = loader.bytes_fetched
        t = time.perf_counter()
        bad, requests = rule(loader, trailer, prov)
        seconds = time.perf_counter() - t
        assert bad is None, bad
        return {"s": seconds, "bytes": loader.bytes_fetched - before, "requests": requests}
    finally:
        loader.close()


def _hashing(size_mib: int, runs: int) -> dict[str, Any]:
    from ptestore.provenance.crcs import LOCAL_CRCS, STORE_CRCS
    from ptestore.provenance.digest import ContentHasher

    data = memoryview(os.urandom(size_mib * MiB))
    kinds = {"crc32-only": LOCAL_CRCS, "all-crcs": STORE_CRCS}
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(runs):
        for label, crcs in kinds.items():
            t = time.perf_counter()
            h = ContentHasher(len(data), crcs=crcs)
            for i in range(0, len(data), 8 * MiB):
                h.update(data[i : i + 8 * MiB])
            h.digest()
            out[label].append(time.perf_counter() - t)
    return {k: [round(x, 3) for x in v] for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-trust")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hashing", action="store_true", help="measure the ContentHasher only")
    args = ap.parse_args()
    if args.hashing:
        load0 = os.getloadavg()
        got = _hashing(args.size_mib, args.runs)
        print(json.dumps({"load": [*load0, *os.getloadavg()], "seconds": got}, indent=2))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    art, plain = _make(args.work, args.size_mib)
    from ptestore.testing.seaweedfs import seaweedfs_s3_server

    load0 = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {}
    (args.work / "weed").mkdir(exist_ok=True)
    with seaweedfs_s3_server(args.work / "weed") as server:
        bucket = server.new_bucket()
        stored = _upload(server, bucket, art, plain)
        for _ in range(args.runs):
            for name in ("upload_file", "ptestore", "no-checksum"):
                url = f"s3://{bucket}/{name}.pte"
                for label, rule in (("before", _before), ("after", _after)):
                    r = _measure(url, server.storage_options, rule)
                    results.setdefault(f"{name}:{label}", []).append(r)
    summary = {
        "size": art.stat().st_size,
        "stored": stored,
        "load": [round(x, 1) for x in (*load0, *os.getloadavg())],
        "cases": {
            k: {
                "median_s": round(statistics.median(r["s"] for r in v), 3),
                "runs_s": [round(r["s"], 3) for r in v],
                "bytes": v[0]["bytes"],
                "requests": v[0]["requests"],
            }
            for k, v in results.items()
        },
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
