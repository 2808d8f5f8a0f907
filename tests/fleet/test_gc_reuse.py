"""gc against a run that *reuses* an old object no index names (a retired pair the job
names again, found current, skipped; a shared .ptd found stored): the run holds each
such object before it relies on it (``<object>.ptestore-hold``, :mod:`ptestore.fleet.holds`),
and gc keeps an object held within the grace, whatever the object's own age; locally
with a real ``fleet run`` in another process, and on moto and SeaweedFS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.locks import wait_until
from support.s3job import s3_options_toml

from ptestore.cli import main
from ptestore.fleet.index import find_entry, load_index
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
# Scaler's weights, and device options that synchronize a pair with the test by files.
SPEC = "support.hanging_backend:Hanging=1.0"
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
WEEK = 7 * 86400
MONTH = 30 * 86400
HOLD = ".ptestore-hold"


def _start_run(job: Path) -> subprocess.Popen[str]:
    """``fleet run JOB`` in a process of its own (``tests/`` on its path, for the job's
    backends), its JSON report on stdout."""
    tests = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", "1", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _job(path: Path, dest: str, devices: str, options: str = "") -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{options}'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return path


def _gc(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["gc", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _actions(report: dict[str, Any], root: Path) -> dict[str, str]:
    return {e["location"][len(str(root)) :]: e["action"] for e in report["entries"]}


def _backdate_tree(root: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))


def _retired_d2(tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """d0, d1, d2 made, then d2 dropped from the job and retired: its .pte and its
    scaled shared .ptd are orphans; every file a month old."""
    job = _job(tmp_path / "job.toml", str(out), THREE)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _job(job, str(out), TWO)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    _backdate_tree(out, MONTH)
    return job


def test_gc_keeps_what_a_running_job_reuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's repro: d2 named again (current: skipped, nothing written), d3 new
    and held by the test until gc is done. gc with a grace of 7 days used to remove
    d2/mlp.pte and its shared .ptd (a month old, unreferenced), and the run then failed
    to publish its index (``.../d2/mlp.pte: no such file``), rc 1, d3 not indexed."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    shared = out / "_shared" / "sha256-tree"
    d2 = out / "d2" / "mlp.pte"
    scaled = {p.name for p in shared.iterdir()} - {
        Path(e["ptd"]["url"]).name
        for e in load_index(out / "ptestore-index.json")["entries"]
        if e["device"] != "d2"
    }
    assert len(scaled) == 1
    started, gate = tmp_path / "started", tmp_path / "gate"
    _job(job, str(out), THREE + f'[devices.d3]\nstarted = "{started}"\nafter = "{gate}"\n')
    proc = _start_run(job)
    try:
        wait_until(lambda: started.exists() or proc.poll() is not None, "d3 to start")
        assert proc.poll() is None, proc.communicate()
        # d3, named by the job and not made yet, has no entry: not a lost one (gc --job
        # stops only for a pair made without an entry), so gc --job collects as gc of
        # the prefix does, and keeps what the run holds.
        assert main(["gc", "--job", str(job), "--grace", "7d", "--json"]) == 0
        entries = json.loads(capsys.readouterr().out)["entries"]
        assert not any(e["kind"] == "index" or e["action"] == "removed" for e in entries)
        report = _gc([str(out), "--grace", "7d"], capsys)
    finally:
        gate.touch()
        stdout, stderr = proc.communicate(timeout=300)
    acts = _actions(report, out)
    held = f"skipped: a run held it within the grace of {WEEK}s"
    assert acts["/d2/mlp.pte"] == held, acts
    [name] = scaled
    assert acts[f"/_shared/sha256-tree/{name}"] == held
    assert not any(a == "removed" for a in acts.values()), acts
    assert d2.exists() and (shared / name).exists()
    assert proc.returncode == 0, stderr
    result = json.loads(stdout)
    assert (result["done"], result["skipped"], result["index_error"]) == (1, 3, None)
    index = str(out / "ptestore-index.json")
    for device in ("d2", "d3"):
        entry = find_entry(index, "mlp", device)
        assert entry is not None and not entry.get("retired")
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()
    # The holds stay beside their objects until they are older than the grace; then gc
    # removes them (kind "hold") and nothing else: the objects are indexed now.
    holds = sorted(str(p)[len(str(out)) :] for p in out.rglob(f"*{HOLD}"))
    assert holds == [f"/_shared/sha256-tree/{name}{HOLD}", f"/d2/mlp.pte{HOLD}"]
    report = _gc(["--job", str(job)], capsys)
    young = f"skipped: younger than the grace of {WEEK}s"
    assert _actions(report, out) == dict.fromkeys(holds, young)
    assert {e["kind"] for e in report["entries"]} == {"hold"}
    _backdate_tree(out, WEEK + 60)
    report = _gc(["--job", str(job)], capsys)
    assert _actions(report, out) == dict.fromkeys(holds, "removed")
    assert not list(out.rglob(f"*{HOLD}"))
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_gc_keeps_a_shared_ptd_a_running_pair_finds_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """d2 named again with another option: its .pte is stale and made again, and its
    scaled .ptd (a month old, no live entry names it) is found stored, not written: the
    pair holds it, and gc, run while d3 is held back, keeps it."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    index = out / "ptestore-index.json"
    [retired] = [e for e in load_index(index)["entries"] if e["device"] == "d2"]
    scaled = Path(retired["ptd"]["url"])
    started, gate = tmp_path / "started", tmp_path / "gate"
    again = THREE.replace("scale = 2.0", 'scale = 2.0\nsoc = "s2"')
    _job(job, str(out), again + f'[devices.d3]\nstarted = "{started}"\nafter = "{gate}"\n')
    proc = _start_run(job)
    try:
        wait_until(lambda: started.exists() or proc.poll() is not None, "d3 to start")
        assert proc.poll() is None, proc.communicate()
        report = _gc([str(out), "--grace", "7d"], capsys)
    finally:
        gate.touch()
        stdout, stderr = proc.communicate(timeout=300)
    acts = _actions(report, out)
    assert acts[str(scaled)[len(str(out)) :]] == (
        f"skipped: a run held it within the grace of {WEEK}s"
    )
    assert acts["/d2/mlp.pte"] == f"skipped: younger than the grace of {WEEK}s"  # new
    assert scaled.exists() and Path(str(scaled) + HOLD).exists()
    assert proc.returncode == 0, stderr
    result = json.loads(stdout)
    assert (result["done"], result["skipped"], result["index_error"]) == (2, 2, None)
    entry = find_entry(str(index), "mlp", "d2")
    assert entry is not None and not entry.get("retired") and entry["ptd"]["url"] == str(scaled)
    # Only the old, unnamed object was held: nothing else has a hold.
    assert [p.name for p in out.rglob(f"*{HOLD}")] == [scaled.name + HOLD]
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def _planned(job: Path, device: str) -> Any:
    from ptestore.fleet import load_job, plan_job

    plan = plan_job(load_job(job))
    [mine] = [p for p in plan.pairs if p.pair.device.name == device]
    return plan, mine


