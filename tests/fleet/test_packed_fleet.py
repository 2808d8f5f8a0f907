"""XNNPACK packed-weight files in a fleet, without running the runtime: a device's
``xnnpack_cpu`` in the job file, the run's refusal before any pair when no worker has
that CPU (inline, on the process pool, on Dask), and a refusal by the runtime recorded
beside the artifact, listed by the index and served as one on the device (a program
without XNNPACK weights is refused before any runtime runs). The real runtime making,
delivering and loading the file: tests/fleet/test_packed_delivery.py."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.fleet import JobError, load_job, run_job
from ptestore.fleet.index import load_index
from ptestore.fleet.packed import record_url
from ptestore.xnnpack import cpu_fingerprint

# The [xnnpack] extra: its runtime is asked for. Where the interop suite is required (CI),
# a missing executorch fails these tests instead of skipping them.
if os.environ.get("PTESTORE_REQUIRE_INTEROP", "") in ("", "0"):
    pytest.importorskip("executorch", reason="the [xnnpack] extra (executorch) is not installed")

MLP = get_fixture("mlp_xnnpack")
PORTABLE = get_fixture("mlp_portable")
SPEC = "support.fleet_backend:Scaler=1.0"
PHONE = "aarch64/page=4096:asimd,asimddp,i8mm"
HERE = cpu_fingerprint()
NOTHING_TO_PACK = "it has no XNNPACK delegate with named weights (nothing to pack)"


def _job(tmp: Path, source: Path, cpu: str, *, name: str = "job.toml", scale: float = 2.0) -> Path:
    job = tmp / name
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{source}"\n'
        f'[devices.phone]\nsoc = "x"\nscale = {scale}\nxnnpack_cpu = "{cpu}"\n'
        '[devices.plain]\nsoc = "y"\n'
    )
    return job


def test_the_job_file_declares_a_devices_cpu_apart_from_its_options(tmp_path: Path) -> None:
    job = load_job(_job(tmp_path, MLP.pte_path, PHONE))
    assert job.xnnpack_cpu == {"phone": PHONE}
    phone = job.device("phone")
    # not a device option: not handed to backends, not in the device's digest
    assert phone == DeviceProfile("phone", {"soc": "x", "scale": 2.0})
    assert [(p.device.name, p.xnnpack_cpu) for p in job.pairs()] == [
        ("phone", PHONE),
        ("plain", None),
    ]
    # an arm64 fingerprint names its first core's MIDR_EL1 when the kernel exposes it
    midr = "aarch64/page=16384/midr=0x411fd4c0:asimd,asimddp,i8mm"
    assert load_job(_job(tmp_path, MLP.pte_path, midr, name="midr.toml")).xnnpack_cpu == {
        "phone": midr
    }
    bad = _job(tmp_path, MLP.pte_path, "avx2", name="bad.toml")
    with pytest.raises(JobError) as err:
        load_job(bad)
    assert str(err.value) == (
        f"{bad}:9: devices.phone.xnnpack_cpu: 'avx2': must be the device's CPU fingerprint, "
        "as `python -m ptestore.xnnpack fingerprint` prints it on the device (e.g. "
        "'aarch64/page=4096:asimd,asimddp,i8mm')"
    )
    for other in ("aarch64/page=4096/midr=410fd4c0:asimd", "aarch64/page=4096/midr=0x1:asimd"):
        with pytest.raises(JobError, match="must be the device's CPU fingerprint"):
            load_job(_job(tmp_path, MLP.pte_path, other, name="bad2.toml"))


def _refusal(job: Path, workers: str) -> str:
    return (
        f"{job}: device 'phone' declares xnnpack_cpu '{PHONE}', and no worker of this run "
        "has that CPU and the ExecuTorch runtime to make its XNNPACK packed-weight files "
        f"(the workers have '{HERE}' on {workers}); run it where such a worker is, or "
        "remove xnnpack_cpu from the device"
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_no_worker_with_the_devices_cpu_is_refused_before_any_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    job = _job(tmp_path, MLP.pte_path, PHONE)
    with pytest.raises(JobError) as err:
        run_job(load_job(job), workers=workers)
    here = f"this machine ({socket.gethostname()})"
    assert str(err.value) == _refusal(job, here)
    assert not (tmp_path / "out" / "phone").exists()  # no pair ran, not even plain's
    assert not (tmp_path / "out" / "plain").exists()
    assert main(["fleet", "run", str(job), "--workers", str(workers)]) == 2
    assert capsys.readouterr().err.startswith(f"ptestore fleet: error: {_refusal(job, here)}")
    # a plan writes nothing and runs nothing: it says what a run would do
    assert main(["fleet", "plan", str(job)]) == 0


def test_no_dask_worker_with_the_devices_cpu_is_refused_before_any_pair(tmp_path: Path) -> None:
    import distributed

    job = _job(tmp_path, MLP.pte_path, PHONE)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        (worker,) = cluster.scheduler_info["workers"]
        with pytest.raises(JobError) as err:
            run_job(load_job(job), scheduler=cluster.scheduler_address)
    assert str(err.value) == _refusal(job, worker)
    assert not (tmp_path / "out" / "plain").exists()


def test_a_refusal_by_the_runtime_is_recorded_and_the_model_still_served(tmp_path: Path) -> None:
    """A program whose graph XNNPACK cannot cache (here: it has no XNNPACK weights at
    all, refused before any runtime runs) on a Dask worker with the device's CPU."""
    import distributed

    job = load_job(_job(tmp_path, PORTABLE.pte_path, HERE))
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        result = run_job(job, scheduler=cluster.scheduler_address)
    by_device = {p.device: p for p in result.pairs}
    assert {d: p.status for d, p in by_device.items()} == {"phone": "done", "plain": "done"}
    why = f"XNNPACK packed weights refused by the runtime (recorded): {NOTHING_TO_PACK}"
    assert by_device["phone"].xnnpack == why
    assert by_device["phone"].to_dict()["xnnpack"] == why
    assert f"xnnpack: m on phone: {why}" in result.summary().splitlines()
    assert "xnnpack" not in by_device["plain"].to_dict()
    pte = tmp_path / "out" / "phone" / "m.pte"
    assert pte.is_file() and Path(record_url(str(pte))).is_file()
    assert not list(pte.parent.glob("*.xpwc"))

    assert result.index is not None
    index = load_index(result.index)
    entries = {e["device"]: e for e in index["entries"]}
    assert "xnnpack" not in entries["plain"]  # its device asks for none
    field = entries["phone"]["xnnpack"]
    assert field["refused"] == NOTHING_TO_PACK and field["url"] is None
    assert field["cpu"] == HERE and field["executorch"]["version"] == "1.4.1+cpu"

    # select reports it for this CPU only
    assert ptestore.select(result.index, "m", "phone").xnnpack == field
    assert ptestore.select(result.index, "m", "phone", cpu=PHONE).xnnpack is None
    assert ptestore.select(result.index, "m", "plain").xnnpack is None  # an entry without it
    # the device is served the model, with the fleet's reason, without a runtime run
    got = ptestore.ensure(
        result.index,
        cache_dir=tmp_path / "cache",
        model="m",
        device=job.device("phone"),
        xnnpack_cache=True,
    )
    assert Path(got.pte).is_file() and got.xnnpack_cache is None
    assert got.xnnpack_refused == f"{NOTHING_TO_PACK} (refused by the fleet's runtime)"

    # a rerun skips the pair: the artifact and its recorded refusal are current
    again = run_job(load_job(tmp_path / "job.toml"), workers=1)
    phone = next(p for p in again.pairs if p.device == "phone")
    assert phone.status == "skipped"
    assert phone.xnnpack == f"XNNPACK packed weights refused by the runtime: {NOTHING_TO_PACK}"
    # verify --job checks the record beside the artifact: current
    assert main(["verify", str(pte), "--job", str(tmp_path / "job.toml"), "--json"]) == 0


