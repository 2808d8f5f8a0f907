"""Fleet runs on local files (inline runner): exit codes, per-pair failure isolation,
the summary, create-or-verify when another worker publishes first, version skew."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendInterface, register_backend, unregister_backend
from ptestore.cli import main
from ptestore.fleet import load_job, plan_job, run_job, run_pair

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _job(tmp: Path, *, backends: str = f'"{SPEC}"', extra_model: str = "") -> Path:
    assert MLP.pte_path is not None and EXT.pte_path is not None
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = [{backends}]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        f'[[models]]\nname = "ext"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        f"{extra_model}"
        '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\n'
    )
    return job


def test_run_skip_summary_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path)
    assert main(["fleet", "plan", str(job)]) == 0
    out = capsys.readouterr().out
    assert "4 pairs: 4 to run, 0 to skip" in out and "no artifact at" in out
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert summary[:3] == [
        "done                      4",
        "skipped                   0",
        "failed                    0",
    ]
    assert summary[3].startswith("bytes through the client  ") and summary[4].startswith("time")
    # Each distinct .ptd is stored once by its content: device b's is the source's.
    assert EXT.ptd_path is not None
    shared = tmp_path / "out" / "_shared" / "sha256-tree"
    source_ptd = shared / (tree(EXT.ptd_path.read_bytes()).partition(":")[2] + ".ptd")
    assert source_ptd.read_bytes() == EXT.ptd_path.read_bytes()
    assert len(list(shared.iterdir())) == 2 and not (tmp_path / "out" / "a" / "ext.ptd").exists()
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["done"], shown["skipped"], shown["failed"]) == (0, 4, 0)
    assert main(["fleet", "run", str(job), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    # The .ptd the .pte names is part of the pair: lose it and the pair runs again.
    source_ptd.unlink()
    plan = plan_job(load_job(job))
    assert [(p.pair.model.name, p.pair.device.name, p.action) for p in plan.pairs] == [
        ("mlp", "a", "skip"),
        ("mlp", "b", "skip"),
        ("ext", "a", "skip"),
        ("ext", "b", "run"),
    ]
    assert plan.pairs[3].reason == (
        f"no .ptd at {source_ptd} (the one {tmp_path}/out/b/ext.pte was made with)"
    )


def test_a_missing_source_is_one_preflight_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, extra_model=f'[[models]]\nname = "gone"\nsource = "{tmp_path}/no.pte"\n')
    # Preflight: one message, exit 2, before any pair (plan and run alike).
    for argv in (["plan"], ["run", "--workers", "1"]):
        assert main(["fleet", argv[0], str(job), *argv[1:]]) == 2
        captured = capsys.readouterr()
        assert captured.err.splitlines()[0] == (
            f"ptestore fleet: error: {job}: model 'gone': {tmp_path}/no.pte: no such file"
        )
        assert captured.err.count("no such file") == 1
        assert captured.out == ""
    assert not (tmp_path / "out").exists()
    # The other models run when the operator leaves that one out.
    assert main(["fleet", "run", str(job), "--workers", "1", "--json", "--models", "mlp,ext"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["done"], shown["skipped"], shown["failed"]) == (4, 0, 0)
    assert main(["fleet", "plan", str(job), "--models", "mlp", "--devices", "a"]) == 0
    assert "1 pairs: 0 to run, 1 to skip" in capsys.readouterr().out
    assert main(["fleet", "plan", str(job), "--devices", "a,zz"]) == 2
    assert "--devices names no device 'zz' (devices: a, b)" in capsys.readouterr().err


class Racer(BackendInterface):
    """While "compiling", another worker publishes this pair's destination (with the
    backend SPEC ``Racer.spec``)."""

    name = "XnnpackBackend"
    version = "1"
    target: str = ""
    spec: str = "racing"
    device: Any = None

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        target, Racer.target = Racer.target, ""  # the racer itself does not race
        if target:
            assert MLP.pte_path is not None
            ptestore.specialize(
                MLP.pte_path,
                target,
                backends=[Racer.spec],
                device=Racer.device,
                provenance=True,
                allow_unchanged=True,
            )


class Quiet(Racer):
    pass


@pytest.fixture
def racer() -> Any:
    register_backend(Quiet, name="other")
    register_backend(Racer, name="racing")
    yield
    unregister_backend("other")
    unregister_backend("racing")


@pytest.mark.parametrize("spec", ["racing", "other"])
def test_create_or_verify_when_another_worker_publishes_first(
    tmp_path: Path, racer: Any, spec: str
) -> None:
    job = load_job(_job(tmp_path, backends='"racing"'))
    planned = plan_job(job).pairs[0]
    assert planned.task is not None and planned.action == "run"
    Racer.target, Racer.spec, Racer.device = planned.pair.destination, spec, planned.pair.device
    result = run_pair(planned.task)
    assert Racer.target == ""  # the race happened
    if spec == "racing":  # the other worker left exactly what this pair wants
        assert (result.status, result.error) == ("done", None)
        assert result.reason == "published by another worker"
    else:  # it left an artifact made with another backend: reported, never accepted
        assert result.status == "failed" and result.error is not None
        assert result.error.startswith(
            f"{planned.pair.destination}: after a race, the destination is not current "
            "(stale: backends are [other 1], expected [racing 1])"
        )


def test_a_published_pair_is_not_read_again_but_a_raced_one_is(
    tmp_path: Path, racer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After publishing, the destination's record is compared with the digest the run
    published (its bytes are not read and hashed a second time: 2.8 s of a 1 GiB local
    pair); an artifact another worker left is still checked byte for byte."""
    from ptestore.fleet import binding

    checked: list[str] = []
    real = binding.bytes_mismatch

    def spy(loader: Any, trailer: Any, prov: Any) -> str | None:
        checked.append(loader.name)
        return real(loader, trailer, prov)

    monkeypatch.setattr(binding, "bytes_mismatch", spy)
    job = load_job(_job(tmp_path))
    mine = plan_job(job).pairs[0]
    assert mine.task is not None
    result = run_pair(mine.task)
    assert (result.status, result.reason, checked) == ("done", "published", [])
    # The bytes the run did not read again are the ones its record names.
    assert run_pair(mine.task).status == "skipped" and checked == [mine.pair.destination]

    checked.clear()
    (tmp_path / "raced").mkdir()
    job = load_job(_job(tmp_path / "raced", backends='"racing"'))
    planned = plan_job(job).pairs[0]
    assert planned.task is not None
    Racer.target, Racer.spec, Racer.device = planned.pair.destination, "racing", planned.pair.device
    result = run_pair(planned.task)
    assert Racer.target == "" and result.reason == "published by another worker"
    assert checked == [planned.pair.destination]


