"""The index a fleet run publishes, selection by device, and verified, resumable
fetches: on local files and on S3 (moto and SeaweedFS)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.delta import big_job
from support.digests import tree
from support.fixtures import get_fixture
from support.fleetrun import fleet_run, fleet_run_json
from support.s3job import s3_options_toml
from support.together import run_together

import ptestore
from ptestore.cli import main
from ptestore.errors import IntegrityError
from ptestore.fleet.index import load_index, publish_index
from ptestore.fleet.index_v3 import model_segment
from ptestore.provenance import read_trailer
from ptestore.storage.loaders import BytesLoader
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
DEVICES = '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\nscale = 3.0\n'


def _job(tmp: Path, dest: str, devices: str = DEVICES, extra: str = "") -> Path:
    job = tmp / f"job{len(list(tmp.glob('job*.toml')))}.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return job


def _sha_before_trailer(path: Path) -> str:
    data = path.read_bytes()
    prov = read_trailer(BytesLoader(data))
    assert prov is not None
    return tree(data[: prov.content_size])


def test_index_select_and_fetch_locally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    first = fleet_run_json(_job(tmp_path, str(out)), capsys)
    assert first["index"] == f"{out}/ptestore-index.json"
    # A second job onto the same prefix (another device) keeps the first job's entries.
    second = fleet_run_json(
        _job(tmp_path, str(out), '[devices.c]\nsoc = "x"\nscale = 5.0\n'), capsys
    )
    assert second["index"] == first["index"]
    index = load_index(first["index"])
    assert (index["format"], index["version"]) == ("ptestore.index", 2)
    assert [(e["model"], e["device"]) for e in index["entries"]] == [
        ("m", "a"),
        ("m", "b"),
        ("m", "c"),
    ]
    a = index["entries"][0]
    pte = out / "a" / "m.pte"
    # The .ptd is stored once by its content (no trailer: its name is its SHA-256).
    ptd = Path(a["ptd"]["url"])
    assert a["ptd"]["sha256"] == tree(ptd.read_bytes())
    assert a["ptd"] == {
        "url": f"{out}/_shared/sha256-tree/{a['ptd']['sha256'].partition(':')[2]}.ptd",
        "size": ptd.stat().st_size,
        "sha256": a["ptd"]["sha256"],
        "trailer_sha256": None,
        "shared": True,
    }
    assert a["pte"]["url"] == str(pte) and a["pte"]["size"] == pte.stat().st_size
    assert a["pte"]["sha256"] == _sha_before_trailer(pte)
    assert a["compatibility"] == [
        {
            "id": "XnnpackBackend",
            "spec": SPEC,
            "version": "1.0",
            "compatibility": "scaler;soc=x;v=1.0",
        }
    ]
    assert a["device_options"] == {"soc": "x", "scale": 2.0}

    # select: the device's own artifact; another device of the same SoC gets an optimal
    # one (rated by the backend installed on the selecting device, never by what the
    # index names); an unknown SoC falls back to the portable source, saying why.
    from support.fleet_backend import Scaler

    from ptestore.backends import register_backend, unregister_backend

    register_backend(Scaler, "scaler")  # installed on the selecting device
    own = ptestore.select(index, "m", "a")
    assert (own.kind, own.made_for, own.rating) == ("artifact", "a", "optimal")
    assert main(["select", first["index"], "--model", "m", "--device", "new",
                 "--device-option", "soc=y", "--json"]) == 0  # fmt: skip
    shown = json.loads(capsys.readouterr().out)
    assert (shown["kind"], shown["made_for"], shown["rating"]) == ("artifact", "b", "optimal")
    none = ptestore.select(index, "m", ptestore.backends.compat.DeviceProfile("z", {"soc": "q"}))
    assert none.kind == "source" and none.pte["url"] == str(EXT.pte_path)
    assert none.reason.startswith("no artifact of 'm' fits 'z' (a: ")
    assert none.reason.endswith("falling back to the portable source")
    unregister_backend("scaler")
    assert main(["select", first["index"], "--model", "nope", "--device", "a"]) == 2
    assert capsys.readouterr().err == (
        f"ptestore select: error: {first['index']}: index has no model 'nope' (models: m)\n"
    )

    # fetch: verified, published atomically, the shared .ptd beside the .pte.
    dest = tmp_path / "device" / "model.pte"
    assert main(["fetch", first["index"], str(dest), "--model", "m", "--device", "a"]) == 0
    assert dest.read_bytes() == pte.read_bytes()
    assert (tmp_path / "device" / "model.ptd").read_bytes() == ptd.read_bytes()
    assert ptestore.verify(dest).status == "intact"
    # A damaged artifact is never published by fetch.
    data = bytearray(pte.read_bytes())
    data[len(data) // 3] ^= 1
    pte.write_bytes(bytes(data))
    other = tmp_path / "other" / "model.pte"
    bad = r"downloaded bytes 0:\d+ \(chunk 0\) have sha256:"
    with pytest.raises(IntegrityError, match=bad) as info:
        ptestore.fetch(first["index"], other, model="m", device="a")
    assert info.value.published is False
    assert not other.exists() and not Path(str(other) + ".part").exists()
    # Every file is checked before any is published: the pair's good .ptd is not either.
    assert not (tmp_path / "other" / "model.ptd").exists()
    argv = ["fetch", first["index"], str(other), "--model", "m", "--device", "a"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore fetch: failed, nothing published: {pte}: downloaded bytes")
    assert not other.exists() and not (tmp_path / "other" / "model.ptd").exists()


_KILLER = """
import os, signal, sys
import ptestore
seen = []
def progress(url, done, total):
    seen.append(done)
    if url.endswith(".pte") and done >= total // 2:
        os.kill(os.getpid(), signal.SIGKILL)
