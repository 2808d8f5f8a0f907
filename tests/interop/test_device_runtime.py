"""What ``ptestore.ensure`` returns runs in the REAL ExecuTorch runtime: made now and
from the cache, with and without a .ptd, with the outputs of the doubled weight (within
the fixture's tolerance: XNNPACK's kernels differ in the last bit between CPUs), not the
original's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from support.et_runtime import Job, run_programs
from support.fixtures import Fixture, get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile

pytestmark = pytest.mark.interop

DEVICE = DeviceProfile("phone", {"soc": "sm8650"})


def test_ensured_artifacts_run_with_the_new_outputs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    jobs: list[Job] = []
    want: list[tuple[Fixture, str]] = []
    for name in ("mlp_xnnpack", "mlp_xnnpack_ext"):
        fx = get_fixture(name)
        assert fx.pte_path is not None and fx.doubled is not None
        src = tmp_path / f"{name}.pte"
        shutil.copyfile(fx.pte_path, src)
        spec = f"support.doubling_backend:Doubling={name}"
        made = ptestore.ensure(
            src, cache_dir=cache, backends=[spec], device=DEVICE, ptd=fx.ptd_path
        )
        hit = ptestore.ensure(src, cache_dir=cache, backends=[spec], device=DEVICE, ptd=fx.ptd_path)
        assert made.created and not hit.created and hit.pte == made.pte and hit.ptd == made.ptd
        assert (made.ptd is None) == (fx.ptd_path is None)
        for m in fx.methods:
            jobs.append(
                Job(
                    pte=Path(hit.pte),
                    ptd=hit.ptd and Path(hit.ptd),
                    method=m,
                    inputs=fx.inputs[m],
                    label=f"{name}/{m}",
                )
            )
            want.append((fx, m))
    results = run_programs(jobs)
    for r, (fx, m) in zip(results, want, strict=True):
        assert r.outputs is not None and fx.doubled is not None, r.describe()
        assert_outputs(r.outputs, fx.doubled.outputs_runtime[m], fx, r.label)
        assert not close(r.outputs, fx.outputs_runtime[m], fx), r.label


def close(got: list[np.ndarray], want: list[np.ndarray], fx: Fixture) -> bool:
    return len(got) == len(want) and all(
        np.allclose(a, b, rtol=fx.rtol, atol=fx.atol) for a, b in zip(got, want, strict=True)
    )


def assert_outputs(got: list[np.ndarray], want: list[np.ndarray], fx: Fixture, label: str) -> None:
    assert close(got, want, fx), f"{label}: outputs differ"
