"""Four processes publish into one sharded index at once, on overlapping shards: each
its own devices and the same shared devices (with other stamps, so those entries move
between kinds of build in the catalogs), in several batches, while small leaves split
under them. No entry is lost, each shared pair holds one writer's entry whole, and every
catalog agrees with its leaves. Locally (fast) and on moto and SeaweedFS (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.together import run_together

from ptestore.fleet.index import create_index, load_index
from ptestore.testing.fleet_index import catalog_disagreements, synthetic_entry
from ptestore.testing.s3server import S3TestServer

from .indexkit import assert_catalogs_match_leaves, leaf_sizes

#: Writers, batches each, own devices and shared devices per model per batch, models.
LOCAL = (4, 3, 6, 6, ("m0", "m1", "m2"))
S3 = (4, 2, 4, 4, ("m0", "m1"))  # smaller: every request goes through a server

_WRITER = """
import json, os, sys, time
from pathlib import Path
from ptestore.fleet.index import publish_entries
from ptestore.testing.fleet_index import synthetic_entry
url, options, shape, name, ready, go, out = sys.argv[1:8]
options, (batches, own, shared, models), i = json.loads(options), json.loads(shape), int(name)
Path(ready).touch()
ceiling = time.monotonic() + 600
while not os.path.exists(go):  # start together: wait for the go file
    if time.monotonic() > ceiling:
        sys.exit("never told to go")
    time.sleep(0.001)
stats = []
for batch in range(batches):
    entries = []
    for m in models:
        entries += [synthetic_entry(m, f"w{i}-{batch}-{j}") for j in range(own)]
        # the same pairs for every writer, another SoC count (other stamps) each
        entries += [
            synthetic_entry(m, f"shared-{j}", socs=3 + i, generation=i) for j in range(shared)
        ]
    report = publish_entries(url, entries, options)
    stats += [s.to_dict() for s in report.stats]
Path(out).write_text(json.dumps(stats))
"""


def _soak(
    tmp_path: Path, url: str, options: dict[str, Any], shape: tuple[Any, ...]
) -> list[dict[str, Any]]:
    writers, batches, own, shared, models = shape
    create_index(url, leaf_bytes=4096, listed=3, storage_options=options)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(writers)]
    outs = [tmp_path / f"out{i}.json" for i in range(writers)]
    plan = json.dumps([batches, own, shared, models])
    args = [[url, json.dumps(options), plan, str(i), str(ready[i]), str(go), str(outs[i])]
            for i in range(writers)]  # fmt: skip
    commands = [[sys.executable, "-c", _WRITER, *a] for a in args]
    results = run_together(commands, ready, go, timeout=1200)
    assert all(rc == 0 for rc, _ in results), results
    # Every writer's own entries, and each shared pair whole from one of the writers.
    entries = {(e["model"], e["device"]): e for e in load_index(url, **options)["entries"]}
    for m in models:
        for i in range(writers):
            for b in range(batches):
                for j in range(own):
                    device = f"w{i}-{b}-{j}"
                    assert entries.pop((m, device)) == synthetic_entry(m, device)
        for j in range(shared):
            got = entries.pop((m, f"shared-{j}"))
            assert got in [
                synthetic_entry(m, f"shared-{j}", socs=3 + i, generation=i) for i in range(writers)
            ]
    assert entries == {}
    stats = [s for out in outs for s in json.loads(out.read_text())]
    # What tells a failure's causes apart: writes whose outcome was unknown (an answer
    # lost), and what the writers logged (retries).
    context = {
        "uncertain writes": [(s["kind"], s["shard"]) for s in stats if s["uncertain"]],
        "stderr": [err.decode(errors="replace")[-2000:] for _, err in results if err],
    }
    assert catalog_disagreements(url, options) == {}, context
    assert assert_catalogs_match_leaves(url, options) == len(models)
    assert all(size <= 4096 for size, _ in leaf_sizes(url, options))
    return stats


def test_four_processes_on_overlapping_shards_lose_no_entry(tmp_path: Path) -> None:
    stats = _soak(tmp_path, str(tmp_path / "index" / "ptestore-index.json"), {}, LOCAL)
    assert {s["kind"] for s in stats} == {"root", "leaf", "catalog"}
    assert sum(s["splits"] for s in stats) > 0


@pytest.mark.s3
def test_four_processes_on_overlapping_shards_on_s3(
    tmp_path: Path, s3_server: S3TestServer
) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/soak/ptestore-index.json"
    stats = _soak(tmp_path, url, s3_server.storage_options, S3)
    assert sum(s["splits"] for s in stats) > 0