def test_verify_job_finds_a_missing_packed_weight_file_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    pte = tmp_path / "out" / "phone" / "m.pte"
    Path(record_url(str(pte))).unlink()
    capsys.readouterr()
    assert main(["verify", "--job", str(job), "--json"]) == 1
    reports = {r["url"]: r for r in json.loads(capsys.readouterr().out)["pairs"]}
    assert reports[str(pte)]["findings"] == [
        {
            "field": "xnnpack",
            "message": f"no XNNPACK packed-weight file beside it (no {record_url(str(pte))}); "
            f"the job's device declares xnnpack_cpu '{HERE}'",
        }
    ]
    assert reports[str(tmp_path / "out" / "plain" / "m.pte")]["status"] == "current"
    # and the plan runs the pair again for it
    assert main(["fleet", "plan", str(job), "--json"]) == 0
    planned = {p["device"]: p for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert planned["phone"]["action"] == "run"
    assert planned["phone"]["reason"] == (
        "current, but no XNNPACK packed-weight record at " + record_url(str(pte))
    )
    assert planned["plain"]["action"] == "skip"


def test_gc_removes_a_packed_weight_record_once_the_job_no_longer_asks_for_it(
    tmp_path: Path,
) -> None:
    from ptestore.fleet.orphans import collect_orphans

    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    pte = tmp_path / "out" / "phone" / "m.pte"
    record = Path(record_url(str(pte)))
    assert collect_orphans(tmp_path / "out", grace=0) == []  # the index references it
    job.write_text(job.read_text().replace(f'xnnpack_cpu = "{HERE}"\n', ""))
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0  # re-indexed
    (gone,) = collect_orphans(tmp_path / "out", grace=0)
    assert (gone.location, gone.kind, gone.action) == (str(record), "packed-record", "removed")
    assert not record.exists() and pte.is_file()


def test_what_a_current_packed_weight_pair_reuses_is_held(tmp_path: Path) -> None:
    """The plan of a current pair names its record among what it relies on; a worker
    that finds the pair current (a retry, another run's work) holds the artifact and
    the record it reuses against gc (``<object>.ptestore-hold``, fleet/holds.py)."""
    from ptestore.fleet import plan_job, run_pair

    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    pte = tmp_path / "out" / "phone" / "m.pte"
    record = record_url(str(pte))
    phone = next(p for p in plan_job(load_job(job)).pairs if p.pair.device.name == "phone")
    assert phone.action == "skip" and phone.relies == (str(pte), record)
    assert not list((tmp_path / "out").rglob("*.ptestore-hold"))  # indexed: no hold
    assert phone.task is not None
    assert run_pair(phone.task).status == "skipped"
    held = sorted(p.name for p in (tmp_path / "out").rglob("*.ptestore-hold"))
    assert held == ["m.pte.ptestore-hold", "m.xpwc.json.ptestore-hold"]


def test_a_re_pack_run_holds_nothing_its_own_live_entry_names(tmp_path: Path) -> None:
    """The record gone: the plan runs the pair (its .pte current), and its worker finds
    the .pte current and held it, though the pair's live entry names it (a PUT per pair,
    a hold left for gc). The run gives each task what its entry names."""
    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    pte = tmp_path / "out" / "phone" / "m.pte"
    Path(record_url(str(pte))).unlink()
    result = run_job(load_job(job), workers=1)
    assert result.exit_code == 0
    [phone] = [p for p in result.pairs if p.device == "phone"]
    assert phone.status == "done" and Path(record_url(str(pte))).is_file()
    assert not list((tmp_path / "out").rglob("*.ptestore-hold"))


def test_a_malformed_record_is_refused_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    assert main(["fleet", "run", str(job), "--workers", "1", "--quiet"]) == 0
    record = Path(record_url(str(tmp_path / "out" / "phone" / "m.pte")))
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "version": True}))  # True == 1 in Python
    report = ptestore.verify(str(record)[: -len(".xpwc.json")] + ".pte")
    assert (report.status, report.error) == (
        "invalid",
        f"{record}: record version = True: must be 1",
    )
    data["xnnpack"]["cpu"] = 3
    record.write_text(json.dumps(data))
    problem = f"{record}: record xnnpack.cpu = 3: must be a string"
    assert main(["verify", str(record)[: -len(".xpwc.json")] + ".pte", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == problem
    assert main(["fleet", "plan", str(job), "--json"]) == 0
    planned = {p["device"]: p for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert planned["phone"]["action"] == "run"
    assert planned["phone"]["reason"] == (
        f"current, but cannot read its XNNPACK packed-weight record: {problem}"
    )
    record.write_bytes(b"x" * ((1 << 20) + 1))  # not read whole: no record is that large
    report = ptestore.verify(str(record)[: -len(".xpwc.json")] + ".pte")
    assert (report.status, report.error) == (
        "invalid",
        f"{record}: record size = 1048577: must be <= 1048576 bytes",
    )


def test_the_watch_tells_when_no_worker_is_left_on_a_pairs_hosts() -> None:
    """A pair restricted to the hosts of the workers with its device's CPU is failed
    (not left waiting) once no worker has been on them for ``missed`` heartbeats."""
    import time

    import distributed
    from distributed.comm.addressing import get_address_host

    from ptestore.fleet.watch import WorkerWatch

    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        (worker,) = cluster.scheduler_info["workers"]
        here = get_address_host(worker)
        watch = WorkerWatch(client, cluster.scheduler_address, missed=4)
        watch.poll()
        assert not watch.hosts_gone([here]) and not watch.hosts_gone(["198.51.100.7"])
        deadline = time.monotonic() + 120
        while not watch.hosts_gone(["198.51.100.7"]):  # a host no worker is on
            assert time.monotonic() < deadline, "the watch never gave up on the host"
            time.sleep(watch.interval / 4)
            watch.poll()
        watch.poll()
        assert not watch.hosts_gone([here]) and not watch.hosts_gone(["198.51.100.7", here])


def test_a_failure_that_may_pass_is_not_recorded_and_an_old_one_not_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout (or a kill) of the runtime on the worker records nothing: the pair is
    done, its ``xnnpack`` says so, and the next run makes the file; a refusal of that
    kind recorded by an earlier version is not current, and a device does not follow it."""
    import ptestore.xnnpack
    from ptestore.errors import PackedWeightsRefused
    from ptestore.fleet.packing import packed_state
    from ptestore.xnnpack.native import executorch_build

    timed_out = "the runtime did not finish while making the packed-weight file within 3600.0 s"
    calls: list[float | None] = []

    def make_cache(pte: object, **kwargs: object) -> object:
        calls.append(kwargs["timeout"])  # type: ignore[arg-type]
        raise PackedWeightsRefused(str(pte), timed_out, transient=True)

    monkeypatch.setattr(ptestore.xnnpack, "make_cache", make_cache, raising=False)
    job = load_job(_job(tmp_path, PORTABLE.pte_path, HERE))
    result = run_job(job, workers=1)  # inline: the maker replaced here runs
    phone = next(p for p in result.pairs if p.device == "phone")
    assert phone.status == "done" and calls == [3600.0]
    assert phone.xnnpack is not None and phone.xnnpack.startswith(
        "XNNPACK packed-weight file not made (tried again next run): "
    )
    assert timed_out in phone.xnnpack
    pte = tmp_path / "out" / "phone" / "m.pte"
    assert not Path(record_url(str(pte))).exists()  # nothing recorded

    monkeypatch.undo()
    run_job(load_job(tmp_path / "job.toml"), workers=1)  # the real refusal: nothing to pack
    record_path = Path(record_url(str(pte)))
    record = json.loads(record_path.read_text())
    assert record["xnnpack"]["refused"] == NOTHING_TO_PACK
    record["xnnpack"]["refused"] = timed_out  # as an earlier version recorded it
    record_path.write_text(json.dumps(record))
    build = executorch_build().to_json()
    assert packed_state(str(pte), HERE, build, {}) == (
        False,
        f"its XNNPACK refusal may pass, made again: {timed_out}",
    )


def test_the_workers_scratch_directory_is_removed_and_a_killed_ones_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker makes the file in ``<tmp>/ptestore-xnnpack-<uid>/<random>/`` (the
    artifact fetched there, model-sized) and removes it when it ends; one a killed worker
    left (its lock free, or no lock file) is removed by the next run."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    base = tmp / f"ptestore-xnnpack-{os.geteuid()}"
    base.mkdir(mode=0o700)
    for name in ("killed", "older"):
        (base / name).mkdir()
        (base / name / "model.pte").write_bytes(b"x" * 1000)
    (base / "killed.lock").touch()  # its worker is gone: nobody holds it
    job = load_job(_job(tmp_path, PORTABLE.pte_path, HERE))
    result = run_job(job, workers=1)  # inline
    assert {p.device: p.status for p in result.pairs} == {"phone": "done", "plain": "done"}
    assert os.listdir(base) == [] and os.listdir(tmp) == [base.name]


def test_an_artifact_replaced_while_its_file_is_made_gets_no_record_of_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run replaces the artifact after the worker fetched it (here: right after
    the fetch returns): the record of what was made from the fetched bytes is not
    published for the artifact now there, which stays without one (made next run)."""
    import shutil

    import ptestore.fleet.fetch
    from ptestore.fleet.index import artifact_entry

    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    from ptestore.fleet.packing import packed_state
    from ptestore.xnnpack.native import executorch_build

    run_job(load_job(_job(tmp_path / "b", PORTABLE.pte_path, HERE, scale=3.0)), workers=1)
    other = tmp_path / "b" / "out" / "phone" / "m.pte"
    pte = tmp_path / "a" / "out" / "phone" / "m.pte"
    real_fetch = ptestore.fleet.fetch.fetch
    replaced: list[str] = []

    def fetch(source: str, target: str, **kwargs: object) -> object:
        got = real_fetch(source, target, **kwargs)  # type: ignore[arg-type]
        if source == str(pte) and not replaced:  # another run publishes its artifact
            shutil.copyfile(other, f"{pte}.other")
            os.replace(f"{pte}.other", pte)
            replaced.append(source)
        return got

    monkeypatch.setattr(ptestore.fleet.fetch, "fetch", fetch)
    result = run_job(load_job(_job(tmp_path / "a", PORTABLE.pte_path, HERE)), workers=1)
    phone = next(p for p in result.pairs if p.device == "phone")
    assert replaced == [str(pte)] and phone.status == "done"
    assert phone.xnnpack == (
        "XNNPACK packed-weight file not recorded (tried again next run): the artifact at "
        f"{pte} was replaced while it was made"
    )
    assert (
        artifact_entry(str(pte), {})[0]["trailer_sha256"]
        == (artifact_entry(str(other), {})[0]["trailer_sha256"])
    )
    assert packed_state(str(pte), HERE, executorch_build().to_json(), {}) == (
        False,
        f"no XNNPACK packed-weight record at {record_url(str(pte))}",
    )


def test_the_job_file_sets_the_runtimes_timeout_on_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``xnnpack_timeout`` (seconds) is what each run of the runtime's child gets on the
    worker (3600 without it); anything but a number > 0 is refused naming the key."""
    import ptestore.xnnpack
    from ptestore.errors import PackedWeightsRefused

    job = _job(tmp_path, PORTABLE.pte_path, HERE)
    job.write_text("xnnpack_timeout = 12.5\n" + job.read_text())
    assert load_job(job).xnnpack_timeout == 12.5
    calls: list[object] = []

    def make_cache(pte: object, **kwargs: object) -> object:
        calls.append(kwargs["timeout"])
        raise PackedWeightsRefused(str(pte), "the runtime did not finish", transient=True)

    monkeypatch.setattr(ptestore.xnnpack, "make_cache", make_cache, raising=False)
    run_job(load_job(job), workers=1)  # inline: the maker replaced here runs
    assert calls == [12.5]
    for bad in ("0", "-1", "inf", "nan", '"60"', "true"):
        job.write_text(f"xnnpack_timeout = {bad}\n" + job.read_text().split("\n", 1)[1])
        with pytest.raises(JobError) as err:
            load_job(job)
        value = {"inf": "inf", "nan": "nan", '"60"': "'60'", "true": "True"}.get(bad, bad)
        assert str(err.value) == (
            f"{job}:1: xnnpack_timeout: {value}: must be a number of seconds > 0 (each run "
            "of the XNNPACK runtime's child on a worker; default 3600)"
        )