def test_worker_version_skew_fails_the_pair(tmp_path: Path) -> None:
    job = load_job(_job(tmp_path))
    task = plan_job(job).pairs[0].task
    assert task is not None
    skewed = dataclasses.replace(task, key=dataclasses.replace(task.key, backends=((SPEC, "0.9"),)))
    result = run_pair(skewed)
    assert result.status == "failed"
    assert result.error == (
        f"backend versions on this worker [('{SPEC}', '1.0')] differ from the planner's "
        f"[('{SPEC}', '0.9')]; install the same versions everywhere"
    )
    assert not Path(task.destination).exists()


def test_unreachable_scheduler_is_a_configuration_error(tmp_path: Path) -> None:
    from ptestore.errors import ConfigurationError

    job = load_job(_job(tmp_path))
    with pytest.raises(ConfigurationError) as info:
        run_job(job, scheduler="tcp://127.0.0.1:1", connect_timeout=1)
    assert str(info.value).startswith(
        "--scheduler tcp://127.0.0.1:1: cannot reach the Dask scheduler within 1 s: "
    )
    with pytest.raises(ConfigurationError, match="--workers must be >= 1, got 0"):
        run_job(job, workers=0)
    with pytest.raises(ConfigurationError, match=r"^missed_heartbeats must be >= 1, got 0$"):
        run_job(job, scheduler="tcp://127.0.0.1:1", missed_heartbeats=0)
    with pytest.raises(ConfigurationError, match=r"^missed_heartbeats must be an int, got 2.5$"):
        run_job(job, missed_heartbeats=2.5)  # type: ignore[arg-type]


