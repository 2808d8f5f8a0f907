"""The fleet path of XNNPACK packed weights with the real runtime (executorch 1.4.1), on
moto and SeaweedFS: a real ``fleet run`` makes the file for the device whose CPU this
machine has, stores it beside the artifact and lists it in the index; a device's
``ensure INDEX --xnnpack-cache`` (a process of its own) fetches it, and a fresh process
loads the artifact with it bit-identically to a load without it. ``fetch
--xnnpack-cache`` delivers it too, ``verify`` checks it, and a byte flipped in the
stored file is caught before anything is handed out.

One file is made per server (the model is mlp_xnnpack_ext: its weights in a shared
.ptd, scaled per device by the test backend); the runtime runs again only for the fresh
load."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.s3job import s3_options_toml
from support.xnnpack_probe import env, fresh_load

import ptestore
from ptestore.cli import main
from ptestore.errors import IntegrityError
from ptestore.fleet.index import load_index
from ptestore.fleet.packed import record_url
from ptestore.fleet.packed_field import identity_claimed
from ptestore.testing.runtime import runtime_unavailable
from ptestore.testing.s3server import S3TestServer

pytestmark = [
    pytest.mark.interop,
    pytest.mark.s3,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _flags(opts: dict[str, object]) -> list[str]:
    return [
        x
        for k, v in opts.items()
        for x in ("-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]


def _job(tmp: Path, server: S3TestServer, bucket: str, cpu: str) -> Path:
    client = server.client()
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    client.put_object(Bucket=bucket, Key="src/m.pte", Body=EXT.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="src/m.ptd", Body=EXT.ptd_path.read_bytes())
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "s3://{bucket}/fleet/{{device}}/{{model}}.pte"\n'
        f'backends = ["{SPEC}"]\n'
        + s3_options_toml(server.storage_options)
        + f'[[models]]\nname = "m"\nsource = "s3://{bucket}/src/m.pte"\n'
        f'ptd = "s3://{bucket}/src/m.ptd"\n'
        f'[devices.phone]\nsoc = "x"\nscale = 2.0\nxnnpack_cpu = "{cpu}"\n'
        '[devices.plain]\nsoc = "y"\n'
    )
    return job


def _ensure(index: str, cache: Path, flags: list[str]) -> dict[str, object]:
    """``ptestore ensure INDEX --xnnpack-cache`` in a process of its own: the device."""
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "phone"]
    argv += ["--device-option", "soc=x", "--device-option", "scale=2.0"]  # the job's
    out = subprocess.run(
        [sys.executable, "-m", "ptestore", *argv, "--xnnpack-cache", "--json", *flags],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, object] = json.loads(out.stdout)
    return got


def test_the_fleet_path_delivers_it_from_s3_to_a_devices_ensure_index(
    s3_server: S3TestServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ptestore.xnnpack import adopt_cache, cpu_fingerprint, find_cache, verify_cache

    here = cpu_fingerprint()
    bucket = s3_server.new_bucket()
    job = _job(tmp_path, s3_server, bucket, here)
    opts = s3_server.storage_options
    flags = _flags(opts)

    # the fleet run makes it on this machine (it has the device's CPU), beside the artifact
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    pairs = {p["device"]: p for p in run["pairs"]}
    assert pairs["phone"]["status"] == "done" and "xnnpack" not in pairs["plain"]
    prefix = f"s3://{bucket}/fleet/phone/m.xnnpack-"
    assert pairs["phone"]["xnnpack"].startswith(f"XNNPACK packed-weight file made: {prefix}")
    index = run["index"]
    field = {e["device"]: e for e in load_index(index, **opts)["entries"]}["phone"]["xnnpack"]
    assert field["url"].startswith(prefix) and field["url"].endswith(".xpwc")
    assert (field["cpu"], field["entries"], field["refused"]) == (here, 2, None)
    assert field["executorch"]["version"] == "1.4.1+cpu"
    key = field["url"][len(f"s3://{bucket}/") :]
    stored = s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert len(stored) == field["size"]
    assert "sha256:" + hashlib.sha256(stored).hexdigest() == field["sha256"]
    # a plan now skips the pair: the artifact and its file are current
    assert main(["fleet", "plan", str(job), "--json"]) == 0
    planned = {p["device"]: p for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert planned["phone"]["action"] == "skip"
    assert planned["phone"]["reason"].endswith("; XNNPACK packed-weight file current")
    # select reports it (this machine's CPU); verify --job checks it
    assert ptestore.select(index, "m", "phone", storage_options=opts).xnnpack == field
    pte_url = f"s3://{bucket}/fleet/phone/m.pte"
    assert main(["verify", pte_url, "--job", str(job), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["xnnpack"] == field["url"]

    # the device: ensure INDEX --xnnpack-cache delivers it into the entry, verified
    got = _ensure(index, tmp_path / "cache", flags)
    assert got["xnnpack_from"] == "index"
    packed = Path(str(got["xnnpack_cache"]))
    pte, ptd = str(got["pte"]), str(got["ptd"])
    assert packed.parent == Path(pte).parent and packed.stat().st_mode & 0o777 == 0o444
    assert "sha256:" + verify_cache(packed, pte=pte, ptd=ptd).sha256 == field["sha256"]
    again = _ensure(index, tmp_path / "cache", flags)
    assert (again["xnnpack_from"], again["xnnpack_cache"]) == ("found", str(packed))

    # a fresh process loads the artifact with it: bit-identical to a load without it
    report, stderr = fresh_load(pte, packed, ptd=ptd)
    assert report == {
        "same_bytes": True,
        "dtype": "float32",
        "shape": [2, 8],
        "loads_with_options": 1,
    }
    assert "Loaded packed weight cache: /proc/self/fd/" in stderr  # the inode load() checked
    assert "(2 entries)" in stderr

    # fetch --xnnpack-cache delivers it beside DEST, where find_cache finds it (the clock
    # as if the file were installed 10 s after DEST was: within a clock tick of DEST's
    # publication its digest would not be remembered, tests/xnnpack/test_artifact_digests)
    import time

    import ptestore.xnnpack.digests as digests_module

    monkeypatch.setattr(digests_module, "now_ns", lambda: time.time_ns() + 10_000_000_000)
    dest = tmp_path / "fetched" / "m.pte"
    fetched = ptestore.fetch(
        index, dest, model="m", device="phone", storage_options=opts, xnnpack_cache=True
    )
    assert fetched.xnnpack is not None and fetched.xnnpack["sha256"] == field["sha256"]
    found = find_cache(dest, ptd=dest.with_suffix(".ptd"), directory=dest.parent)
    assert found is not None and str(found.path) == fetched.xnnpack["path"]

    # the installation remembered the artifact's digests it hashed: a quick check (what
    # an app's load(..., full=False) makes) hashes neither the .pte nor the .ptd again
    def no_hashing(path: object) -> str:
        raise AssertionError(f"{path} hashed again")

    with monkeypatch.context() as m:
        m.setattr(digests_module, "file_sha256", no_hashing)
        quick = find_cache(dest, ptd=dest.with_suffix(".ptd"), directory=dest.parent, full=False)
        assert quick is not None and quick.path == found.path
        assert verify_cache(found.path, pte=dest, ptd=dest.with_suffix(".ptd"), full=False)

    # a file made for another artifact is refused before it is installed
    other = tmp_path / "other.xpwc"
    other.write_bytes(packed.read_bytes())
    with pytest.raises(IntegrityError) as err:
        adopt_cache(
            other,
            pte=EXT.pte_path,
            ptd=EXT.ptd_path,
            directory=tmp_path,
            made_for=identity_claimed(field),
            size=field["size"],
            sha256=field["sha256"][7:],
        )
    assert str(err.value).startswith(
        f"{other}: made for another artifact, runtime or CPU (pte_sha256: "
    )
    assert not other.exists() and not list(tmp_path.glob("*.xpwc"))

    # one byte flipped in the stored file: caught before it is handed out
    flipped = bytearray(stored)
    flipped[100] ^= 0x40
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=bytes(flipped))
    bad = "sha256:" + hashlib.sha256(flipped).hexdigest()
    assert main(["verify", pte_url, "--job", str(job)]) == 2
    assert (
        f"{field['url']}: SHA-256 = '{bad}': must be {field['sha256']}" in capsys.readouterr().err
    )
    dest2 = tmp_path / "fetched2" / "m.pte"
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(
            index, dest2, model="m", device="phone", storage_options=opts, xnnpack_cache=True
        )
    # the file is one 4 MiB chunk: its chunk digest is its SHA-256
    refused = (
        f"{field['url']}: downloaded bytes 0:{field['size']} (chunk 0) have {bad}, its chunk "
        f"record (beside it, pinned by the index's chunks_root {field['chunks_root']}) says "
        f"{field['sha256']}; read twice: the object was damaged or changed after it was made"
    )
    assert str(err.value) == f"{refused}; {dest2} was published, no XNNPACK packed-weight file was"
    assert dest2.is_file() and sorted(p.name for p in dest2.parent.iterdir()) == ["m.ptd", "m.pte"]
    # ensure: the delivered file fails its check, is removed and never handed out (the
    # device then makes its own, as when the index has none for it)
    from ptestore.backends.compat import DeviceProfile
    from ptestore.device.indexed import packed_from_index
    from ptestore.xnnpack.identity import file_sha256

    phone = DeviceProfile("phone", {"soc": "x", "scale": 2.0})
    entry = ptestore.ensure(
        index, cache_dir=tmp_path / "cache2", model="m", device=phone, storage_options=opts
    )
    assert entry.choice is not None and entry.choice["xnnpack"] == field
    assert entry.ptd is not None
    digests = (file_sha256(entry.pte), file_sha256(entry.ptd))
    with caplog.at_level("WARNING", logger="ptestore.device"):
        got_back = packed_from_index(entry, str(Path(entry.pte).parent), digests, opts)
    assert got_back == (None, None)
    assert (
        f"{entry.pte}: the fleet's XNNPACK packed-weight file was not used ({refused}); "
        "making one here"
    ) in caplog.text
    assert not [p for p in Path(entry.pte).parent.iterdir() if ".xpwc" in p.name]

    # once the job no longer asks for it, gc removes the file and its record
    job.write_text(job.read_text().replace(f'xnnpack_cpu = "{here}"\n', ""))
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["gc", "--job", str(job), "--grace", "0", "--json"]) == 0
    removed = {
        e["location"]: e["kind"]
        for e in json.loads(capsys.readouterr().out)["entries"]
        if e["action"] == "removed"
    }
    assert removed == {field["url"]: "packed-weights", record_url(pte_url): "packed-record"}
