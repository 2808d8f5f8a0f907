"""On the device, in the REAL ExecuTorch runtime (one batch, one child process):

- what ``ptestore.ensure`` returns (made now, then from the cache; with and without a
  .ptd) runs with the outputs of the doubled weight;
- an in-place specialization SIGKILLed at sampled phases of applying its journal leaves
  a file the runtime runs with the old outputs or the new ones, or refuses, never one
  that runs with other outputs; after ``ptestore.recover`` it runs with the new ones;
  the same before every call of a grown replacement's run (moved to the end, its old
  range punched);
- an in-place ``ensure`` killed while applying (then recovered) or before its manifest,
  or whose cache was cleared, ensured in place again: the new outputs (the backend is
  not applied to its own output a second time).

Outputs are compared within the fixture's tolerance (XNNPACK's kernels differ in the
last bit between CPUs), and the new ones must differ from the old.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from device.test_inplace import (
    FX,
    SPEC,
    _calls_killed_at,
    copy,
    grown_kill_states,
    kill_states,
)
from support.et_runtime import Job, run_programs
from support.fixtures import Fixture, get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.journal import CHANGING

pytestmark = pytest.mark.interop

DEVICE = DeviceProfile("phone", {"soc": "sm8650"})


def close(got: list[np.ndarray], want: list[np.ndarray], fx: Fixture) -> bool:
    return len(got) == len(want) and all(
        np.allclose(a, b, rtol=fx.rtol, atol=fx.atol) for a, b in zip(got, want, strict=True)
    )


def test_ensured_and_in_place_artifacts_in_the_runtime(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    jobs: list[Job] = []
    #: (fixture, method, allowed outcomes among "old", "new", "refused")
    want: list[tuple[Fixture, str, set[str]]] = []
    for name in ("mlp_xnnpack", "mlp_xnnpack_ext"):
        fx = get_fixture(name)
        assert fx.pte_path is not None and fx.doubled is not None
        src = tmp_path / f"{name}.pte"
        shutil.copyfile(fx.pte_path, src)
        spec = f"support.doubling_backend:Doubling={name}"
        kw = {"cache_dir": cache, "backends": [spec], "device": DEVICE, "ptd": fx.ptd_path}
        made = ptestore.ensure(src, **kw)  # type: ignore[arg-type]
        hit = ptestore.ensure(src, **kw)  # type: ignore[arg-type]
        assert made.created and not hit.created and (hit.pte, hit.ptd) == (made.pte, made.ptd)
        assert (made.ptd is None) == (fx.ptd_path is None)
        for m in fx.methods:
            ptd = None if hit.ptd is None else Path(hit.ptd)
            jobs.append(Job(pte=Path(hit.pte), ptd=ptd, method=m, inputs=fx.inputs[m]))
            want.append((fx, m, {"new"}))
    marked = 0
    for phase, src in kill_states(tmp_path):
        killed = tmp_path / f"as-killed-{src.name}"
        shutil.copyfile(src, killed)
        marked += killed.read_bytes()[4:8] == CHANGING
        assert ptestore.recover(src) == "rolled forward"
        for path, allowed in ((killed, {"old", "new", "refused"}), (src, {"new"})):
            jobs.append(Job(pte=path, inputs=FX.inputs["forward"], label=f"{phase}: {path}"))
            want.append((FX, "forward", allowed))
    assert marked >= 3  # most sampled phases are inside the changing window
    # A grown replacement killed before every call that touches the file (issue 29 item
    # 10): old, new or refused; after recover, new (or old when it was never committed).
    for phase, src in grown_kill_states(tmp_path):
        killed = tmp_path / f"as-killed-{src.name}"
        shutil.copyfile(src, killed)
        after = {"rolled forward": "new", "discarded": "old"}[str(ptestore.recover(src))]
        for path, allowed in ((killed, {"old", "new", "refused"}), (src, {after})):
            jobs.append(Job(pte=path, inputs=FX.inputs["forward"], label=f"{phase}: {path}"))
            want.append((FX, "forward", allowed))
    # In place never specializes its own output again (issue 29 item 1): an in-place
    # ensure killed while applying then recovered, or killed before its manifest, or
    # whose cache was cleared, then ensure(in_place=True) again: still the doubled
    # weight (a second run would double it again: other outputs).
    for route, src in again_states(tmp_path):
        ptestore.ensure(
            src, cache_dir=tmp_path / f"again-{src.stem}", backends=[SPEC], in_place=True
        )
        jobs.append(Job(pte=src, inputs=FX.inputs["forward"], label=f"ensured again: {route}"))
        want.append((FX, "forward", {"new"}))
    results = run_programs(jobs)
    refused = 0
    for r, (fx, m, allowed) in zip(results, want, strict=True):
        assert fx.doubled is not None and not r.crashed, r.describe()
        if r.outputs is None:
            outcome = "refused"
            refused += 1
        elif close(r.outputs, fx.doubled.outputs_runtime[m], fx):
            outcome = "new"
        elif close(r.outputs, fx.outputs_runtime[m], fx):
            outcome = "old"
        else:
            outcome = "other outputs"
        assert outcome in allowed, (r.label, outcome, r.error)
    assert refused >= marked  # a file marked as changing is refused by the runtime


def again_states(tmp_path: Path) -> list[tuple[str, Path]]:
    """Files an in-place ``ensure`` left specialized without (or with a lost) entry."""
    out: list[tuple[str, Path]] = []
    probe = copy(tmp_path, "again-probe.pte")
    steps = _calls_killed_at(probe, 10**9, ensure_cache=tmp_path / "again-probe-cache")
    assert steps is not None
    src = copy(tmp_path, "again-recovered.pte")
    assert _calls_killed_at(src, len(steps) // 2, ensure_cache=tmp_path / "again-k") is None
    assert ptestore.recover(src) == "rolled forward"
    out.append(("killed while applying, recovered", src))
    src = copy(tmp_path, "again-manifest.pte")
    assert _calls_killed_at(src, -1, ensure_cache=tmp_path / "again-m") is None
    out.append(("killed before the manifest", src))
    src = copy(tmp_path, "again-cleared.pte")
    ptestore.ensure(src, cache_dir=tmp_path / "again-c", backends=[SPEC], in_place=True)
    ptestore.device.clear(tmp_path / "again-c")
    out.append(("cache cleared", src))
    return out