def test_a_run_inside_the_callers_own_dask_client_waits_through_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``distributed.wait`` waits through the *current* client. Inside a caller's
    ``with Client(...)`` that was the caller's: its event loop came to own the futures'
    events, and a result lost with a killed worker was then awaited on the run's loop,
    failing the pair with "Event ... is bound to a different event loop" (seen in CI)."""
    import distributed

    job = load_job(_job(tmp_path))
    seen: list[Any] = []
    real_wait = distributed.wait

    def spying_wait(*args: Any, **kwargs: Any) -> Any:
        seen.append(distributed.default_client())
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(distributed, "wait", spying_wait)
    with (
        distributed.LocalCluster(
            n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as outer,
    ):
        result = run_job(job, scheduler=cluster.scheduler_address)
    assert [p.status for p in result.pairs] == ["done"] * 4, [p.error for p in result.pairs]
    assert seen and outer not in seen


def test_a_dead_pool_worker_fails_only_its_own_pair(tmp_path: Path) -> None:
    """A worker process that dies breaks the whole pool: the pairs it did not hold run
    on a new pool, each pair that was running when it died runs again alone, and only
    the one whose worker dies again is failed; the others are published and indexed."""
    assert MLP.pte_path is not None
    started = tmp_path / "blocked-started"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        'backends = ["support.dying_backend:Dying"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        f'[devices.dies]\ndie_when = "{started}"\n'
        f'[devices.blocked]\nfirst_blocks = "{started}"\n'
        "[devices.c]\n[devices.d]\n"
    )
    result = run_job(load_job(job), workers=2)
    status = {p.device: (p.status, p.error) for p in result.pairs}
    assert status["dies"][0] == "failed"
    assert str(status["dies"][1]).startswith(
        "its worker process died while it ran, and again when it ran alone: BrokenProcessPool: "
    )
    assert {d: s for d, (s, _e) in status.items() if d != "dies"} == {
        "blocked": "done",
        "c": "done",
        "d": "done",
    }
    assert result.index is not None and result.index_error is None
    entries = ptestore.fleet.index.load_index(result.index)["entries"]
    assert sorted(e["device"] for e in entries) == ["blocked", "c", "d"]
    assert not (tmp_path / "out" / "dies" / "mlp.pte").exists()


def test_plan_says_fail_for_a_destination_a_run_would_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory at a pair's destination: the run fails the pair, so the plan says
    ``fail`` and exits 1 (it said ``run`` and exited 0); a missing destination is still
    ``run``."""
    assert MLP.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n[devices.a]\n[devices.b]\n'
    )
    dst = tmp_path / "out" / "a" / "m.pte"
    dst.mkdir(parents=True)
    plan = plan_job(load_job(job))
    (a, b) = plan.pairs
    assert (b.action, a.action) == ("run", "fail")
    assert a.reason.startswith(f"cannot read the destination: {dst}: is a directory")
    assert main(["fleet", "plan", str(job)]) == 1
    assert "2 pairs: 1 to run, 0 to skip, 1 failing" in capsys.readouterr().out
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert [(p["device"], p["status"]) for p in shown["pairs"]] == [("a", "failed"), ("b", "done")]
    assert shown["pairs"][0]["error"] == a.reason


def test_a_failed_pair_leaves_no_folder_behind(tmp_path: Path) -> None:
    """The directories a failed pair's writers made for it are removed (while empty):
    "anything that fails before publish leaves no trace"."""
    assert MLP.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/deep/{{model}}.pte"\n'
        'backends = ["support.dying_backend:Dying"]\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n'
        "[devices.bad]\nfail = true\n[devices.good]\n"
    )
    result = run_job(load_job(job), workers=1)
    assert [p.status for p in result.pairs] == ["failed", "done"]
    assert not (tmp_path / "out" / "bad").exists()
    assert "good" in os.listdir(tmp_path / "out")