ptestore.fetch(sys.argv[1], sys.argv[2], model="m", device="a", chunk_size=256,
               storage_options=__import__("json").loads(sys.argv[3]), progress=progress)
"""


def _fetch_killed_halfway(index: str, dest: Path, opts: dict[str, Any]) -> None:
    """Killed (SIGKILL) once the progress passes half the .pte: the chunks verified
    before are counted in ``DEST.part.json``, nothing is published."""
    # The child imports the test backend too (it rates the artifacts; without it the
    # selection would fall back to the portable source).
    tests = str(Path(__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLER, index, str(dest), json.dumps(opts)],
        capture_output=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert not dest.exists()  # nothing partial is visible
    assert os.path.getsize(str(dest) + ".part") > 0
    state = json.loads(Path(str(dest) + ".part.json").read_text())
    assert 0 < state["verified"] < 6, state  # of its six chunks


def test_fetch_resumes_after_being_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    index = fleet_run(big_job(tmp_path, str(out)), capsys)
    dest = tmp_path / "dl" / "m.pte"
    _fetch_killed_halfway(index, dest, {})
    verified = json.loads(Path(str(dest) + ".part.json").read_text())["verified"]
    result = ptestore.fetch(index, dest, model="m", device="a", chunk_size=256)
    pte_file = next(f for f in result.files if f["path"] == str(dest))
    # Resumed after the verified chunks (4 MiB each), never past them.
    assert pte_file["resumed_from"] == verified * (4 << 20)
    assert pte_file["received"] < pte_file["size"]
    assert dest.read_bytes() == (out / "a" / "m.pte").read_bytes()
    assert not Path(str(dest) + ".part").exists()


@pytest.mark.s3
def test_s3_index_concurrent_and_fetch_resume(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.new_bucket()
    opts = s3_server.storage_options
    extra = s3_options_toml(opts)
    first = fleet_run_json(_job(tmp_path, f"s3://{bucket}/fleet", extra=extra), capsys)
    url = first["index"]
    assert url == f"s3://{bucket}/fleet/ptestore-index.json"
    # Overlapping writers: each conditional write merges; no entry is lost.
    base = load_index(url, **opts)["entries"][0]

    def add(i: int) -> None:
        publish_index(url, [dict(base, device=f"extra{i}")], opts)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    devices = [e["device"] for e in load_index(url, **opts)["entries"]]
    assert devices == ["a", "b"] + [f"extra{i}" for i in range(6)]
    head = s3_server.client().head_object(Bucket=bucket, Key="fleet/ptestore-index.json")
    assert head["ContentType"] == "application/json"

    # fetch from S3, killed halfway, resumed with ranged GETs pinned to the ETag.
    big = fleet_run(big_job(tmp_path, f"s3://{bucket}/big", extra=extra), capsys)
    dest = tmp_path / "dl" / "m.pte"
    _fetch_killed_halfway(big, dest, opts)
    verified = json.loads(Path(str(dest) + ".part.json").read_text())["verified"]
    result = ptestore.fetch(big, dest, model="m", device="a", chunk_size=256, storage_options=opts)
    got = next(f for f in result.files if f["path"] == str(dest))
    assert got["resumed_from"] == verified * (4 << 20)
    client = s3_server.client()
    want = client.get_object(Bucket=bucket, Key="big/a/m.pte")["Body"].read()
    assert dest.read_bytes() == want
    # Killed again, then the object changes: the download restarts and, since the new
    # bytes are not the ones the index names, nothing is published.
    dest2 = tmp_path / "dl2" / "m.pte"
    _fetch_killed_halfway(big, dest2, opts)
    other = client.get_object(Bucket=bucket, Key="fleet/b/m.pte")["Body"].read()
    client.put_object(Bucket=bucket, Key="big/a/m.pte", Body=other)
    with pytest.raises(IntegrityError):
        ptestore.fetch(big, dest2, model="m", device="a", chunk_size=256, storage_options=opts)
    assert not dest2.exists()


def test_local_index_with_8_racing_writers_loses_no_entry(tmp_path: Path) -> None:
    """8 threads, each merging 3 entries one by one into one local index: every merge
    reads, merges and publishes with if-match (a lock-free read-merge-rename loses
    entries here: checked by removing the writer's compare-and-swap)."""
    url = str(tmp_path / "fleet" / "ptestore-index.json")
    writers, each = 8, 3
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def add(i: int) -> None:
        try:
            barrier.wait()
            for j in range(each):
                publish_index(url, [{"model": "m", "device": f"w{i}-{j}"}], {})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    index = load_index(url)
    assert [e["device"] for e in index["entries"]] == sorted(
        f"w{i}-{j}" for i in range(writers) for j in range(each)
    )
    assert (index["format"], index["sharded"]["version"]) == ("ptestore.index", 3)
    shards = index["sharded"]["layout"]["shards"]
    assert sorted(os.listdir(tmp_path / "fleet")) == ["ptestore-index.json", shards]
    model = tmp_path / "fleet" / shards / "m" / model_segment("m")
    assert sorted(os.listdir(model)) == [
        ".catalog.json.ptestore.lock",
        ".t.json.ptestore.lock",
        "catalog.json",
        "t.json",
    ]


def test_an_index_that_keeps_changing_names_the_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every publish meets another version (planted: each object read is stale by the
    time it publishes): after the retry policy's attempts the error says so, naming the
    shard and the versions of the last conflict."""
    from ptestore import _retry
    from ptestore.errors import PreconditionFailed
    from ptestore.writers import versions

    url = str(tmp_path / "ptestore-index.json")
    publish_index(url, [{"model": "m", "device": "a"}], {})
    real = versions.read_versioned

    def stale(u: Any, **kw: Any) -> Any:
        got = real(u, **kw)
        if got.version is not None and str(u) != url:
            Path(u).write_text(Path(u).read_text() + " ")  # someone else wrote it
        return got

    monkeypatch.setattr(versions, "read_versioned", stale)
    monkeypatch.setattr(_retry, "CONFLICT_RETRY", _retry.RetryPolicy(attempts=3, initial=0))
    with pytest.raises(PreconditionFailed) as info:
        publish_index(url, [{"model": "m", "device": "b"}], {})
    shards = load_index(url)["sharded"]["layout"]["shards"]
    leaf = str(tmp_path / shards / "m" / model_segment("m") / "t.json")
    assert str(info.value).startswith(
        f"{leaf}: the index changed under every one of 3 attempts to merge into it (last: "
        f"{leaf}: publish(mode='if-match') expected version sha256:"
    )
    assert info.value.url == leaf and info.value.found != info.value.expected
    monkeypatch.setattr(versions, "read_versioned", real)
    assert [e["device"] for e in load_index(url)["entries"]] == ["a"]


_RACER = """
import os, sys, time
from pathlib import Path
from ptestore.fleet.index import publish_index
url, name, ready, go = sys.argv[1:5]
Path(ready).touch()
ceiling = time.monotonic() + 300
while not os.path.exists(go):  # start together
    if time.monotonic() > ceiling:
        sys.exit("never told to go")
    time.sleep(0.001)
for j in range(6):
    publish_index(url, [{"model": "m", "device": f"{name}-{j}"}], {})
"""


def test_local_index_with_8_racing_processes_loses_no_entry(tmp_path: Path) -> None:
    """The same between processes (each merges 6 entries once all 8 are ready): the
    version check and the flock beside the index hold across processes. Removing the
    check fails this one; removing only the lock fails the thread test above, whose
    interleavings are denser."""
    url = str(tmp_path / "fleet" / "ptestore-index.json")
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(8)]
    commands = [
        [sys.executable, "-c", _RACER, url, f"p{i}", str(ready[i]), str(go)] for i in range(8)
    ]
    results = run_together(commands, ready, go, timeout=600)
    assert all(rc == 0 for rc, _ in results), results
    assert [e["device"] for e in load_index(url)["entries"]] == sorted(
        f"p{i}-{j}" for i in range(8) for j in range(6)
    )
