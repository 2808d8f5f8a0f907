"""The committed fixtures are what they claim to be, according to ExecuTorch itself.

- the stored facts equal what ExecuTorch's own reader (support.et_reference) reads now;
- the original files run in the real runtime (one child process for everything) and give
  the stored runtime outputs (bit for bit on the CPU that made them, within
  MACHINE_RTOL/ATOL on another: XNNPACK's kernels depend on the CPU's features), and the
  eager outputs within the fixture tolerance;
- the "doubled weight" expectation holds: doubling those bytes in a copy gives exactly the
  stored doubled runtime outputs (and those match eager-with-doubled-weight).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.et_reference import (
    reference_facts,
    reference_program_extras,
    reference_segment_field_presence,
)
from support.et_runtime import Job, Result, run_programs
from support.fixtures import (
    MACHINE_ATOL,
    MACHINE_RTOL,
    Fixture,
    all_fixtures,
    doubled_files,
    doubled_fixtures,
    refused_fixtures,
    runnable_fixtures,
)

pytestmark = pytest.mark.interop


ALL = all_fixtures()
RUNNABLE = runnable_fixtures()
DOUBLED = doubled_fixtures()
REFUSED = refused_fixtures()


def _ids(fs: list[Fixture]) -> list[str]:
    return [f.name for f in fs]


@pytest.fixture(scope="module")
def runtime_results() -> dict[tuple[str, str, str], Result]:
    """Every job for this module, run in one batch: (fixture, method, variant) -> Result."""
    jobs: list[Job] = []
    keys: list[tuple[str, str, str]] = []
    for f in RUNNABLE:
        assert f.pte_path is not None
        for m in f.methods:
            for mode in ("path", "bytes"):
                jobs.append(
                    Job(f.pte_path, m, f.inputs[m], ptd=f.ptd_path, load_mode=mode, label=f.name)
                )
                keys.append((f.name, m, mode))
    for f in REFUSED:
        assert f.pte_path is not None
        for m in f.runtime_errors:
            jobs.append(Job(f.pte_path, m, f.inputs[m], ptd=f.ptd_path, label=f.name))
            keys.append((f.name, m, "refused"))
    for f in DOUBLED:
        pte, ptd = doubled_files(f)
        for m in f.methods:
            jobs.append(Job(pte, m, f.inputs[m], ptd=ptd, load_mode="bytes", label=f.name))
            keys.append((f.name, m, "doubled"))
    results = run_programs(jobs)
    return dict(zip(keys, results, strict=True))


@pytest.mark.parametrize("f", ALL, ids=_ids(ALL))
def test_facts_match_reference(f: Fixture) -> None:
    if f.pte_path is not None:
        assert reference_facts(f.pte_path, "pte") == f.facts["pte"]
        assert (
            reference_segment_field_presence(f.pte_path, "pte") == (f.segment_field_presence["pte"])
        )
        assert reference_program_extras(f.pte_path) == f.extras
        assert f.facts["pte"]["file_size"] == f.pte_path.stat().st_size
    if f.ptd_path is not None:
        assert reference_facts(f.ptd_path, "ptd") == f.facts["ptd"]
        assert (
            reference_segment_field_presence(f.ptd_path, "ptd") == (f.segment_field_presence["ptd"])
        )
        assert f.facts["ptd"]["file_size"] == f.ptd_path.stat().st_size


@pytest.mark.parametrize("f", ALL, ids=_ids(ALL))
def test_files_small(f: Fixture) -> None:
    for p in (f.pte_path, f.ptd_path):
        if p is not None:
            assert p.stat().st_size < (1 << 20), p


def _assert_same(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype, what
        assert a.shape == b.shape, what
        assert np.array_equal(a, b), f"{what}: max diff {np.max(np.abs(a - b))}"


def _assert_near_stored(got: list[np.ndarray], stored: list[np.ndarray], what: str) -> None:
    assert len(got) == len(stored), what
    for a, b in zip(got, stored, strict=True):
        np.testing.assert_allclose(a, b, rtol=MACHINE_RTOL, atol=MACHINE_ATOL, err_msg=what)


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], f: Fixture, what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=f.atol, rtol=f.rtol, err_msg=what)


@pytest.mark.parametrize("f", RUNNABLE, ids=_ids(RUNNABLE))
def test_runs_in_real_runtime(
    f: Fixture, runtime_results: dict[tuple[str, str, str], Result]
) -> None:
    for m in f.methods:
        for mode in ("path", "bytes"):
            r = runtime_results[(f.name, m, mode)]
            assert r.ok, r.describe()
            assert r.outputs is not None
            assert r.method_names == sorted(f.methods)
            _assert_same(
                r.outputs, f.outputs_runtime[m], f"{f.name}/{m}/{mode} vs this machine's runtime"
            )
            _assert_near_stored(r.outputs, f.outputs_runtime.stored[m], f"{f.name}/{m}/{mode}")
            if m in f.outputs_eager:
                _assert_close(r.outputs, f.outputs_eager[m], f, f"{f.name}/{m}/{mode} vs eager")
        if not f.thirdparty:
            assert m in f.outputs_eager


@pytest.mark.parametrize("f", REFUSED, ids=_ids(REFUSED))
def test_refused_cleanly(f: Fixture, runtime_results: dict[tuple[str, str, str], Result]) -> None:
    """Third-party files the pip runtime cannot run fail the same clean way (no crash)."""
    for m, error in f.runtime_errors.items():
        r = runtime_results[(f.name, m, "refused")]
        assert not r.crashed, r.describe()
        assert not r.ok
        assert r.error == error


@pytest.mark.parametrize("f", DOUBLED, ids=_ids(DOUBLED))
def test_doubled_expectation(
    f: Fixture, runtime_results: dict[tuple[str, str, str], Result]
) -> None:
    d = f.doubled
    assert d is not None
    facts: dict[str, Any] = f.facts[d.file]
    on_seg = sorted(
        nd["key"] for nd in facts["named_data"] if nd["segment_index"] == d.segment_index
    )
    assert on_seg == sorted(d.keys_on_segment)
    if d.key is not None:
        assert d.key in on_seg
        assert d.offset_in_segment == 0
        assert d.nbytes == facts["segments"][d.segment_index]["size"]
    for m in f.methods:
        r = runtime_results[(f.name, m, "doubled")]
        assert r.ok, r.describe()
        assert r.outputs is not None
        _assert_same(r.outputs, d.outputs_runtime[m], f"{f.name}/{m} doubled vs this machine's")
        _assert_near_stored(r.outputs, d.outputs_runtime.stored[m], f"{f.name}/{m} doubled")
        _assert_close(r.outputs, d.outputs_eager[m], f, f"{f.name}/{m} doubled vs eager")
        assert not all(
            np.array_equal(a, b) for a, b in zip(r.outputs, f.outputs_runtime[m], strict=True)
        ), "doubling the weight must change the outputs"


def test_manifest_lists_existing_files() -> None:
    for f in ALL:
        for p in (f.pte_path, f.ptd_path):
            if p is not None:
                assert Path(p).is_file(), p


@pytest.mark.slow
def test_runner_attributes_a_crash_to_its_job() -> None:
    """An XNNPACK program with external weights loaded without its .ptd is a SIGSEGV in
    1.4.1; the runner reports exactly that job as crashed and runs the rest in a new child."""
    ext = next(f for f in ALL if f.name == "mlp_xnnpack_ext")
    ok = next(f for f in ALL if f.name == "mlp_xnnpack")
    assert ext.pte_path is not None
    assert ok.pte_path is not None
    results = run_programs(
        [
            Job(ok.pte_path, "forward", ok.inputs["forward"], label="ok-before"),
            Job(ext.pte_path, "forward", ext.inputs["forward"], label="no-ptd"),
            Job(ext.pte_path, "forward", ext.inputs["forward"], ptd=ext.ptd_path, label="ok"),
        ]
    )
    assert [r.label for r in results] == ["ok-before", "no-ptd", "ok"]
    assert results[0].ok
    assert results[1].crashed
    assert not results[1].ok
    assert results[2].ok
    assert results[2].outputs is not None
    _assert_same(results[2].outputs, ext.outputs_runtime["forward"], "after a crash")
