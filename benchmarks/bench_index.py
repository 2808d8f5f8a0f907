"""Benchmark: the sharded fleet index (version 3) at 10^4, 10^5 and 10^6 pairs.

    python benchmarks/bench_index.py [--sizes 100x100,316x316,1000x1000]
        [--store seaweedfs|moto|local] [--socs 8] [--selects 30] [--cli-selects 3]
        [--soak-writers 4] [--soak-batches 3] [--soak-devices 200] [--v2-upto 100000]
        [--json FILE]

For each size MODELSxDEVICES (pairs = models x devices), on a fresh index:

1. **load**: synthetic entries (:mod:`ptestore.testing.fleet_index`: every field a real
   run writes, 1.36 KB each as compact JSON, ``--socs`` kinds of build per model) are laid
   out by ptestore's own builder (the one a migration uses: a trie per model, leaves of
   at most 16 KiB, a catalog per model) and uploaded in bulk, 32 at a time, with one
   boto3 client (files on ``--store local``). A set-up step, not ptestore's publish path.
2. **select**: ``ptestore.select(INDEX_URL, model, device)`` for ``--selects`` random
   samples of each kind: a device's own build; a device the job did not name, of a SoC
   the model has (another device's build is the answer, rated by a backend installed
   here, :class:`~ptestore.testing.fleet_index.SocBackend`); an unknown SoC (the portable
   source). In this process (the S3 client kept between calls, as an app would), latency
   median and p95; objects and bytes read, counted by ``Choice.index_read`` and, on S3,
   independently by botocore event hooks (:class:`ptestore.testing.s3_traffic.Traffic`:
   GetObject bodies). Then ``--cli-selects`` whole ``python -m ptestore select`` processes
   (interpreter start and imports included). Beside it (sizes up to ``--v2-upto``
   pairs), the same entries as one version 2 object, ``select`` on it (what every device
   downloaded and parsed before), a publish of 1 model x all devices into it, and its
   migration to version 3 (``migrate_index``).
3. **publish**: what a run's publish costs: ``publish_entries`` of 1 model x all devices
   and of 1 device x all models, each a new generation (every entry changes); time,
   objects read and written, conflicts; then the same 1 model x all devices again
   (nothing changes: reads only).
   Then ``fleet check-index`` of the whole index (every model's leaves and catalog read,
   8 models at a time): time and catalogs found wrong (none is expected).
4. **soak**: ``--soak-writers`` processes publish at once, ``--soak-batches`` batches each,
   into the same 2 models: each writer ``--soak-devices`` devices, half of them shared
   with the next writer (overlapping leaves, the same catalogs). Afterwards every pair any
   writer published holds the last entry one of its writers published (for a pair of one
   writer, exactly that writer's last), and each catalog agrees with its leaves; conflicts
   and attempts summed over the shards.

``--store seaweedfs`` (default) and ``moto`` start that S3 server on 127.0.0.1 in this
process. The figures and commands are in docs/benchmarks.md ("The sharded index").
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from ptestore.backends import register_backend
from ptestore.backends.compat import DeviceProfile
from ptestore.fleet.index import create_index, migrate_index, open_index, publish_entries
from ptestore.fleet.index_catalog import rebuild
from ptestore.fleet.index_store import dumps
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import (
    SocBackend,
    catalog_disagreements,
    device_name,
    soc_of,
    synthetic_entry,
)
from ptestore.testing.s3_traffic import Traffic

_SOAK = "--soak-child"


def _models(n: int) -> list[str]:
    return [f"model-{i:04d}" for i in range(n)]


def _objects(
    url: str, opts: dict[str, Any], models: list[str], devices: list[str], socs: int
) -> Iterator[list[tuple[str, bytes]]]:
    """The objects of each model's trie and catalog, a model at a time."""
    _, sharded, _ = open_index(url, opts)
    assert sharded is not None
    for model in models:
        entries = {d: synthetic_entry(model, d, socs=socs) for d in devices}
        trie = sharded.trie(model)
        nodes, leaves = trie.build(entries)
        out = [(trie.url(p), dumps(v)) for p, v in nodes]
        catalog = rebuild(model, entries.values(), leaves, sharded.listed)
        out.append((sharded.catalog_url(model), dumps(catalog)))
        yield out


def _put(client: Any, where: str, data: bytes) -> int:
    """Write ``data`` at ``where``: a local path (``client`` None) or an ``s3://`` URL
    through the boto3 ``client`` (as JSON); its size."""
    if client is None:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        with open(where, "wb") as f:
            f.write(data)
    else:
        bucket, _, key = where.removeprefix("s3://").partition("/")
        client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json")
    return len(data)


