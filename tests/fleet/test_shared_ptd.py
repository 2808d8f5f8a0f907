"""A .ptd every device shares is stored once, by its content (issue 18, part 3).

A job of one real model with external weights (mlp_xnnpack_ext) for several devices:
the devices whose backend leaves the weights as they are share one .ptd, stored once
under ``_shared/sha256-tree/<hex>.ptd`` (the source's own bytes, copied by the service on
S3), each device keeps its own small .pte; the index points every pair at the shared
object, ``verify --job`` finds every pair current, and ``fetch`` gets a pair the real
ExecuTorch runtime loads. On moto and SeaweedFS, and with two workers publishing one
address at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import get_fixture

import ptestore
from ptestore.cli import main
from ptestore.coordinator import specialize_pair
from ptestore.errors import FormatError, IntegrityError, ObjectNotFound
from ptestore.fleet import load_job, plan_job, run_job
from ptestore.fleet.index import load_index
from ptestore.fleet.shared import SharedStore, shared_root
from ptestore.provenance import ProvenanceRequest
from ptestore.provenance.record import ContentDigest
from ptestore.testing.runtime import assert_outputs_match, runtime_unavailable
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer
from ptestore.writers.base import DataWriter

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
# Three devices leave the weights alone (scale 1: the source's .ptd), one scales them.
DEVICES = (
    '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nsoc = "s2"\n'
    '[devices.d3]\nsoc = "s3"\nscale = 2.0\n'
)


def _sha(data: bytes) -> str:
    return tree(data).partition(":")[2]


def _check_fetched(index: str, tmp: Path, opts: dict[str, Any]) -> None:
    """fetch d1's pair from the index: the source's .ptd beside its .pte, intact, and
    (where ExecuTorch is installed) loaded and run by the real runtime."""
    assert EXT.ptd_path is not None
    dest = tmp / "device" / "mlp.pte"
    result = ptestore.fetch(index, dest, model="mlp", device="d1", storage_options=opts)
    assert [f["path"] for f in result.files] == [str(tmp / "device" / "mlp.ptd"), str(dest)]
    assert (tmp / "device" / "mlp.ptd").read_bytes() == EXT.ptd_path.read_bytes()
    assert ptestore.verify(dest).status == "intact"
    if runtime_unavailable() is None:
        assert_outputs_match(
            dest,
            tmp / "device" / "mlp.ptd",
            inputs=EXT.inputs,
            reference=EXT.outputs_eager,
            atol=EXT.atol,
        )


@pytest.mark.s3
def test_a_shared_ptd_is_stored_once_on_s3(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="src/mlp.pte", Body=EXT.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="src/mlp.ptd", Body=EXT.ptd_path.read_bytes())
    opts = s3_server.storage_options
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "s3://{bucket}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[storage_options]\nendpoint_url = "{opts["endpoint_url"]}"\n'
        f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
        '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
        f'[[models]]\nname = "mlp"\nsource = "s3://{bucket}/src/mlp.pte"\n'
        f'ptd = "s3://{bucket}/src/mlp.ptd"\n' + DEVICES
    )
    first = run_job(load_job(job), workers=2)  # two workers may store one address at once
    assert [p.status for p in first.pairs] == ["done"] * 4, [p.error for p in first.pairs]
    listed = client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]
    sizes = {o["Key"]: o["Size"] for o in listed}
    ptds = sorted(k for k in sizes if k.endswith(".ptd"))
    source_ptd = EXT.ptd_path.read_bytes()
    # Two .ptd objects for four pairs: the source's (three devices) and the scaled one.
    assert len(ptds) == 2 and all(k.startswith("out/_shared/sha256-tree/") for k in ptds), ptds
    shared = f"out/_shared/sha256-tree/{_sha(source_ptd)}.ptd"
    assert shared in ptds
    assert client.get_object(Bucket=bucket, Key=shared)["Body"].read() == source_ptd
    assert sorted(k for k in sizes if k.endswith(".pte")) == [f"out/d{i}/mlp.pte" for i in range(4)]
    assert sum(sizes[k] for k in ptds) == 2 * len(source_ptd)  # not 4 copies

    index = load_index(f"s3://{bucket}/out/ptestore-index.json", **opts)
    by_device = {e["device"]: e["ptd"] for e in index["entries"]}
    for device in ("d0", "d1", "d2"):
        assert by_device[device] == {
            "url": f"s3://{bucket}/{shared}",
            "size": len(source_ptd),
            "sha256": f"sha256-tree:{_sha(source_ptd)}",
            "trailer_sha256": None,
            "shared": True,
        }
    assert by_device["d3"]["url"] != by_device["d0"]["url"]

    assert main(["verify", "--job", str(job)]) == 0
    assert capsys.readouterr().out.endswith("4 pairs: 4 current, 0 stale, 0 invalid\n")
    again = run_job(load_job(job), workers=1)
    assert [p.status for p in again.pairs] == ["skipped"] * 4
    # gc --job leaves the shared objects alone: they are artifacts, not leftovers.
    assert main(["gc", "--job", str(job), "--older-than", "0s"]) == 0
    capsys.readouterr()
    after = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert set(ptds) <= after
    _check_fetched(f"s3://{bucket}/out/ptestore-index.json", tmp_path, opts)


def _local_job(tmp: Path, devices: str = DEVICES) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return job


def test_local_job_stores_the_ptd_once_and_fetch_follows_it(tmp_path: Path) -> None:
    assert EXT.ptd_path is not None
    job = _local_job(tmp_path)
    result = run_job(load_job(job), workers=1)
    assert [p.status for p in result.pairs] == ["done"] * 4
    shared = tmp_path / "out" / "_shared" / "sha256-tree"
    source_name = _sha(EXT.ptd_path.read_bytes()) + ".ptd"
    names = sorted(p.name for p in shared.iterdir())
    assert len(names) == 2 and source_name in names
    assert not list((tmp_path / "out").glob("d*/*.ptd"))
    # The pairs that found the .ptd stored wrote no .ptd bytes: less through the client.
    assert result.pairs[1].bytes < result.pairs[0].bytes
    # fetch of the artifact's own URL finds the .ptd its record names above it.
    dest = tmp_path / "direct" / "mlp.pte"
    ptestore.fetch(tmp_path / "out" / "d2" / "mlp.pte", dest)
    assert (tmp_path / "direct" / "mlp.ptd").read_bytes() == EXT.ptd_path.read_bytes()
    _check_fetched(str(tmp_path / "out" / "ptestore-index.json"), tmp_path, {})
    # verify of a shared .ptd itself: intact when its bytes have its name's SHA-256.
    assert ptestore.verify(shared / source_name).status == "intact"
    damaged = tmp_path / "out" / "_shared" / "sha256-tree" / ("0" * 64 + ".ptd")
    damaged.write_bytes(EXT.ptd_path.read_bytes())
    report = ptestore.verify(damaged)
    assert report.status == "invalid" and report.error == (
        f"{damaged}: sha256 = 'sha256-tree:{source_name[:-4]}': must be "
        f"sha256-tree:{'0' * 64}, its content address (the shared .ptd was damaged or "
        "changed after it was stored)"
    )
    damaged.unlink()
    # verify --ptd with another pair's shared .ptd: stale, naming the field.
    other = next(p for p in shared.iterdir() if p.name != source_name)
    report = ptestore.verify(tmp_path / "out" / "d0" / "mlp.pte", ptd=other)
    assert report.status == "stale"
    assert [f.field for f in report.findings] == ["ptd_output.sha256"]
    assert "is the content address of another .ptd" in report.findings[0].message


def test_fetch_of_an_artifact_whose_ptd_is_nowhere(tmp_path: Path) -> None:
    job = _local_job(tmp_path, '[devices.d0]\nsoc = "s0"\n')
    assert run_job(load_job(job), workers=1).pairs[0].status == "done"
    for p in (tmp_path / "out" / "_shared" / "sha256-tree").iterdir():
        p.unlink()
    pte = tmp_path / "out" / "d0" / "mlp.pte"
    with pytest.raises(
        ObjectNotFound, match=r"its record names a \.ptd \(sha256-tree:[0-9a-f]{64}\); "
    ):
        ptestore.fetch(pte, tmp_path / "x" / "mlp.pte")
    with pytest.raises(ObjectNotFound, match="nor in a _shared/ directory above it"):
        ptestore.fetch(pte, tmp_path / "x" / "mlp.pte")
    assert plan_job(load_job(job)).pairs[0].reason.startswith("no .ptd at ")


def test_a_destination_inside_the_shared_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\n[devices._shared]\nsoc = "x"\n'
    )
    assert main(["fleet", "plan", str(job)]) == 2
    assert (
        f"pair (mlp, _shared)'s destination {tmp_path}/out/_shared/mlp.pte is in "
        f"{tmp_path}/out/_shared/, where the job stores each .ptd once by its content"
    ) in capsys.readouterr().err


class _Racing(SharedStore):
    """The real store, whose writer lets another writer store ``body`` at the same
    address right before its own commit (the writers' race hook)."""

    def __init__(self, root: str, body: bytes) -> None:
        super().__init__(root, {})
        self.body = body

    def writer(self, content: ContentDigest) -> DataWriter:
        w = super().writer(content)

        def other_first(_: DataWriter) -> None:
            other = open_writer(self.url(content))
            other.write(self.body, 0)
            other.publish("create")

        w.commit_hook = other_first
        return w


def _specialize(tmp: Path, store: SharedStore) -> Any:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    tmp.mkdir()
    return specialize_pair(
        EXT.pte_path,
        tmp / "a.pte",
        ptd=(EXT.ptd_path, tmp / "a.ptd"),
        backends=[SPEC],
        device=ptestore.backends.compat.DeviceProfile("d", {"scale": 2.0}),
        provenance=ProvenanceRequest(),
        ptd_store=store,
    )


def test_two_writers_of_one_address(tmp_path: Path) -> None:
    root = shared_root(f"{tmp_path}/{{device}}/{{model}}.pte")
    first = _specialize(tmp_path / "one", SharedStore(root, {}))
    (stored,) = [f for f in first.files if f.role == "ptd"]
    assert stored.status == "shared"
    assert Path(stored.destination).parent == tmp_path / "_shared/sha256-tree"
    body = Path(stored.destination).read_bytes()
    Path(stored.destination).unlink()
    # Another worker stores the same bytes first: accepted once they check.
    raced = _specialize(tmp_path / "two", _Racing(root, body))
    assert [f.status for f in raced.files if f.role == "ptd"] == ["stored"]
    assert Path(stored.destination).read_bytes() == body
    assert not (tmp_path / "two" / "a.ptd").exists()
    # Other bytes at the address are never accepted.
    Path(stored.destination).unlink()
    with pytest.raises(IntegrityError) as err:
        _specialize(tmp_path / "three", _Racing(root, body[:-1] + bytes([body[-1] ^ 1])))
    assert str(err.value) == (
        f"{stored.destination}: another writer stored an object at this content address, "
        f"but its bytes are not sha256-tree:{Path(stored.destination).stem} ({len(body)} bytes)"
    )
    assert not (tmp_path / "three" / "a.pte").exists()


def test_index_versions(tmp_path: Path) -> None:
    """Version 1 (before shared entries) is read; an unknown version is refused, and so
    is a version 3 root without its layout."""
    path = tmp_path / "ptestore-index.json"
    path.write_text('{"format": "ptestore.index", "version": 1, "entries": []}')
    assert load_index(path)["version"] == 1
    path.write_text('{"format": "ptestore.index", "version": 4, "entries": []}')
    with pytest.raises(FormatError) as err:
        load_index(path)
    assert str(err.value) == f"{path}: index version = 4: must be 1, 2 or 3"
    path.write_text('{"format": "ptestore.index", "version": 3, "entries": []}')
    with pytest.raises(FormatError) as err:
        load_index(path)
    assert str(err.value) == f"{path}: index layout = None: must be an object"


def test_an_old_ptd_beside_a_fleet_pte_does_not_hide_the_shared_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A per-device .ptd an earlier version wrote beside the .pte (docs/fleet.md: no
    longer used, delete when convenient) is passed over for the shared copy the record
    names: plan, verify, verify --job and fetch agree the pair is current; with the
    shared copy gone, the old one is stale and fetch refuses it."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    job = _local_job(tmp_path, '[devices.d0]\nsoc = "s0"\n')
    out = tmp_path / "out" / "d0"
    out.mkdir(parents=True)
    ptestore.specialize(  # another version of the weights, written side by side
        EXT.pte_path,
        out / "mlp.pte",
        ptd=(EXT.ptd_path, out / "mlp.ptd"),
        backends=["support.doubling_backend:Doubling=mlp_xnnpack_ext"],
    )
    old = (out / "mlp.ptd").read_bytes()
    assert run_job(load_job(job), workers=1).pairs[0].status == "done"
    assert plan_job(load_job(job)).pairs[0].action == "skip"
    shared = tmp_path / "out" / "_shared" / "sha256-tree" / (_sha(EXT.ptd_path.read_bytes()))
    shared = shared.with_suffix(".ptd")
    assert shared.is_file() and (out / "mlp.ptd").read_bytes() == old
    report = ptestore.verify(out / "mlp.pte")
    assert (report.status, report.ptd) == ("intact", str(shared))
    assert ptestore.verify(out / "mlp.pte", quick=True).status == "intact"
    assert main(["verify", "--job", str(job)]) == 0
    assert "1 current, 0 stale, 0 invalid" in capsys.readouterr().out
    result = ptestore.fetch(out / "mlp.pte", tmp_path / "dl" / "mlp.pte")
    assert next(f["path"] for f in result.files) == str(tmp_path / "dl" / "mlp.ptd")
    assert (tmp_path / "dl" / "mlp.ptd").read_bytes() == EXT.ptd_path.read_bytes()
    # a .ptd without a trailer beside it (fetched from elsewhere): the shared one too
    other = get_fixture("mlp_portable_ext").ptd_path
    assert other is not None
    (out / "mlp.ptd").write_bytes(other.read_bytes())
    assert ptestore.verify(out / "mlp.pte").ptd == str(shared)
    ptestore.fetch(out / "mlp.pte", tmp_path / "dl2" / "mlp.pte")
    assert (tmp_path / "dl2" / "mlp.ptd").read_bytes() == EXT.ptd_path.read_bytes()
    # neither matches: the one beside it is stale, and fetch refuses it
    shared.unlink()
    (out / "mlp.ptd").write_bytes(old)
    report = ptestore.verify(out / "mlp.pte")
    assert (report.status, report.ptd) == ("stale", str(out / "mlp.ptd"))
    assert [f.field for f in report.findings] == ["ptd_output.sha256", "ptd_output.key"]
    with pytest.raises(IntegrityError, match=r"is not the \.ptd .* was made with"):
        ptestore.fetch(out / "mlp.pte", tmp_path / "dl3" / "mlp.pte")


def test_a_byte_flipped_in_place_with_its_mtime_restored_is_read_again(tmp_path: Path) -> None:
    """What this process remembers of a checked shared object is keyed by its size,
    mtime, ctime, inode and device: a byte flipped in place with the mtime set back
    changes the ctime, so the object is read again and found damaged (was: keyed
    without the ctime, the remembered digest reused, the damaged object taken as the
    content and indexed)."""
    import os

    from support.delta import flip

    from ptestore.fleet.shared import check_shared
    from ptestore.provenance.digest import content_digest
    from ptestore.storage.loaders import open_loader

    path = tmp_path / "_shared" / "sha256-tree" / "x.ptd"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(range(256)) * 64)
    with open_loader(path) as loader:
        content = content_digest(loader, loader.size())
        assert check_shared(loader, content) is None
    was = path.stat()
    flip(path, 1000)
    os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))
    # A clock without fine-grained change times may give the flip the tick the file was
    # made in (a real damage comes long after): touched until it moves.
    while path.stat().st_ctime_ns == was.st_ctime_ns:
        os.chmod(path, was.st_mode)
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (was.st_size, was.st_mtime_ns, was.st_ino)
    with open_loader(path) as loader:
        reason = check_shared(loader, content)
    assert reason is not None
    assert reason.startswith(f"{path}: the bytes have sha256-tree:")
    assert reason.endswith(
        f"the record names {content.sha256}: damaged or changed after they were stored"
    )
