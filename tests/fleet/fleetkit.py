"""Shared set-up of the fleet tests: real fixtures in a moto bucket, many device
profiles, a job file pointing at them (through the fault-injecting proxy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.fixtures import get_fixture

from ptestore.testing.moto import MotoS3

MODELS = ["mlp_xnnpack", "conv_xnnpack", "mlp_xnnpack_ext"]
DEVICES = 17  # x 3 models = 51 pairs
SPEC = "support.fleet_backend:Scaler"


def upload_models(moto: MotoS3, bucket: str) -> None:
    client = moto.client()
    for name in MODELS:
        fx = get_fixture(name)
        assert fx.pte_path is not None
        client.put_object(Bucket=bucket, Key=f"src/{name}.pte", Body=fx.pte_path.read_bytes())
        if fx.ptd_path is not None:
            client.put_object(Bucket=bucket, Key=f"src/{name}.ptd", Body=fx.ptd_path.read_bytes())


def device_options(i: int) -> dict[str, Any]:
    return {"soc": f"soc-{i % 3}", "scale": 1.0 + i / 8, "flags": ["-O2", f"-mcpu={i}"]}


def write_job(
    path: Path,
    moto: MotoS3,
    bucket: str,
    endpoint: str,
    *,
    prefix: str = "fleet",
    version: str = "1.0",
    devices: dict[str, dict[str, Any]] | None = None,
) -> Path:
    if devices is None:
        devices = {f"dev{i:02d}": device_options(i) for i in range(DEVICES)}
    opts = dict(moto.storage_options, endpoint_url=endpoint)
    lines = [
        f'destination = "s3://{bucket}/{prefix}/{{device}}/{{model}}.pte"',
        f'backends = ["{SPEC}={version}"]',
        "[storage_options]",
        f'endpoint_url = "{opts["endpoint_url"]}"',
        f'key = "{opts["key"]}"',
        f'secret = "{opts["secret"]}"',
        "retry_initial = 0.001",
        "retry_max = 0.02",
        "[storage_options.client_kwargs]",
        'region_name = "us-east-1"',
    ]
    for name in MODELS:
        fx = get_fixture(name)
        lines += ["[[models]]", f'name = "{name}"', f'source = "s3://{bucket}/src/{name}.pte"']
        if fx.ptd_path is not None:
            lines.append(f'ptd = "s3://{bucket}/src/{name}.ptd"')
    for dname, dopts in devices.items():
        lines.append(f"[devices.{dname}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in dopts.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def uploads(moto: MotoS3, bucket: str) -> list[str]:
    resp = moto.client().list_multipart_uploads(Bucket=bucket)
    return [u["Key"] for u in resp.get("Uploads", [])]


def statuses(result: Any) -> dict[tuple[str, str], str]:
    return {(p.model, p.device): p.status for p in result.pairs}
