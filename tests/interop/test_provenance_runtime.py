"""The provenance trailer in the REAL ExecuTorch runtime, on every fixture.

For every fixture, two files carry a trailer after their last segment:

- the original bytes with a trailer appended (the container unchanged, byte for byte);
- the output of ``specialize(..., provenance=True)`` with ``passthrough`` and a device.

Both load and run with exactly the outputs of the original (by path and from a buffer;
a .ptd with its own trailer alongside), and fixtures the runtime refuses are refused
with the same error as without a trailer. ExecuTorch's own reader sees the same
structure (header, segments, named data, delegates) as in the original.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.et_reference import reference_facts
from support.et_runtime import Job, run_programs
from support.fixtures import Fixture, all_fixtures

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.provenance import read_provenance, read_trailer, replace_trailer
from ptestore.storage.loaders import BytesLoader

pytestmark = pytest.mark.interop

DEVICE = DeviceProfile("pixel9", {"soc": "sm8650", "flags": ["-O3"]})
PAYLOAD = {"format": "ptestore.provenance", "note": "appended by the interop test"}


def _files(fx: Fixture, tmp: Path) -> list[tuple[str, Path, Path | None]]:
    """``(label, pte, ptd)`` variants carrying trailers."""
    assert fx.pte_path is not None
    out: list[tuple[str, Path, Path | None]] = []
    appended = tmp / f"{fx.name}-appended.pte"
    appended.write_bytes(replace_trailer(fx.pte_path.read_bytes(), PAYLOAD))
    appended_ptd = None
    if fx.ptd_path is not None:
        appended_ptd = tmp / f"{fx.name}-appended.ptd"
        appended_ptd.write_bytes(replace_trailer(fx.ptd_path.read_bytes(), PAYLOAD))
    out.append(("appended", appended, appended_ptd))
    dst = tmp / f"{fx.name}-prov.pte"
    ptd = (fx.ptd_path, tmp / f"{fx.name}-prov.ptd") if fx.ptd_path else None
    ptestore.specialize(
        fx.pte_path, dst, ptd=ptd, backends=["passthrough"], device=DEVICE, provenance=True
    )
    out.append(("specialized", dst, ptd[1] if ptd else None))
    return out


def test_trailer_loads_and_runs_unchanged_on_every_fixture(tmp_path: Path) -> None:
    fixtures = [f for f in all_fixtures() if f.pte_path is not None]
    assert len(fixtures) >= 15
    jobs: list[Job] = []
    expected: list[tuple[Fixture, str, str, bool]] = []  # fixture, method, label, runs?
    for fx in fixtures:
        assert fx.pte_path is not None
        for label, pte, ptd in _files(fx, tmp_path):
            data = pte.read_bytes()
            trailer = read_trailer(BytesLoader(data))
            assert trailer is not None and trailer.content_size < len(data), fx.name
            if label == "appended":
                assert data[: trailer.content_size] == fx.pte_path.read_bytes()
            else:
                prov = read_provenance(BytesLoader(data))
                assert prov is not None and prov.device is not None
                assert prov.device.digest == DEVICE.digest()
            # ExecuTorch's own reader: the same structure as the original.
            before = reference_facts(fx.pte_path, "pte")
            after = reference_facts(pte, "pte")
            for field in ("header", "segments", "named_data", "delegates", "methods"):
                assert after[field] == before[field], (fx.name, label, field)
            if ptd is not None:
                assert fx.ptd_path is not None
                assert read_trailer(BytesLoader(ptd.read_bytes())) is not None
                a, b = reference_facts(fx.ptd_path, "ptd"), reference_facts(ptd, "ptd")
                assert a["segments"] == b["segments"] and a["named_data"] == b["named_data"]
            for method in fx.methods or ["forward"]:
                for mode in ("path", "bytes"):
                    src_pte = pte if mode == "path" else pte.read_bytes()
                    src_ptd = None if ptd is None else (ptd if mode == "path" else ptd.read_bytes())
                    jobs.append(
                        Job(
                            pte=src_pte,
                            ptd=src_ptd,
                            method=method,
                            inputs=fx.inputs.get(method, []),
                            load_mode=mode,
                            label=f"{fx.name}/{label}/{method}/{mode}",
                        )
                    )
                    expected.append((fx, method, label, fx.runnable))
            if not fx.runnable:  # refused: the original must be refused the same way
                for method in fx.methods or ["forward"]:
                    jobs.append(
                        Job(pte=fx.pte_path, method=method, label=f"{fx.name}/original/{method}")
                    )
                    expected.append((fx, method, "original", False))
    results = run_programs(jobs)
    failures = []
    refusals: dict[tuple[str, str], set[str]] = {}
    for result, (fx, method, _label, runs) in zip(results, expected, strict=True):
        if runs:
            want = fx.outputs_runtime[method]
            got = result.outputs
            if got is None:
                failures.append(f"{result.label}: {result.error or 'crashed'} {result.log[-300:]}")
            elif len(got) != len(want) or not all(
                np.array_equal(a, b) for a, b in zip(got, want, strict=True)
            ):
                failures.append(f"{result.label}: outputs differ")
        else:
            assert not result.crashed, result.describe()
            refusals.setdefault((fx.name, method), set()).add(str(result.error))
    assert not failures, "\n".join(failures)
    for where, errors in refusals.items():
        assert len(errors) == 1, f"{where}: a trailer changed the runtime's refusal: {errors}"
    assert sum(1 for *_, runs in expected if runs) >= 60
