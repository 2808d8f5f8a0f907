"""Fleet runs on S3 against both servers (moto and SeaweedFS): a small job (3 real
fixtures x 1 device) runs, then reruns exactly the pair whose source changed (the
others are skipped), and leaves no multipart upload; destinations aliasing a source the way a store
folds keys are refused before any work. (The large fault-injected fleet runs on moto:
tests/fleet/test_fleet_s3.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import JobError, load_job, run_job
from ptestore.testing.s3server import S3TestServer

from .fleetkit import MODELS, statuses, upload_models, write_job

pytestmark = pytest.mark.s3

DEVICES: dict[str, dict[str, Any]] = {"d0": {"soc": "soc-0", "scale": 2.0}}


def _uploads(server: S3TestServer, bucket: str) -> list[str]:
    resp = server.client().list_multipart_uploads(Bucket=bucket)
    return [u["Key"] for u in resp.get("Uploads", [])]


def test_run_rerun_and_a_changed_source(s3_server: S3TestServer, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    upload_models(s3_server, bucket)  # type: ignore[arg-type]
    endpoint = s3_server.storage_options["endpoint_url"]
    path = write_job(tmp_path / "job.toml", s3_server, bucket, endpoint, devices=DEVICES)  # type: ignore[arg-type]
    first = run_job(load_job(path), workers=1)
    assert set(statuses(first).values()) == {"done"}, [p.error for p in first.pairs]
    assert len(first.pairs) == len(MODELS)
    fx = get_fixture("conv_xnnpack")
    assert fx.pte_path is not None
    data = bytearray(fx.pte_path.read_bytes())
    data[-1] ^= 1
    s3_server.client().put_object(Bucket=bucket, Key="src/conv_xnnpack.pte", Body=bytes(data))
    third = run_job(load_job(path), workers=1)
    assert statuses(third) == {
        (m, d): ("done" if m == "conv_xnnpack" else "skipped") for m in MODELS for d in DEVICES
    }
    assert _uploads(s3_server, bucket) == []


def test_a_destination_folding_onto_a_source_is_refused(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.new_bucket()
    upload_models(s3_server, bucket)  # type: ignore[arg-type]
    endpoint = s3_server.storage_options["endpoint_url"]
    path = write_job(tmp_path / "job.toml", s3_server, bucket, endpoint, devices=DEVICES)  # type: ignore[arg-type]
    text = path.read_text().replace(
        f"s3://{bucket}/fleet/{{device}}/{{model}}.pte",
        f"s3://{bucket}/src/{{device}}/..//{{model}}.pte",
    )
    path.write_text(text)
    with pytest.raises(JobError, match=f"is the source s3://{bucket}/src/mlp_xnnpack.pte"):
        load_job(path)
    assert main(["fleet", "run", str(path), "--quiet"]) == 2
    assert "a destination must never be one of the job's sources" in capsys.readouterr().err
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    body = s3_server.client().get_object(Bucket=bucket, Key="src/mlp_xnnpack.pte")["Body"].read()
    assert body == fx.pte_path.read_bytes()
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert all(k.startswith("src/") for k in keys)
