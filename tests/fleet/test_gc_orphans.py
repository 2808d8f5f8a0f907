"""Life cycle of a fleet job's artifacts (issue 28 part 5): ``fleet retire`` marks the
entries of pairs a job no longer names, ``select`` never returns them, and ``gc --job``
/ ``gc INDEX_PREFIX`` remove the shared objects and per-device files no live index entry
names, after the grace period, never one an index names, never a young one (a run may be
about to name it), never another tool's file; locally and on moto and SeaweedFS."""

from __future__ import annotations

import json
import os
import shutil
import time
import types
from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import get_fixture
from support.s3job import s3_options_toml

import ptestore
from ptestore.cli import main
from ptestore.fleet import load_job
from ptestore.fleet.index import load_index
from ptestore.fleet.orphans import collect_orphans, referenced
from ptestore.fleet.retire import retire_dropped
from ptestore.testing.moto import MotoS3
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
# d0 and d1 leave the weights alone (one shared .ptd, the source's), d2 scales them.
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
WEEK = 7 * 86400


def _sha(data: bytes) -> str:
    return tree(data).partition(":")[2]


def _job(path: Path, dest: str, devices: str, options: str = "") -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{options}'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return path


def _gc(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> dict[str, Any]:
    assert main(["gc", *argv, "--json"]) == code
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _actions(report: dict[str, Any], root: str) -> dict[str, str]:
    return {e["location"][len(root) :]: e["action"] for e in report["entries"]}


def _backdate(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _run(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    capsys.readouterr()


def test_retire_then_gc_locally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert EXT.ptd_path is not None
    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), THREE)
    _run(job, capsys)
    index = out / "ptestore-index.json"
    shared = out / "_shared" / "sha256-tree"
    source_ptd = shared / (_sha(EXT.ptd_path.read_bytes()) + ".ptd")
    scaled = next(p for p in shared.iterdir() if p != source_ptd)
    # Everything is referenced: nothing to remove whatever the grace.
    assert _gc(["--job", str(job), "--grace", "0s", "--dry-run"], capsys)["entries"] == []

    # d2 dropped from the job: a run keeps its entry; retire marks it.
    _job(job, str(out), TWO)
    _run(job, capsys)
    assert [e["device"] for e in load_index(index)["entries"]] == ["d0", "d1", "d2"]
    assert main(["fleet", "retire", str(job), "--dry-run"]) == 0
    assert capsys.readouterr().out == (
        "would retire mlp/d2: the job no longer names device 'd2'\n"
        f"would retire 1 entries of {index} (0 retired before)\n"
    )
    assert not any(e.get("retired") for e in load_index(index)["entries"])
    assert main(["fleet", "retire", str(job), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["retired"] == [
        {"model": "mlp", "device": "d2", "reason": "the job no longer names device 'd2'"}
    ]
    entries = {e["device"]: e for e in load_index(index)["entries"]}
    assert entries["d2"]["retired"]["reason"] == "the job no longer names device 'd2'"
    assert entries["d2"]["retired"]["job"]["path"] == str(job)
    assert "retired" not in entries["d0"]
    assert retire_dropped(load_job(job)).retired == []  # once is enough
    # select never considers the retired entry, even for its own device name (the
    # others do not fit d2: its portable source is the answer).
    choice = ptestore.select(str(index), "mlp", "d2")
    assert [c["made_for"] for c in choice.candidates] == ["d0", "d1"]
    assert choice.kind == "source" and choice.pte["url"] == str(EXT.pte_path)

    # The retired pair's files are orphans now, but young: kept by the grace.
    report = _gc(["--job", str(job)], capsys)
    assert report["grace"] == WEEK
    young = f"skipped: younger than the grace of {WEEK}s"
    assert _actions(report, str(out)) == {
        "/d2/mlp.pte": young,
        f"/_shared/sha256-tree/{scaled.name}": young,
    }
    kinds = {e["location"]: e["kind"] for e in report["entries"]}
    assert kinds == {str(out / "d2" / "mlp.pte"): "artifact", str(scaled): "shared-object"}

    # A week later they go; a fresh orphan (what a running job just stored, not yet in
    # its index), the referenced files and another tool's files stay.
    for p in (out / "d2" / "mlp.pte", scaled, out / "d0" / "mlp.pte", source_ptd):
        _backdate(p, WEEK + 60)
    fresh_bytes = EXT.ptd_path.read_bytes() + b"\0" * 64
    fresh = shared / (_sha(fresh_bytes) + ".ptd")
    fresh.write_bytes(fresh_bytes)
    foreign = out / "notes" / "old.pte"
    foreign.parent.mkdir()
    foreign.write_bytes(b"not an artifact")
    _backdate(foreign, WEEK + 60)
    link = out / "notes" / "link.pte"  # a symlink to a retired artifact: not ours
    link.symlink_to(out / "d2" / "mlp.pte")
    dry = _gc(["--job", str(job), "--dry-run"], capsys)
    assert _actions(dry, str(out)) == {
        "/d2/mlp.pte": "would remove",
        f"/_shared/sha256-tree/{scaled.name}": "would remove",
        f"/_shared/sha256-tree/{fresh.name}": young,
    }
    assert scaled.exists() and (out / "d2" / "mlp.pte").exists()
    report = _gc([str(out)], capsys)  # gc INDEX_PREFIX: the same, without the job
    assert _actions(report, str(out)) == {
        "/d2/mlp.pte": "removed",
        f"/_shared/sha256-tree/{scaled.name}": "removed",
        f"/_shared/sha256-tree/{fresh.name}": young,
    }
    assert report["removed"] == 2
    assert not scaled.exists() and not (out / "d2" / "mlp.pte").exists()
    assert fresh.exists() and foreign.exists() and source_ptd.exists() and link.is_symlink()
    assert main(["verify", "--job", str(job)]) == 0  # the live pairs are whole
    capsys.readouterr()


def test_gc_needs_an_index_and_a_readable_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), TWO)
    _run(job, capsys)
    index = out / "ptestore-index.json"
    # Without an index nothing governs the files: an old artifact there is left alone.
    moved = tmp_path / "away.json"
    index.rename(moved)
    _backdate(out / "d0" / "mlp.pte", WEEK + 60)
    assert collect_orphans(out, grace=0) == []
    moved.rename(index)
    # A prefix below the index is governed by it (read from above): nothing orphaned.
    assert collect_orphans(out / "d0", grace=0) == []
    # An index that cannot be read stops gc: nothing is removed, exit 1.
    good = index.read_bytes()
    index.write_bytes(b"{not json")
    report = _gc([str(out), "--grace", "0s"], capsys, code=1)
    [failed] = report["entries"]
    assert failed["kind"] == "index" and failed["location"] == str(index)
    assert failed["action"].startswith(f"failed: {index}: cannot read the index: ")
    index.write_bytes(good)
    assert (out / "d0" / "mlp.pte").exists()


def test_referenced_skips_retired_entries() -> None:
    src = {"url": "s3://b/src/m.pte"}
    entries = [
        {
            "pte": {"url": "s3://b/x/d0/m.pte"},
            "ptd": {"url": "s3://b/x/_shared/sha256-tree/a.ptd"},
            "source": src,
        },
        {"pte": {"url": "s3://b/x/d1/m.pte"}, "retired": {"reason": "dropped"}},
        {"pte": {"url": "s3://b/x/d2/m.pte"}, "source": {"url": "s3://b//src/m.pte"}, "ptd": None},
    ]
    assert referenced({"entries": entries}) == {
        ("s3", "b/x/d0/m.pte"),
        ("s3", "b/x/_shared/sha256-tree/a.ptd"),
        ("s3", "b/src/m.pte"),
        ("s3", "b/x/d2/m.pte"),
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grace=-1s"], "expected a duration >= 0, got '-1s'"),
        (["--grace", "soon"], "expected a duration such as 90s"),
    ],
)
def test_gc_grace_must_be_a_duration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["gc", str(tmp_path), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_collect_orphans_refuses_a_bad_grace(tmp_path: Path) -> None:
    with pytest.raises(ptestore.errors.ConfigurationError) as info:
        collect_orphans(tmp_path, grace=float("nan"))
    assert str(info.value) == "grace must be a finite number of seconds >= 0, got nan"


@pytest.mark.s3
def test_retire_then_gc_on_s3(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EXT.ptd_path is not None
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    opts = s3_server.storage_options
    options = s3_options_toml(opts)
    dest = f"s3://{bucket}/out"
    job = _job(tmp_path / "job.toml", dest, THREE, options)
    _run(job, capsys)

    def keys() -> set[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", [])
        return {o["Key"] for o in listed}

    before = keys()
    source_ptd = f"out/_shared/sha256-tree/{_sha(EXT.ptd_path.read_bytes())}.ptd"
    [scaled] = [k for k in before if k.endswith(".ptd") and k != source_ptd]
    assert _gc(["--job", str(job), "--grace", "0s"], capsys)["entries"] == []
    _job(job, dest, TWO, options)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    # Young orphans are kept by the grace; the dry run lists them and removes nothing.
    report = _gc(["--job", str(job), "--grace", "1h"], capsys)
    young = "skipped: younger than the grace of 3600s"
    root = f"s3://{bucket}/"
    assert _actions(report, root) == {"out/d2/mlp.pte": young, scaled: young}
    dry = _gc(["--job", str(job), "--grace", "0s", "--dry-run"], capsys)
    assert _actions(dry, root) == {"out/d2/mlp.pte": "would remove", scaled: "would remove"}
    assert keys() == before
    # gc INDEX_PREFIX with the job's storage options: the orphans go, nothing else.
    argv = [f"{dest}/", "--grace", "0s"]
    for k, v in (("endpoint_url", opts["endpoint_url"]), ("key", opts["key"])):
        argv += ["-o", f"{k}={v}"]
    argv += ["-o", f"secret={opts['secret']}", "-o", 'client_kwargs={"region_name": "us-east-1"}']
    report = _gc(argv, capsys)
    assert _actions(report, root) == {"out/d2/mlp.pte": "removed", scaled: "removed"}
    assert keys() == before - {"out/d2/mlp.pte", scaled}
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_a_concurrent_runs_fresh_object_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc while a real run stores a new shared .ptd (d3's scaled weights): whether the
    run has published its index yet or not, the object is kept (young, or named)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), TWO)
    _run(job, capsys)
    shared = out / "_shared" / "sha256-tree"
    before = set(shared.iterdir())
    _job(job, str(out), TWO + "[devices.d3]\nscale = 3.0\n")
    tests = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", "1", "-q"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # a generous ceiling, not a measured wait
        while not set(shared.iterdir()) - before and proc.poll() is None:
            assert time.monotonic() < deadline, "the run stored nothing"
            time.sleep(0.01)
        # gc INDEX_PREFIX: gc --job stops while d3, which the job names, has no entry.
        report = _gc([str(out)], capsys)
        # Seen before the run indexed them (what happens on this machine): kept, young.
        # The run's own staging files, when gc sees them, are kept too (younger than
        # --older-than, the staging files' own bound).
        young = f"skipped: younger than the grace of {WEEK}s"
        staging = f"skipped: younger than {report['older_than']:.0f}s"
        assert {e["action"] for e in report["entries"]} <= {young, staging}, report
    finally:
        _stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    [fresh] = set(shared.iterdir()) - before
    named = {e["ptd"]["url"] for e in load_index(out / "ptestore-index.json")["entries"]}
    assert str(fresh) in named
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_a_relative_destination_is_indexed_absolute_and_a_relative_url_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose destination is relative to the run's directory indexes absolute
    URLs, so gc from anywhere keeps what the index names; an index written before that
    (relative URLs) stops gc, naming the index and the URL, and nothing is removed."""
    work = tmp_path / "work"
    work.mkdir()
    job = _job(work / "job.toml", "out", '[devices.d0]\nsoc = "s0"\n')
    monkeypatch.chdir(work)
    assert load_job(job).destination == str(work / "out/{device}/{model}.pte")
    _run(job, capsys)
    monkeypatch.chdir(tmp_path)
    out, pte = work / "out", work / "out" / "d0" / "mlp.pte"
    index = out / "ptestore-index.json"
    [entry] = load_index(index)["entries"]
    assert entry["pte"]["url"] == str(pte)
    assert entry["ptd"]["url"].startswith(str(out / "_shared/sha256-tree") + "/")
    _backdate(pte, WEEK + 60)
    report = _gc([str(out), "--grace", "60s"], capsys)
    assert "d0/mlp.pte" not in _actions(report, str(out) + "/")
    assert pte.exists()
    # An index an earlier ptestore wrote from ``work``: its URLs relative to it (and
    # no version 3 shards beside it, which would say it was written over a migrated one).
    for shards in out.glob("ptestore-index.v3-*"):
        shutil.rmtree(shards)
    entry["pte"]["url"] = "out/d0/mlp.pte"
    index.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [entry]}))
    report = _gc([str(out), "--grace", "60s"], capsys, code=1)
    [failed] = report["entries"]
    assert (failed["kind"], failed["location"]) == ("index", str(index))
    assert failed["action"] == (
        f"failed: {index}: cannot read the index: {index}: entry mlp/d0 pte.url = "
        "'out/d0/mlp.pte': must be an absolute path or URL (a relative one names a file "
        "under the directory of the run that wrote it, unknown to gc)"
    )
    assert pte.exists()


def test_orphan_ages_on_s3_use_the_servers_clock(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LastModified`` is the server's time: with the client's clock two hours ahead,
    an object a running job just stored is still younger than a grace of one hour."""
    import types

    from ptestore.fleet import orphan_store
    from ptestore.fleet.index import publish_entries
    from ptestore.testing.fleet_index import synthetic_entry
    from ptestore.writers import open_writer

    bucket, opts = moto_s3.new_bucket(), moto_s3.storage_options
    root = f"s3://{bucket}/fleet"
    publish_entries(f"{root}/ptestore-index.json", [synthetic_entry("m", "d", root=root)], opts)
    fresh = f"{root}/_shared/sha256-tree/{'ab' * 32}.ptd"
    w = open_writer(fresh, **opts)
    w.write(b"x" * 100, 0)
    w.publish("overwrite")
    real = time.time
    monkeypatch.setattr(orphan_store, "time", types.SimpleNamespace(time=lambda: real() + 7200))
    [entry] = collect_orphans(root, grace=3600, **opts)
    assert (entry.location, entry.action) == (fresh, "skipped: younger than the grace of 3600s")
    assert entry.age < 600
    listed = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="fleet/_shared/")
    assert [o["Key"] for o in listed["Contents"]] == [fresh.split("/", 3)[3]]


def test_retire_leaves_the_entries_other_jobs_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two job files share one prefix: retiring A (which never named beta) leaves B's
    entry live, select still returns it and gc --job A keeps its files; --all-jobs
    judges by A's names alone."""
    out = tmp_path / "out"
    jobs = {}
    for name, model in (("A", "alpha"), ("B", "beta")):
        jobs[name] = tmp_path / f"{name}.toml"
        jobs[name].write_text(
            f'destination = "{out}/{{device}}/{{model}}.pte"\n'
            f'[[models]]\nname = "{model}"\nsource = "{EXT.pte_path}"\n[devices.phone]\n'
        )
        _run(jobs[name], capsys)
    index = out / "ptestore-index.json"
    assert main(["fleet", "retire", str(jobs["A"])]) == 0
    assert capsys.readouterr().out == (
        f"retired 0 entries of {index} (0 retired before, 1 of other jobs left)\n"
    )
    assert main(["fleet", "retire", str(jobs["A"]), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["retired"], done["other_jobs"]) == ([], 1)
    assert not any(e.get("retired") for e in load_index(index)["entries"])
    choice = ptestore.select(str(index), model="beta", device="phone")
    assert (choice.kind, choice.made_for) == ("artifact", "phone")
    assert not any(
        "beta" in e["location"]
        for e in _gc(["--job", str(jobs["A"]), "--grace", "0s", "--dry-run"], capsys)["entries"]
    )
    assert main(["fleet", "retire", str(jobs["A"]), "--all-jobs", "--dry-run"]) == 0
    assert capsys.readouterr().out == (
        "would retire beta/phone: the job no longer names model 'beta'\n"
        f"would retire 1 entries of {index} (0 retired before)\n"
    )
    # B drops beta: retiring B, named by another spelling of its path, retires it.
    jobs["B"].write_text(jobs["B"].read_text().replace('"beta"', '"gamma"'))
    assert main(["fleet", "retire", os.path.relpath(jobs["B"])]) == 0
    assert capsys.readouterr().out == (
        "retired beta/phone: the job no longer names model 'beta'\n"
        f"retired 1 entries of {index} (0 retired before, 1 of other jobs left)\n"
    )


def test_orphans_and_holds_of_implausible_time_are_of_unknown_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time before 2000-01-01 or more than a day after gc's now was stamped by a clock
    that was wrong (a host's whose clock read 1970, one 10 years ahead): the age is
    unknown, never old nor young. An orphan of unknown age is kept and reported with its
    time (was, 1970: removed at once, though it may be a running job's object not yet
    indexed; 10 years ahead: kept 10 years as young, silently); a hold of unknown time
    still holds, and is kept and reported likewise (was, 1970: the hold and its object
    removed). An old orphan without a hold goes, as before."""
    from ptestore.fleet import orphan_store
    from ptestore.fleet.holds import hold_url
    from ptestore.fleet.index import publish_entries
    from ptestore.testing.fleet_index import synthetic_entry

    now = float(int(time.time()))
    monkeypatch.setattr(orphan_store, "time", types.SimpleNamespace(time=lambda: now))
    root = tmp_path / "fleet"
    publish_entries(
        str(root / "ptestore-index.json"), [synthetic_entry("m", "d", root=str(root))], {}
    )
    shared = root / "_shared" / "sha256-tree"
    shared.mkdir(parents=True)
    ahead, month = now + 3653 * 86400, now - 30 * 86400

    def stored(name: str, when: float, held: float | None = None) -> Path:
        path = shared / f"{name * 32}.ptd"
        path.write_bytes(b"x" * 100)
        os.utime(path, (when, when))
        if held is not None:
            hold = Path(hold_url(str(path)))
            hold.write_text("{}")
            os.utime(hold, (held, held))
        return path

    def shown(when: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))

    epoch = stored("a1", 5.0)
    future = stored("b2", ahead)
    held_1970 = stored("c3", month, held=5.0)
    held_ahead = stored("d4", month, held=ahead)
    plain = stored("e5", month)
    before = f"before {shown(946684800)}"
    after = f"more than 86400s after now, {shown(now)}"

    def unknown(what: str, when: float, limit: str) -> str:
        return f"skipped: its {what} {shown(when)} is not plausible ({limit})"

    got = {Path(e.location).name: (e.age, e.action) for e in collect_orphans(root, grace=WEEK)}
    hold = Path(hold_url(str(held_1970))).name
    hold_ahead = Path(hold_url(str(held_ahead))).name
    assert got == {
        epoch.name: (0.0, unknown("modification time", 5.0, before) + ": its age is unknown"),
        future.name: (0.0, unknown("modification time", ahead, after) + ": its age is unknown"),
        held_1970.name: (
            30 * 86400,
            unknown("hold's time", 5.0, before) + ": a hold of unknown time still holds",
        ),
        held_ahead.name: (
            30 * 86400,
            unknown("hold's time", ahead, after) + ": a hold of unknown time still holds",
        ),
        hold: (0.0, unknown("modification time", 5.0, before) + ": its age is unknown"),
        hold_ahead: (0.0, unknown("modification time", ahead, after) + ": its age is unknown"),
        plain.name: (30 * 86400, "removed"),
    }
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        [epoch.name, future.name, held_1970.name, held_ahead.name, hold, hold_ahead]
    )


def test_a_last_modified_without_a_zone_is_utc_and_one_in_1970_unknown(
    s3_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing whose ``LastModified`` carries no zone (through
    ``tests/support/faulty_proxy.py``: botocore makes it a naive datetime) is read as
    UTC, as the ``HEAD`` is, whatever the local zone: under ``TZ=Asia/Tokyo`` an object
    stored just now is young with a grace of an hour and removed with a grace of 0 (was 9
    hours old, and ``skipped: changed since listed`` with either grace: the listing's
    stamp never the ``HEAD``'s, nothing ever collected). One the listing says was
    modified in 1970 has no age the server's clock can measure: kept, reported."""
    import re

    from support.faulty_proxy import faulty_proxy

    from ptestore.fleet.index import publish_entries
    from ptestore.testing.fleet_index import synthetic_entry
    from ptestore.writers import open_writer

    bucket, opts = s3_server.new_bucket(), s3_server.storage_options
    root = f"s3://{bucket}/fleet"
    publish_entries(f"{root}/ptestore-index.json", [synthetic_entry("m", "d", root=root)], opts)
    fresh, epoch = (f"{root}/_shared/sha256-tree/{c * 64}.ptd" for c in "ab")
    for url in (fresh, epoch):
        w = open_writer(url, **opts)
        w.write(b"x" * 100, 0)
        w.publish("overwrite")

    def answer(
        method: str, path: str, request: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method != "GET" or "list-type=2" not in path.partition("?")[2]:
            return headers, body

        def zoneless(listed: re.Match[str]) -> str:
            block = listed[0]
            if f"<Key>{epoch.split('/', 3)[3]}</Key>" in block:
                when = "1970-01-01T00:00:05.000"
            else:  # its own time, without the zone
                m = re.search(r"<LastModified>([^<.Z]*)(\.\d+)?Z</LastModified>", block)
                assert m is not None, block
                when = m[1] + ".000"
            return re.sub(
                r"<LastModified>[^<]*</LastModified>", f"<LastModified>{when}</LastModified>", block
            )

        text = re.sub(r"<Contents>.*?</Contents>", zoneless, body.decode(), flags=re.S)
        assert "Z</LastModified>" not in text, text
        return headers, text.encode()

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
            proxy.answer = answer
            through = {**opts, "endpoint_url": endpoint}
            young = {
                e.location: (e.age, e.action) for e in collect_orphans(root, grace=3600, **through)
            }
            gone = {e.location: e.action for e in collect_orphans(root, grace=0, **through)}
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    unknown = (
        "skipped: its modification time 1970-01-01T00:00:05Z is not plausible (before "
        "2000-01-01T00:00:00Z): its age is unknown"
    )
    assert young[fresh][1] == "skipped: younger than the grace of 3600s", young
    assert young[fresh][0] < 600
    assert young[epoch] == (0.0, unknown)
    assert gone == {fresh: "removed", epoch: unknown}
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="fleet/_shared/")
    assert [o["Key"] for o in listed["Contents"]] == [epoch.split("/", 3)[3]]