def test_a_reused_object_gone_before_its_hold_is_made_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc removes d2/mlp.pte between the plan (current: skip) and the run's holds: the
    run sees it gone once its hold is written and runs the pair instead of skipping
    it (it used to publish no index: ``no such file``)."""
    from ptestore.fleet import run_plan
    from ptestore.fleet.reuse import hold_reused

    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, str(out), THREE)
    plan, d2 = _planned(job, "d2")
    assert d2.action == "skip"
    (out / "d2" / "mlp.pte").unlink()
    assert hold_reused(plan) == 2  # d2/mlp.pte and its scaled shared .ptd
    assert (d2.action, d2.reason) == (
        "run",
        f"current when planned, but {out / 'd2' / 'mlp.pte'} is gone since: made again",
    )
    assert hold_reused(plan) == 0  # nothing skipped is left unnamed: d0 and d1 are indexed
    result = run_plan(plan, workers=1)
    assert [(p.device, p.status) for p in result.pairs] == [
        ("d0", "skipped"), ("d1", "skipped"), ("d2", "done"),
    ]  # fmt: skip
    assert result.exit_code == 0, result.index_error
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_a_hold_that_cannot_be_written_fails_the_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reused object whose hold cannot be written (a directory at its name) is not
    relied on unprotected: its pair fails, naming the hold; the others are indexed."""
    from ptestore.fleet import run_plan

    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, str(out), THREE)
    blocked = out / "d2" / f"mlp.pte{HOLD}"
    blocked.mkdir()
    plan, _ = _planned(job, "d2")
    result = run_plan(plan, workers=1)
    [failed] = [p for p in result.pairs if p.status == "failed"]
    assert failed.device == "d2"
    assert failed.error is not None
    assert failed.error.startswith(
        "current, but what it reuses cannot be held against ptestore gc (a hold beside "
        f"each object): {blocked}: "
    ), failed.error
    assert result.exit_code == 1
    entry = find_entry(str(out / "ptestore-index.json"), "mlp", "d2")
    assert entry is not None and entry.get("retired")  # not indexed again
    assert find_entry(str(out / "ptestore-index.json"), "mlp", "d0") is not None