def test_a_pair_left_out_of_the_index_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every pair done, one left out of the index (its destination holds another
    device's artifact by the time the index is written, or no index could be
    published at all): the run exits 1, not 0, and says why."""
    assert MLP.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n[devices.a]\nx = 1\n[devices.b]\n'
    )
    out = tmp_path / "out"

    def copy_b_over_a(result: Any) -> None:  # after the last pair, before the index
        if result.device == "b":
            (out / "a" / "m.pte").write_bytes((out / "b" / "m.pte").read_bytes())

    result = run_job(load_job(job), workers=1, progress=copy_b_over_a)
    assert [p.status for p in result.pairs] == ["done", "done"]
    assert result.index is not None and result.index_error is not None
    assert result.index_error.startswith(f"{out}/a/m.pte: provenance device = ('b', ")
    assert result.index_error.endswith("(not indexed)")
    index = str(out / "ptestore-index.json")
    assert result.index_errors == [
        {"model": "m", "device": "a", "index": index, "error": result.index_error}
    ]
    assert result.exit_code == 1
    # No index at all (something else holds its name): every pair is left out.
    shutil.rmtree(out)
    (out / "ptestore-index.json").mkdir(parents=True)
    assert main(["fleet", "run", str(job), "--workers", "1"]) == 1
    summary = capsys.readouterr().out.splitlines()
    assert summary[0] == "done                      2"
    assert summary[-1].startswith("index not published: ")
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert (shown["skipped"], shown["index"]) == (2, None) and shown["index_error"]
    assert shown["index_errors"] == [
        {"model": None, "device": None, "index": index, "error": shown["index_error"]}
    ]


@pytest.mark.parametrize("damage", ["removed", "no trailer"])
def test_a_trailer_that_cannot_be_read_leaves_out_its_pair_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Every pair done; by the time the index is written one pair's artifact is gone,
    or holds no trailer: that pair is left out of the index, named with its model and
    device, and every other pair (its model's too) is indexed; exit 1. Before, the
    failed read stopped the whole publish: no index, the error given with model null."""
    job = _job(tmp_path)
    out = tmp_path / "out"
    broken = out / "a" / "mlp.pte"

    def break_a(result: Any) -> None:  # after the last pair, before the index
        if (result.model, result.device) == ("ext", "b"):
            if damage == "removed":
                broken.unlink()
            else:
                assert MLP.pte_path is not None
                broken.write_bytes(MLP.pte_path.read_bytes())  # the portable source

    result = run_job(load_job(job), workers=1, progress=break_a)
    assert [p.status for p in result.pairs] == ["done"] * 4
    index = str(out / "ptestore-index.json")
    assert result.index == index and result.exit_code == 1
    [error] = result.index_errors
    assert (error["model"], error["device"], error["index"]) == ("mlp", "a", index)
    assert error["error"] == result.index_error
    assert result.index_error.startswith(f"{broken}: "), result.index_error
    from ptestore.fleet.index import find_entry

    for model, device in [("mlp", "b"), ("ext", "a"), ("ext", "b")]:
        assert find_entry(index, model, device) is not None, (model, device)
    assert find_entry(index, "mlp", "a") is None
    assert result.summary().splitlines()[-1] == f"not indexed: {result.index_error}"


