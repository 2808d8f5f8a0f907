"""A flipped byte anywhere in a fleet artifact (a segment of the .pte, its FlatBuffer,
the .ptd) is caught by ``verify`` and redone by the next ``fleet run``: on local files
and on S3 (moto and SeaweedFS), where the plan checks the stored full-object CRC-32
without downloading the artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.fleet import load_job, plan_job
from ptestore.format.reader import read_container
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.trailer import ContentView
from ptestore.storage.loaders import BytesLoader, open_loader
from ptestore.storage.s3checksum import s3_object
from ptestore.testing.s3server import S3TestServer
from ptestore.verification import verify

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
DEVICES = '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "x"\nscale = 3.0\n'


def _segment_middle(data: bytes) -> int:
    loader = BytesLoader(data)
    trailer = read_trailer(loader)  # none on a .ptd stored once by content
    content = loader if trailer is None else ContentView(loader, trailer.content_size)
    c = read_container(content).container
    seg = max(c.segments, key=lambda s: s.size)
    return c.absolute(seg) + seg.size // 2


def _shared_ptd(pte: str, opts: dict[str, Any]) -> str:
    """Where the fleet stored the .ptd the .pte at ``pte`` was made with."""
    loader = open_loader(pte, **opts)
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    assert prov is not None and prov.ptd_output is not None
    base = pte.rsplit("/", 2)[0]
    return f"{base}/_shared/sha256-tree/{prov.ptd_output.sha256.partition(':')[2]}.ptd"


def _flip(data: bytes, where: str) -> bytes:
    out = bytearray(data)
    out[_segment_middle(data) if where != "flatbuffer" else 40] ^= 0x01
    return bytes(out)


def _cycle(job: Path, flips: dict[str, Any], opts: dict[str, Any], capsys: Any) -> None:
    """Run, damage the artifact of each device in ``flips`` (device -> function), then:
    verify says invalid, the plan runs exactly those pairs again, the next run redoes
    them and they are intact."""
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] == 2
    pairs = {p.device.name: p for p in load_job(job).pairs()}
    for device, flip in flips.items():
        assert verify(pairs[device].destination, storage_options=opts).status == "intact"
        flip()
        report = verify(pairs[device].destination, storage_options=opts)
        assert report.status == "invalid" and report.exit_code == 2, report.message()
    plan = plan_job(load_job(job))
    actions = {p.pair.device.name: (p.action, p.reason) for p in plan.pairs}
    for device, (action, reason) in actions.items():
        assert action == ("run" if device in flips else "skip"), actions
        if device in flips:
            assert "damaged or changed after they were" in reason or (
                "damaged provenance" in reason
            ), reason
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["done"], shown["skipped"]) == (len(flips), 2 - len(flips))
    for device in flips:
        assert verify(pairs[device].destination, storage_options=opts).status == "intact"


@pytest.mark.parametrize("where", ["segment", "flatbuffer", "ptd"])
def test_local(tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + DEVICES
    )
    pte = tmp_path / "out" / "a" / "m.pte"

    def flip() -> None:
        target = Path(_shared_ptd(str(pte), {})) if where == "ptd" else pte
        target.write_bytes(_flip(target.read_bytes(), where))

    _cycle(job, {"a": flip}, {}, capsys)


@pytest.mark.s3
def test_s3(s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="src/m.pte", Body=EXT.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="src/m.ptd", Body=EXT.ptd_path.read_bytes())
    opts = s3_server.storage_options
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "s3://{bucket}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[storage_options]\nendpoint_url = "{opts["endpoint_url"]}"\n'
        f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
        '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
        f'[[models]]\nname = "m"\nsource = "s3://{bucket}/src/m.pte"\n'
        f'ptd = "s3://{bucket}/src/m.ptd"\n' + DEVICES
    )

    def flipper(name: str, where: str) -> Any:
        def flip() -> None:
            key = name if where != "ptd" else shared_key(name)
            # Damaged and rewritten with its metadata kept: the record and the
            # x-amz-meta keys still claim the old bytes; the stored checksum does not.
            loader = open_loader(f"s3://{bucket}/{key}", **opts)
            try:
                # The writer's PutObject names its algorithm (CRC64NVME): both servers
                # keep the checksum and the plan downloads nothing to trust the object.
                obj = s3_object(loader)
                assert obj is not None
                stored = obj.checksum()
                assert stored is not None and stored.algorithm == "CRC64NVME"
            finally:
                loader.close()
            obj = client.get_object(Bucket=bucket, Key=key)
            body = _flip(obj["Body"].read(), where)
            client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=obj["Metadata"])

        return flip

    # A segment of one pair's .pte, the .ptd of the other pair (stored once by content).
    def shared_key(pte: str) -> str:
        key = _shared_ptd(f"s3://{bucket}/{pte}", opts)[len(f"s3://{bucket}/") :]
        assert key.startswith("out/_shared/sha256-tree/")
        return key

    flips = {"a": flipper("out/a/m.pte", "segment"), "b": flipper("out/b/m.pte", "ptd")}
    _cycle(job, flips, opts, capsys)


def test_verify_job_checks_every_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + DEVICES
    )
    assert main(["verify", "--job", str(job)]) == 2  # nothing made yet: each pair says so
    assert "2 pairs: 0 current, 0 stale, 2 invalid" in capsys.readouterr().out
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    assert main(["verify", "--job", str(job)]) == 0
    assert capsys.readouterr().out.endswith("2 pairs: 2 current, 0 stale, 0 invalid\n")
    ptd = Path(_shared_ptd(str(tmp_path / "out" / "b" / "m.pte"), {}))
    ptd.write_bytes(_flip(ptd.read_bytes(), "ptd"))
    assert main(["verify", "--job", str(job), "--json"]) == 2
    shown = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in shown["pairs"]] == ["current", "invalid"]
    assert shown["pairs"][1]["error"].startswith(f"{ptd}: ptd_output.sha256 = ")
    assert "the .ptd was damaged or changed after it was stored" in shown["pairs"][1]["error"]
    assert main(["verify", "--job", str(job), "--source", "x.pte"]) == 2
    assert "--source, --backend, --device, --device-option and --ptd do not apply" in (
        capsys.readouterr().err
    )
    for given in ("0:100", "abc", "7:7"):  # refused, never ignored after the full checks
        assert main(["verify", "--job", str(job), "--range", given]) == 2
        out, err = capsys.readouterr()
        assert (out, err) == (
            "",
            f"ptestore verify: error: verify --job without URL checks every pair of the job: "
            f"--range {given} names bytes of one artifact (give its URL: verify URL --job JOB "
            "--range START:END); --quick checks every pair without reading its bytes\n",
        )
