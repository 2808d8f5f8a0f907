"""``fleet plan`` estimates what each pair to run moves through the client, what the
S3 service copies and how many S3 requests it makes; checked against real runs."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job
from ptestore.fleet.estimate import Estimate
from ptestore.fleet.work import run_pair
from ptestore.testing.s3_traffic import Traffic
from ptestore.testing.s3server import S3TestServer

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")  # with a .ptd
SPEC = "support.fleet_backend:Scaler=1.0"


def _put(server: S3TestServer, bucket: str, path: Path) -> str:
    key = f"src/{uuid.uuid4().hex}{path.suffix}"
    server.client().put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{key}"


def _s3_job(server: S3TestServer, tmp: Path) -> Path:
    bucket = server.new_bucket()
    assert MLP.pte_path is not None and EXT.pte_path is not None and EXT.ptd_path is not None
    opts = server.storage_options
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "s3://{bucket}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[storage_options]\nendpoint_url = "{opts["endpoint_url"]}"\n'
        f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
        '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
        f'[[models]]\nname = "mlp"\nsource = "{_put(server, bucket, MLP.pte_path)}"\n'
        f'[[models]]\nname = "ext"\nsource = "{_put(server, bucket, EXT.pte_path)}"\n'
        f'ptd = "{_put(server, bucket, EXT.ptd_path)}"\n'
        '[devices.a]\nsoc = "x"\n[devices.b]\nsoc = "y"\nscale = 2.0\n'
    )
    return job


@pytest.mark.s3
def test_the_estimate_of_each_pair_matches_its_run(s3_server: S3TestServer, tmp_path: Path) -> None:
    import aiobotocore.session

    session = aiobotocore.session.AioSession()
    traffic = Traffic().attach(session)  # every client of the run counts
    job = load_job(_s3_job(s3_server, tmp_path))
    job = dataclasses.replace(job, storage_options={**job.storage_options, "session": session})
    plan = plan_job(job)
    assert plan.count("run") == 4
    for p in plan.pairs:
        assert p.task is not None
        traffic.reset()
        result = run_pair(p.task)
        assert result.status == "done", result.error
        # Small sources (read whole): the requests are exact; the bytes are those
        # counted but for the .ptd output's size (the estimate takes its source's). The
        # check after publishing trusts the stored checksum by HEAD on both servers (the
        # writer's PutObject names its algorithm, so moto keeps it too).
        assert p.estimate.requests == sum(traffic.calls.values()), dict(traffic.calls)
        assert abs(p.estimate.client_bytes - result.bytes) <= result.bytes // 10
        assert p.estimate.copy_bytes == 0
    assert [p.estimate.requests for p in plan.pairs] == [10, 10, 20, 20]
    assert plan.estimate == sum((p.estimate for p in plan.pairs), Estimate())
    again = plan_job(job)  # everything current: nothing to run, nothing estimated
    assert again.count("skip") == 4 and again.estimate == Estimate()


@pytest.mark.s3
def test_plan_shows_the_estimates(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _s3_job(s3_server, tmp_path)
    assert main(["fleet", "plan", str(job), "--json"]) == 0
    shown: dict[str, Any] = json.loads(capsys.readouterr().out)
    per_pair = [p["estimate"] for p in shown["pairs"]]
    assert [e["s3_requests"] for e in per_pair] == [10, 10, 20, 20]
    assert set(per_pair[0]) == {"client_bytes", "server_copy_bytes", "s3_requests"}
    assert shown["estimate"] == {
        k: sum(e[k] for e in per_pair) for k in ("client_bytes", "server_copy_bytes", "s3_requests")
    }
    assert main(["fleet", "plan", str(job)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == [
        "model",
        "device",
        "action",
        "client",
        "copied",
        "requests",
        "reason",
    ]
    assert "estimated for the pairs to run: " in text
    assert ", 0 B copied by the S3 service, 60 S3 requests (estimates: " in text


def test_large_sources_on_one_service_are_mostly_copied(tmp_path: Path) -> None:
    """The model for large S3 sources (no server needed: only sizes and options)."""
    from ptestore.fleet.estimate import _file

    job = tmp_path / "job.toml"
    job.write_text(
        'destination = "s3://b/out/{device}/{model}.pte"\nbackends = ["passthrough"]\n'
        '[storage_options]\nendpoint_url = "http://127.0.0.1:9"\n'
        '[[models]]\nname = "m"\nsource = "s3://b/in/m.pte"\n[devices.a]\nsoc = "x"\n'
    )
    j = load_job(job)
    mib = 1 << 20
    big = _file("s3://b/in/m.pte", "s3://b/out/a/m.pte", 100 * mib, j)
    # 13 parts of 8 MiB: part 1 (the metadata) and the 4 MiB last part go through the
    # client; parts 2-12 (88 MiB) are copied by the service.
    assert big.copy_bytes == 88 * mib
    assert big.client_bytes == 4096 + 100 * mib + 12 * mib + 12 * mib + 4096
    assert big.requests == 2 + (3 + 13 + 13) + (13 + 4) + 2
    local = _file(str(tmp_path / "m.pte"), "s3://b/out/a/m.pte", 100 * mib, j)
    assert local.copy_bytes == 0 and local.requests == 13 + 4 + 2
    small = _file("s3://b/in/m.pte", "s3://b/out/a/m.pte", 6 * mib, j)  # one part
    assert small.copy_bytes == 0 and small.requests == 2 + (3 + 1 + 1) + 2 + 2