def test_a_hold_that_cannot_be_written_fails_only_the_pairs_relying_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """d1 and d2 retired, named again: each reuses its own .pte. d1's hold cannot be
    written: d1 fails with its own hold's error. d2 used to fail too, with d1's error
    (the first hold that failed failed every pair that needed one)."""
    from ptestore.fleet import run_plan

    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), THREE)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _job(job, str(out), '[devices.d0]\nsoc = "s0"\n')
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    _backdate_tree(out, MONTH)
    _job(job, str(out), THREE)
    blocked = out / "d1" / f"mlp.pte{HOLD}"
    blocked.mkdir()
    plan, _ = _planned(job, "d1")
    result = run_plan(plan, workers=1)
    status = {p.device: (p.status, p.error) for p in result.pairs}
    assert status["d2"] == ("skipped", None)
    assert status["d1"][0] == "failed"
    assert str(status["d1"][1]).startswith(
        "current, but what it reuses cannot be held against ptestore gc (a hold beside "
        f"each object): {blocked}: "
    ), status
    index = str(out / "ptestore-index.json")
    entry = find_entry(index, "mlp", "d2")
    assert entry is not None and not entry.get("retired")  # indexed again
    assert Path(f"{out}/d2/mlp.pte{HOLD}").is_file()


def test_only_objects_gc_may_remove_are_held(tmp_path: Path) -> None:
    """gc removes .pte, .ptd and packed-weight files and records, and honours holds of
    those alone: a hold beside anything else (a job whose destination is
    ``{device}/{model}.bin``) was written and never removed."""
    from ptestore.fleet.holds import hold

    names = ["mlp.bin", "mlp.pte", "mlp.ptd", "mlp.xnnpack-ab.xpwc", "mlp.xpwc.json", ".x.pte"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert hold([str(tmp_path / n) for n in names], {}) == []
    held = sorted(p.name for p in tmp_path.glob(f"*{HOLD}"))
    assert held == [f"{n}{HOLD}" for n in sorted(names[1:5])]


def test_a_worker_that_finds_its_pair_current_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pair the plan ran that a worker finds current (a retry after its first attempt
    published, another run's work) holds what it reuses; when the object is removed
    just before its hold is written, the pair is made again instead of skipped."""
    from ptestore.fleet import holds as fleet_holds
    from ptestore.fleet import run_pair

    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, str(out), THREE)
    _plan, d2 = _planned(job, "d2")
    pte = out / "d2" / "mlp.pte"
    result = run_pair(d2.task)
    assert result.status == "skipped"
    assert Path(str(pte) + HOLD).exists()
    scaled = Path(str(d2.relies[1]))
    assert Path(str(scaled) + HOLD).exists()
    real_write = fleet_holds._write

    def removed_first(url: str, options: Any) -> None:  # gc removes it, then the hold
        if url == str(pte):
            pte.unlink()
        real_write(url, options)

    monkeypatch.setattr(fleet_holds, "_write", removed_first)
    result = run_pair(d2.task)
    assert (result.status, result.error) == ("done", None)
    assert pte.exists()


def _held_after_listing(
    job: Path, dest: str, opts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, str], Any]:
    """gc (grace 0: every orphan due) lists the retired d2's files, then a run of the
    job naming d2 again makes its plan and holds what it reuses (the real steps), then
    gc goes on: ``(gc's actions by location after dest, the plan)``."""
    from ptestore.fleet import orphans
    from ptestore.fleet.reuse import hold_reused

    real_now = orphans.OrphanStore.now
    plans: list[Any] = []

    def run_starts(self: Any, root: str) -> float:  # gc has listed the files
        plan, _ = _planned(job, "d2")
        assert hold_reused(plan) == 2
        plans.append(plan)
        return real_now(self, root)

    with monkeypatch.context() as m:
        m.setattr(orphans.OrphanStore, "now", run_starts)
        entries = orphans.collect_orphans(dest, grace=0, **opts)
    return {e.location[len(dest) :]: e.action for e in entries}, plans[0]


def test_an_object_held_after_gc_listed_it_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc looks at an object's hold again just before it removes it: one a run held
    after the listing is kept (``skipped: a run held it since listed``), untouched."""
    from ptestore.fleet import run_plan

    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    pte = out / "d2" / "mlp.pte"
    before = pte.stat()
    _job(job, str(out), THREE)
    acts, plan = _held_after_listing(job, str(out), {}, monkeypatch)
    since = "skipped: a run held it since listed"
    assert set(acts.values()) == {since} and "/d2/mlp.pte" in acts and len(acts) == 2
    after = pte.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_ino, before.st_mtime_ns, before.st_ctime_ns,
    )  # fmt: skip
    assert run_plan(plan, workers=1).exit_code == 0
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


@pytest.mark.s3
def test_on_s3_an_object_held_after_gc_listed_it_is_kept(
    s3_server: S3TestServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On moto and SeaweedFS: the run's holds are objects beside what it reuses (one
    PutObject each), found by gc's look before the delete; the held objects keep their
    bytes, ETag, ``LastModified`` and stored checksum."""
    from ptestore.fleet import run_plan

    bucket, client = s3_server.new_bucket(), s3_server.client()
    opts = s3_server.storage_options
    dest = f"s3://{bucket}/out"
    job = _job(tmp_path / "job.toml", dest, THREE, s3_options_toml(opts))
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _job(job, dest, TWO, s3_options_toml(opts))
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()

    def look(key: str) -> tuple[Any, ...]:
        h = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        sums = tuple(sorted((k, v) for k, v in h.items() if k.startswith("Checksum")))
        return h["ETag"], h["LastModified"], h["ContentLength"], sums

    before = look("out/d2/mlp.pte")
    _job(job, dest, THREE, s3_options_toml(opts))
    acts, plan = _held_after_listing(job, dest, opts, monkeypatch)
    since = "skipped: a run held it since listed"
    assert acts.pop("/d2/mlp.pte") == since
    [(shared, action)] = acts.items()
    assert action == since and shared.startswith("/_shared/sha256-tree/")
    assert look("out/d2/mlp.pte") == before
    body = client.get_object(Bucket=bucket, Key=f"out/d2/mlp.pte{HOLD}")["Body"].read()
    assert json.loads(body)["object"] == f"{dest}/d2/mlp.pte"
    assert run_plan(plan, workers=1).exit_code == 0
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_many_unnamed_shared_objects_are_not_carried_by_every_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every pair task carried the whole set of unnamed shared objects, up to 4096 of
    them (about 450 KB pickled per pair, every task submitted at once on Dask): past
    MAX_HOLD_SHARED the tasks get None (every find holds what it finds)."""
    from ptestore.fleet.reuse import MAX_HOLD_SHARED, hold_reused

    assert MAX_HOLD_SHARED == 64
    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), TWO)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    capsys.readouterr()
    shared = out / "_shared" / "sha256-tree"
    _job(job, str(out), TWO + "[devices.d2]\nscale = 2.0\n")
    for i in range(MAX_HOLD_SHARED):
        (shared / f"{i:064x}.ptd").write_bytes(b"orphan")
    plan, d2 = _planned(job, "d2")
    hold_reused(plan)
    assert d2.task.hold_shared is not None and len(d2.task.hold_shared) == MAX_HOLD_SHARED
    (shared / f"{MAX_HOLD_SHARED:064x}.ptd").write_bytes(b"orphan")
    plan, d2 = _planned(job, "d2")
    hold_reused(plan)
    assert d2.task.hold_shared is None


def test_an_unreadable_index_names_nothing_and_an_unlistable_store_holds_every_find(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """What the run cannot know is taken at its worst: an index it cannot read names
    nothing (every skipped pair's objects are held), shared objects it cannot list are
    held by any pair that finds one (its task's ``hold_shared`` stays None)."""
    from ptestore.fleet.reuse import hold_reused

    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), TWO)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    capsys.readouterr()
    index = out / "ptestore-index.json"
    good = index.read_bytes()
    index.write_bytes(b"{not json")
    (out / "_shared" / "sha256").write_bytes(b"not a directory")
    _job(job, str(out), TWO + "[devices.d2]\nscale = 2.0\n")
    plan, d2 = _planned(job, "d2")
    assert d2.action == "run" and d2.task.hold_shared is None
    with caplog.at_level("WARNING", logger="ptestore.fleet.reuse"):
        assert hold_reused(plan) == 3  # d0's .pte, d1's .pte, their one shared .ptd
    warned = [r.getMessage() for r in caplog.records]
    assert warned[0].startswith(f"{job}: cannot read the index, taken as naming nothing: ")
    assert warned[1].startswith(f"{job}: cannot list the shared objects, each one found is held: ")
    assert d2.task.hold_shared is None
    holds = sorted(str(p.relative_to(out)) for p in out.rglob(f"*{HOLD}"))
    assert holds[0].startswith("_shared/sha256-tree/") and holds[0].endswith(f".ptd{HOLD}")
    assert holds[1:] == [f"d0/mlp.pte{HOLD}", f"d1/mlp.pte{HOLD}"]
    index.write_bytes(good)