def load(
    url: str, opts: dict[str, Any], client: Any, models: list[str], devices: list[str], socs: int
) -> dict[str, Any]:
    """Create the index and upload every object (see the module docstring)."""
    started = time.perf_counter()
    create_index(url, storage_options=opts)

    def put(item: tuple[str, bytes]) -> int:
        return _put(client, *item)

    count = size = 0
    with cf.ThreadPoolExecutor(max_workers=32) as pool:
        batch: list[tuple[str, bytes]] = []
        for objects in _objects(url, opts, models, devices, socs):
            batch += objects
            if len(batch) >= 2000:
                size += sum(pool.map(put, batch))
                count += len(batch)
                batch = []
        size += sum(pool.map(put, batch))
        count += len(batch)
    return {"seconds": round(time.perf_counter() - started, 1), "objects": count, "bytes": size}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def selects(
    url: str,
    opts: dict[str, Any],
    traffic: Traffic | None,
    models: list[str],
    devices: list[str],
    socs: int,
    samples: int,
) -> dict[str, Any]:
    rng = random.Random(7)
    kinds: dict[str, Any] = {
        "own build": lambda d: d,
        "another device's build": lambda d: DeviceProfile("newcomer", {"soc": soc_of(d, socs)}),
        "portable source": lambda d: DeviceProfile("stranger", {"soc": "none"}),
    }
    select(url, models[0], devices[0], storage_options=opts)  # the client, once
    out = {}
    for kind, make in kinds.items():
        times, objects, sizes, counted, gets = [], [], [], [], []
        for _ in range(samples):
            model, dev = rng.choice(models), rng.choice(devices)
            if traffic is not None:
                traffic.reset()
            t = time.perf_counter()
            choice = select(url, model, make(dev), storage_options=opts)
            times.append(time.perf_counter() - t)
            assert choice.index_read is not None
            objects.append(choice.index_read["objects"])
            sizes.append(choice.index_read["bytes"])
            if traffic is not None:
                counted.append(traffic.received["GetObject"])
                gets.append(traffic.calls["GetObject"])
        out[kind] = {
            "kind": choice.kind,
            "ms_median": round(statistics.median(times) * 1000, 1),
            "ms_p95": round(_pct(times, 0.95) * 1000, 1),
            "objects_max": max(objects),
            "bytes_median": int(statistics.median(sizes)),
            "bytes_max": max(sizes),
            "bytes_counted_by_botocore_max": max(counted) if counted else None,
            "get_requests_max": max(gets) if gets else None,
        }
    return out


