"""A run refused as a whole writes no hold (:mod:`ptestore.fleet.holds`): the refusals
that stop a run before any pair runs (no worker with a device's ``xnnpack_cpu``, inline,
on the process pool and on Dask) come before :func:`~ptestore.fleet.reuse.hold_reused`.
They used to come after it: a refused run left ``.ptestore-hold`` files beside the old
objects its skipped pairs reuse, keeping them from gc for a grace though nothing relied
on them."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore._dataclass import replace
from ptestore.cli import main
from ptestore.fleet import JobError, load_job, plan_job, run_job, run_plan
from ptestore.fleet.holds import HOLD_SUFFIX
from ptestore.fleet.index import find_entry
from ptestore.fleet.packing import worker_cpu
from ptestore.fleet.reuse import hold_reused

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.hanging_backend:Hanging=1.0"
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
MONTH = 30 * 86400
#: A CPU no worker here has.
FOREIGN = "aarch64/page=4096:asimd" if os.uname().machine != "aarch64" else "x86_64/page=4096:sse2"
PHONE = f'[devices.phone]\nsoc = "p"\nxnnpack_cpu = "{FOREIGN}"\n'


def _job(path: Path, dest: Path, devices: str) -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return path


def _retired_d2(tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """d0, d1, d2 made, then d2 dropped and retired: its .pte and scaled shared .ptd
    are orphans, and every file is a month old (a run naming d2 again holds them)."""
    job = _job(tmp_path / "job.toml", out, THREE)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _job(job, out, TWO)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    then = time.time() - MONTH
    for p in out.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))
    return job


def _refusal(job: Path, where: str) -> str:
    info = worker_cpu()
    have = repr(info["cpu"])
    if info["runtime"] is not None:
        have += f" without the ExecuTorch runtime ({info['runtime']})"
    return (
        f"{job}: device 'phone' declares xnnpack_cpu '{FOREIGN}', and no worker of this run "
        "has that CPU and the ExecuTorch runtime to make its XNNPACK packed-weight files "
        f"(the workers have {have} on {where}); run it where such a worker is, or "
        "remove xnnpack_cpu from the device"
    )


@pytest.mark.parametrize("engine", ["inline", "pool", "dask"])
def test_a_run_refused_for_a_devices_cpu_writes_no_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """d2 named again (skipped: it reuses its month-old .pte and shared .ptd, which a
    run holds) and a device whose CPU no worker has: the run is refused, and nothing
    is held."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, out, THREE + PHONE)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    here = f"this machine ({socket.gethostname()})"
    if engine == "dask":
        import distributed

        with distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster:
            (here,) = cluster.scheduler_info["workers"]
            with pytest.raises(JobError) as err:
                run_job(load_job(job), scheduler=cluster.scheduler_address)
    else:
        with pytest.raises(JobError) as err:
            run_job(load_job(job), workers=1 if engine == "inline" else 2)
    assert str(err.value) == _refusal(job, here)
    assert not list(out.rglob(f"*{HOLD_SUFFIX}"))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written


def test_a_pair_gone_since_the_plan_that_this_run_cannot_make_again_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CPU check comes before the holds, so a skipped pair whose object is found gone
    once held (removed between the plan and the hold) is checked on its own: one whose
    device's CPU no worker has fails with both reasons, and the other pairs are indexed
    (a whole-run refusal then would come after holds were written)."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, out, THREE)
    plan = plan_job(load_job(job))
    [d2] = [p for p in plan.pairs if p.pair.device.name == "d2"]
    assert d2.action == "skip"
    d2.pair = replace(d2.pair, xnnpack_cpu=FOREIGN)  # as if d2 asked for packed weights
    pte = out / "d2" / "mlp.pte"
    pte.unlink()  # gc removed it after the plan
    result = run_plan(plan, workers=1)
    status = {p.device: (p.status, p.error) for p in result.pairs}
    assert status["d0"] == status["d1"] == ("skipped", None)
    here = f"this machine ({socket.gethostname()})"
    assert status["d2"] == (
        "failed",
        f"current when planned, but {pte} is gone since, and this run cannot make it "
        f"again: {_refusal(job, here).replace(repr('phone'), repr('d2'))}",
    )
    assert result.exit_code == 1
    assert find_entry(str(out / "ptestore-index.json"), "mlp", "d0") is not None
    assert not pte.exists()


def test_hold_reused_fails_a_gone_pair_the_run_cannot_make_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hold_reused(plan, unable)``: a skipped pair whose object is gone is made again
    unless ``unable`` says why the run cannot; then it fails with that reason."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, out, THREE)
    plan = plan_job(load_job(job))
    [d2] = [p for p in plan.pairs if p.pair.device.name == "d2"]
    (out / "d2" / "mlp.pte").unlink()
    asked: list[str] = []

    def unable(p: object) -> str:
        asked.append(p.pair.device.name)  # type: ignore[attr-defined]
        return "no worker can"

    assert hold_reused(plan, unable) == 2
    assert asked == ["d2"]
    assert (d2.action, d2.reason) == (
        "fail",
        f"current when planned, but {out / 'd2' / 'mlp.pte'} is gone since, and this run "
        "cannot make it again: no worker can",
    )


def test_a_run_whose_scheduler_cannot_be_reached_writes_no_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Dask client is made before the holds: a scheduler that cannot be reached
    refuses the run with nothing held."""
    from ptestore.errors import ConfigurationError

    out = tmp_path / "out"
    job = _retired_d2(tmp_path, out, capsys)
    _job(job, out, THREE)
    with pytest.raises(ConfigurationError) as err:
        run_job(load_job(job), scheduler="tcp://127.0.0.1:1", connect_timeout=1)
    assert str(err.value).startswith(
        "--scheduler tcp://127.0.0.1:1: cannot reach the Dask scheduler within 1 s: "
    )
    assert not list(out.rglob(f"*{HOLD_SUFFIX}"))
