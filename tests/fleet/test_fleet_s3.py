"""A fleet of 51 pairs (3 real fixtures x 17 device profiles) on moto's S3 server with
transient faults injected by a proxy: every pair ends published or reported failed,
no multipart upload is left, a second run skips everything, and a changed source,
device option or backend version re-runs exactly the affected pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.faulty_proxy import faulty_proxy
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job, run_job
from ptestore.provenance import read_provenance, replace_trailer
from ptestore.testing.moto import MotoS3
from ptestore.verification import verify

from .fleetkit import DEVICES, MODELS, statuses, upload_models, uploads, write_job

pytestmark = pytest.mark.s3


def test_fleet_with_faults_reruns_and_changes(
    moto_s3: MotoS3, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = moto_s3.new_bucket()
    upload_models(moto_s3, bucket)
    with faulty_proxy(moto_s3.endpoint_url, every=13) as (endpoint, faults):
        job_path = write_job(tmp_path / "job.toml", moto_s3, bucket, endpoint)
        job = load_job(job_path)
        pairs = job.pairs()
        assert len(pairs) == len(MODELS) * DEVICES >= 50

        # 1. the whole fleet, through faults, on a 2-process pool, from the CLI.
        code = main(["fleet", "run", str(job_path), "--workers", "2", "--json"])
        first = json.loads(capsys.readouterr().out)
        assert faults.injected > 20, faults
        assert set(first) == {
            "done",
            "skipped",
            "failed",
            "index",
            "index_error",
            "index_errors",
            "index_shards",
            "lost_workers",
            "pairs",
        }
        assert first["lost_workers"] == {}
        assert first["index"] is not None and first["index_error"] is None
        assert first["index_errors"] == []
        # A sharded index: the root made, then each model's leaves and catalog, each
        # with its compare-and-swap attempts (the faults above are retried underneath).
        shards = first["index_shards"]
        assert shards["version"] == 3 and shards["objects"] == len(shards["shards"])
        assert {s["kind"] for s in shards["shards"]} == {"root", "leaf", "catalog"}
        assert all(s["attempts"] >= 1 for s in shards["shards"])
        assert len(first["pairs"]) == len(pairs)
        for entry in first["pairs"]:
            assert set(entry) == {
                "model",
                "device",
                "destination",
                "status",
                "error",
                "seconds",
                "bytes",
                "attempts",
            }
            assert entry["status"] in ("done", "failed"), entry
            assert (entry["error"] is None) == (entry["status"] == "done"), entry
            assert entry["bytes"] > 0 and entry["seconds"] > 0
        assert first["done"] + first["failed"] == len(pairs) and first["skipped"] == 0
        assert code == (1 if first["failed"] else 0)
        assert [(e["model"], e["device"], e["destination"]) for e in first["pairs"]] == [
            (p.model.name, p.device.name, p.destination) for p in pairs
        ]
        assert uploads(moto_s3, bucket) == []

        # Every published artifact is current (and carries its key as S3 metadata).
        client = moto_s3.client()
        done = [e for e in first["pairs"] if e["status"] == "done"]
        for entry in done[:: max(1, len(done) // 8)]:
            report = verify(
                entry["destination"],
                storage_options=job.storage_options,
                backends=list(job.backends),
                device=job.device(entry["device"]),
            )
            assert report.exit_code == 0, report.message()
            key = entry["destination"].split("/", 3)[3]
            meta = client.head_object(Bucket=bucket, Key=key)["Metadata"]
            assert meta["ptestore-device"] == entry["device"]
            assert meta["ptestore-device-digest"] == job.device(entry["device"]).digest()

        # 2. a second run does only what failed, then everything is skipped.
        faults.enabled = False
        second = run_job(job, workers=1)
        want = {
            k: ("skipped" if v == "done" else "done")
            for k, v in {(e["model"], e["device"]): e["status"] for e in first["pairs"]}.items()
        }
        assert statuses(second) == want
        third = run_job(job, workers=1)
        assert set(statuses(third).values()) == {"skipped"} and third.exit_code == 0
        assert all(p.error is None and p.reason.startswith("current") for p in third.pairs)

        # 3. a changed source re-runs exactly that model's pairs.
        fx = get_fixture("conv_xnnpack")
        assert fx.pte_path is not None
        client.put_object(
            Bucket=bucket,
            Key="src/conv_xnnpack.pte",
            Body=replace_trailer(fx.pte_path.read_bytes(), {"revision": 2}),
        )
        plan = plan_job(job)
        rerun = {(p.pair.model.name, p.pair.device.name) for p in plan.pairs if p.action == "run"}
        assert rerun == {("conv_xnnpack", d.name) for d in job.devices}
        assert all("stale: source.sha256" in p.reason for p in plan.pairs if p.action == "run")
        result = run_job(job, workers=2)
        assert {k for k, v in statuses(result).items() if v == "done"} == rerun
        assert result.count("skipped") == len(pairs) - len(rerun)

        # 4. a changed device option re-runs exactly that device's pairs.
        from .fleetkit import device_options

        devices = {f"dev{i:02d}": device_options(i) for i in range(DEVICES)}
        devices["dev03"]["scale"] = 9.0
        job = load_job(write_job(job_path, moto_s3, bucket, endpoint, devices=devices))
        result = run_job(job, workers=1)
        assert {k for k, v in statuses(result).items() if v == "done"} == {
            (m, "dev03") for m in MODELS
        }
        prov = read_provenance_at(moto_s3, bucket, "fleet/dev03/mlp_xnnpack.pte")
        assert prov.device is not None and prov.device.digest == job.device("dev03").digest()

        # 5. a new backend version re-runs every pair (the backend serves them all) ...
        job = load_job(
            write_job(job_path, moto_s3, bucket, endpoint, devices=devices, version="1.1")
        )
        plan = plan_job(job)
        assert plan.count("run") == len(pairs)
        assert all("stale: backends are [" in p.reason for p in plan.pairs)
        # ... and `fleet plan` says so without doing it.
        assert main(["fleet", "plan", str(job_path), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)["pairs"]
        assert {p["action"] for p in shown} == {"run"}
        assert plan_job(job).count("run") == len(pairs)  # the plan wrote nothing
    assert uploads(moto_s3, bucket) == []


def read_provenance_at(moto: MotoS3, bucket: str, key: str):  # type: ignore[no-untyped-def]
    from ptestore.storage.loaders import BytesLoader

    body = moto.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    prov = read_provenance(BytesLoader(body))
    assert prov is not None
    return prov