def cli_selects(
    url: str, opts: dict[str, Any], models: list[str], devices: list[str], samples: int
) -> list[float]:
    """Whole ``python -m ptestore select`` processes (own builds), seconds each."""
    rng = random.Random(11)
    flags = []
    for k, v in opts.items():
        if k == "session":
            continue
        flags += ["--storage-option", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    times = []
    for _ in range(samples):
        cmd = [
            sys.executable,
            "-m",
            "ptestore",
            "select",
            url,
            "--model",
            rng.choice(models),
            "--device",
            rng.choice(devices),
            "--json",
            *flags,
        ]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(round(time.perf_counter() - t, 3))
    return times


def v2_baseline(
    url: str,
    client: Any,
    opts: dict[str, Any],
    models: list[str],
    devices: list[str],
    socs: int,
    samples: int,
) -> dict[str, Any]:
    """The same entries as one version 2 object at ``url``: its size, and ``select`` on
    it (what every device downloaded and parsed before version 3)."""
    entries = [synthetic_entry(m, d, socs=socs) for m in models for d in devices]
    data = json.dumps(
        {"format": "ptestore.index", "version": 2, "updated": "", "entries": entries}, indent=1
    ).encode()
    del entries
    _put(client, url, data)
    rng = random.Random(13)
    times, sizes = [], []
    for _ in range(samples):
        t = time.perf_counter()
        choice = select(url, rng.choice(models), rng.choice(devices), storage_options=opts)
        times.append(time.perf_counter() - t)
        sizes.append((choice.index_read or {}).get("bytes"))
    # A run's publish into it: read it all, merge 1 model x all devices, write it all.
    model = models[len(models) // 2]
    t = time.perf_counter()
    publish_entries(
        url, [synthetic_entry(model, d, generation=1) for d in devices], opts, version=2
    )
    published = round(time.perf_counter() - t, 2)
    # The migration to version 3 (what the first publish of a newer ptestore does).
    t = time.perf_counter()
    migrated = migrate_index(url, storage_options=opts) or {}
    return {
        "object_bytes": len(data),
        "select_s_median": round(statistics.median(times), 2),
        "select_bytes": max(s or 0 for s in sizes),
        "publish_1_model_all_devices_s": published,
        "migrate_s": round(time.perf_counter() - t, 1),
        "migrate_objects": migrated.get("objects"),
    }


def publish(url: str, opts: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    t = time.perf_counter()
    report = publish_entries(url, entries, opts)
    return {
        "entries": len(entries),
        "seconds": round(time.perf_counter() - t, 2),
        "objects": len(report.stats),
        "written": sum(1 for s in report.stats if s.written),
        "conflicts": report.conflicts,
        "splits": sum(s.splits for s in report.stats),
    }


def _soak_plan(
    models: list[str], devices: list[str], writers: int, batches: int, per: int
) -> dict[int, list[list[tuple[str, str, int]]]]:
    """Per writer, per batch, the ``(model, device, generation)`` it publishes."""
    plan: dict[int, list[list[tuple[str, str, int]]]] = {}
    for i in range(writers):
        start = (i * per // 2) % max(1, len(devices) - per)
        mine = devices[start : start + per]
        plan[i] = [
            [(m, d, 1000 + i * 100 + b) for m in models[:2] for d in mine] for b in range(batches)
        ]
    return plan


def soak_child(argv: list[str]) -> None:
    url, opts_json, plan_file, i, go, out = argv
    opts = json.loads(opts_json)
    with open(plan_file) as f:
        batches = json.load(f)[i]
    ready = out + ".ready"
    open(ready, "w").close()
    while not os.path.exists(go):  # start together
        time.sleep(0.001)
    stats: list[dict[str, Any]] = []
    started = time.perf_counter()
    for batch in batches:
        entries = [synthetic_entry(m, d, generation=g) for m, d, g in batch]
        report = publish_entries(url, entries, opts)
        stats += [s.to_dict() for s in report.stats]
    with open(out, "w") as f:
        json.dump({"seconds": time.perf_counter() - started, "stats": stats}, f)


def soak(
    url: str,
    opts: dict[str, Any],
    models: list[str],
    devices: list[str],
    writers: int,
    batches: int,
    per: int,
    work: str,
) -> dict[str, Any]:
    plan = _soak_plan(models, devices, writers, batches, per)
    go = os.path.join(work, "go")
    outs = [os.path.join(work, f"soak{i}.json") for i in range(writers)]
    plain = {k: v for k, v in opts.items() if k != "session"}
    plan_file = os.path.join(work, "soak-plan.json")
    with open(plan_file, "w") as f:
        json.dump({str(k): v for k, v in plan.items()}, f)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                _SOAK,
                url,
                json.dumps(plain),
                plan_file,
                str(i),
                go,
                outs[i],
            ]
        )
        for i in range(writers)
    ]
    for p, out in zip(procs, outs, strict=True):
        while not os.path.exists(out + ".ready") and p.poll() is None:
            time.sleep(0.01)
    t = time.perf_counter()
    open(go, "w").close()
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - t
    assert codes == [0] * writers, codes
    results = [json.load(open(o)) for o in outs]
    stats = [s for r in results for s in r["stats"]]
    # No lost entry: each pair holds the last entry one of its writers published.
    last: dict[tuple[str, str], dict[int, int]] = {}
    for i, batches_ in plan.items():
        for batch in batches_:
            for m, d, g in batch:
                last.setdefault((m, d), {})[i] = g
    _, sharded, _ = open_index(url, plain)
    assert sharded is not None
    lost = 0
    for model in models[:2]:
        held = {e["device"]: e for n in sharded.trie(model).walk() for e in n.entries.values()}
        for (m, d), by_writer in last.items():
            if m != model:
                continue
            finals = [synthetic_entry(m, d, generation=g) for g in by_writer.values()]
            lost += held.get(d) not in finals
    wrong = catalog_disagreements(url, plain)
    return {
        "writers": writers,
        "pairs_published": sum(len(b) for bs in plan.values() for b in bs),
        "distinct_pairs": len(last),
        "shared_pairs": sum(1 for v in last.values() if len(v) > 1),
        "wall_seconds": round(wall, 2),
        "objects_touched": len(stats),
        "attempts": sum(s["attempts"] for s in stats),
        "conflicts": sum(s["conflicts"] for s in stats),
        "conflicts_by_kind": {
            k: sum(s["conflicts"] for s in stats if s["kind"] == k) for k in ("leaf", "catalog")
        },
        "max_conflicts_one_object": max((s["conflicts"] for s in stats), default=0),
        "splits": sum(s["splits"] for s in stats),
        "lost_entries": lost,
        "catalogs_disagreeing": wrong,
    }


def check(url: str, opts: dict[str, Any]) -> dict[str, Any]:
    """``fleet check-index`` of the whole index: every model's leaves and catalog read."""
    from ptestore.fleet.index_check import check_index

    t = time.perf_counter()
    found = check_index(url, opts)
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "models": found.models,
        "wrong": len(set(found.problems) | set(found.marked)),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == _SOAK:
        soak_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100x100,316x316,1000x1000")
    ap.add_argument("--store", choices=("seaweedfs", "moto", "local"), default="seaweedfs")
    ap.add_argument("--socs", type=int, default=8)
    ap.add_argument("--selects", type=int, default=30)
    ap.add_argument("--cli-selects", type=int, default=3)
    ap.add_argument("--soak-writers", type=int, default=4)
    ap.add_argument("--soak-batches", type=int, default=3)
    ap.add_argument("--soak-devices", type=int, default=200)
    ap.add_argument(
        "--v2-upto",
        type=int,
        default=100_000,
        help="also time select on the same index as one version 2 object, for "
        "sizes up to this many pairs",
    )
    ap.add_argument("--json", default=None, help="write the figures there too")
    args = ap.parse_args()
    register_backend(SocBackend, "synthetic-npu")
    results: dict[str, Any] = {"args": vars(args), "load_before": os.getloadavg(), "sizes": {}}
    with ExitStack() as stack:
        work = tempfile.mkdtemp(prefix="bench-index-")
        stack.callback(shutil.rmtree, work, True)
        traffic: Traffic | None = None
        if args.store == "local":
            client, base, opts = None, work, {}
        else:
            if args.store == "seaweedfs":
                from ptestore.testing.seaweedfs import seaweedfs_s3_server

                server: Any = stack.enter_context(seaweedfs_s3_server(work))
            else:
                from ptestore.testing.moto import moto_s3_server

                server = stack.enter_context(moto_s3_server())
            import aiobotocore.session

            traffic = Traffic()
            session = aiobotocore.session.AioSession()
            traffic.attach(session)
            client = server.client()
            opts = {**server.storage_options, "session": session}
            base = f"s3://{server.new_bucket()}"
        for size in args.sizes.split(","):
            n_models, n_devices = (int(x) for x in size.split("x"))
            models, devices = _models(n_models), [device_name(i) for i in range(n_devices)]
            url = f"{base}/{size}/ptestore-index.json"
            print(f"== {size}: {n_models * n_devices} pairs", flush=True)
            row: dict[str, Any] = {"pairs": n_models * n_devices, "load_before": os.getloadavg()}
            plain = {k: v for k, v in opts.items() if k != "session"}
            row["load"] = load(url, plain, client, models, devices, args.socs)
            row["v2_bytes"] = row["pairs"] * len(
                json.dumps(synthetic_entry(models[0], devices[0]), indent=1)
            )
            print(" load", row["load"], flush=True)
            row["select"] = selects(url, opts, traffic, models, devices, args.socs, args.selects)
            print(" select", json.dumps(row["select"]), flush=True)
            if row["pairs"] <= args.v2_upto:
                row["v2"] = v2_baseline(
                    f"{base}/{size}-v2/ptestore-index.json",
                    client,
                    plain,
                    models,
                    devices,
                    args.socs,
                    3,
                )
                print(" v2 baseline", row["v2"], flush=True)
            if args.store != "local":
                row["cli_select_seconds"] = cli_selects(
                    url, plain, models, devices, args.cli_selects
                )
            m0, d0 = models[len(models) // 2], devices[len(devices) // 2]
            row["publish_1_model_all_devices"] = publish(
                url, plain, [synthetic_entry(m0, d, generation=1) for d in devices]
            )
            row["publish_1_device_all_models"] = publish(
                url, plain, [synthetic_entry(m, d0, generation=1) for m in models]
            )
            row["republish_unchanged"] = publish(
                url, plain, [synthetic_entry(m0, d, generation=1) for d in devices]
            )
            print(
                " publish",
                {k: v for k, v in row.items() if k.startswith(("publish", "republish"))},
                flush=True,
            )
            row["check_index"] = check(url, plain)
            print(" check-index", row["check_index"], flush=True)
            row["soak"] = soak(
                url,
                plain,
                models,
                devices,
                args.soak_writers,
                args.soak_batches,
                min(args.soak_devices, n_devices),
                work,
            )
            print(" soak", row["soak"], flush=True)
            row["load_after"] = os.getloadavg()
            results["sizes"][size] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