def test_a_dangling_link_at_a_destination_is_named_and_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symbolic link to nothing at a pair's destination is not an empty destination
    (the run's create found the name taken and reported "after a race"): the plan says
    ``fail`` naming it, the run fails that pair alone and leaves the link as it was."""
    assert MLP.pte_path is not None and EXT.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{MLP.pte_path}"\n'
        f'[[models]]\nname = "e"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        "[devices.a]\n[devices.b]\n"
    )
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    for name in ("m", "e"):  # created, and with a .ptd overwritten
        (out / "a" / f"{name}.pte").symlink_to(tmp_path / f"nowhere-{name}.pte")
    message = (
        f"a dangling symbolic link at {out}/a/{{0}}.pte (to '{tmp_path}/nowhere-{{0}}.pte'): "
        "a run neither writes through it nor replaces it; remove it (or point it at a file)"
    )
    plan = plan_job(load_job(job))
    assert [(p.pair.model.name, p.pair.device.name, p.action) for p in plan.pairs] == [
        ("m", "a", "fail"),
        ("m", "b", "run"),
        ("e", "a", "fail"),
        ("e", "b", "run"),
    ]
    assert plan.pairs[0].reason == "cannot read the destination: " + message.format("m")
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in shown["pairs"]] == ["failed", "done", "failed", "done"]
    assert shown["pairs"][2]["error"] == "cannot read the destination: " + message.format("e")
    for name in ("m", "e"):
        assert os.readlink(out / "a" / f"{name}.pte") == str(tmp_path / f"nowhere-{name}.pte")
    # A link that appears after the plan: the pair's own check names it.
    task = plan.pairs[1].task
    assert task is not None
    os.unlink(out / "b" / "m.pte")
    (out / "b" / "m.pte").symlink_to(tmp_path / "nowhere-m.pte")
    result = run_pair(task)
    assert (result.status, result.error) == ("failed", message.replace("/a/", "/b/").format("m"))


def test_a_pair_no_backend_changed_is_published_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job whose backends change nothing of a pair (here: a backend bound to an id the
    program does not have, a case typo) publishes the portable copy, as a job does, but
    says so: the summary names the pair and why, ``--json`` has ``unspecialized`` (it was
    "done" and nothing else: a generic artifact select offers every device)."""
    job = _job(tmp_path, backends='"support.fleet_backend:Scaler@XNNPACKBackend"')
    assert main(["fleet", "run", str(job), "--workers", "1", "--models", "mlp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.startswith("unspecialized: ")]
    out = tmp_path / "out"
    assert [line.split(": published as")[0] for line in said] == [
        f"unspecialized: mlp on a -> {out}/a/mlp.pte",
        f"unspecialized: mlp on b -> {out}/b/mlp.pte",
    ]
    assert all("XNNPACKBackend" in line for line in said), said
    (out / "a" / "mlp.pte").unlink()
    assert main(["fleet", "run", str(job), "--workers", "1", "--models", "mlp", "--json"]) == 0
    pairs = {p["device"]: p for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert pairs["a"]["status"] == "done" and "XNNPACKBackend" in pairs["a"]["unspecialized"]
    assert pairs["b"]["status"] == "skipped" and "unspecialized" not in pairs["b"]


def test_a_lost_pair_counts_the_planner_s_bytes_once(tmp_path: Path) -> None:
    """The runner adds the planner's bytes to every result a worker or the pool reports;
    a pair whose run was lost (its worker died, its Dask task failed, it ran too long) is
    reported by ``PlannedPair.lost``, without them (``result`` has them: it is recorded
    as it is, for a pair that did not run), so they are counted once, not twice."""
    planned = dataclasses.replace(plan_job(load_job(_job(tmp_path))).pairs[0], bytes=1234)
    assert planned.result("failed", "why").bytes == 1234
    lost = planned.lost("its worker process died")
    assert (lost.status, lost.error, lost.bytes) == ("failed", "its worker process died", 0)


def test_a_local_pair_counts_its_local_reads(tmp_path: Path) -> None:
    """``bytes`` counts a local source's reads too: the planner reads a local file into
    its own buffers (``readinto``) and backends read ``view``s of it, both around the
    counting loader until now (an 8 MiB pass-through counted about its output alone,
    not the source's read as fleet.md says)."""
    from support.large import inflated

    src = tmp_path / "big.pte"
    inflated(src, 2 << 20)  # the real mlp_xnnpack program, its 4 values 2 MiB each
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\nbackends = ["passthrough"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{src}"\n[devices.a]\n'
    )
    result = run_job(load_job(job), workers=1)
    [pair] = result.pairs
    out = tmp_path / "out" / "a" / "mlp.pte"
    assert pair.status == "done", pair.error
    # the planner's read of the source, and the artifact written
    assert pair.bytes >= src.stat().st_size + out.stat().st_size
