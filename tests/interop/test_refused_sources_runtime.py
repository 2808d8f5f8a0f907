"""Why ptestore refuses the sources of tests/support/damaged.py: the stock runtime
refuses each one itself (one batch in one child process), for the reason its log names;
tests/coordinator/test_refused_sources.py pins ptestore's refusal. And a .pte value
shorter than its tensor, which it does not refuse but crashes on or misreads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.damaged import ALL, Damaged, cut_value, xh29_pair
from support.et_runtime import Job, Result, run_programs
from support.fixtures import get_fixture

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    d = tmp_path_factory.mktemp("damaged")
    jobs = []
    for case in ALL:
        pte, ptd = case.files()
        (d / f"{case.name}.pte").write_bytes(pte)
        ptd_path: Path | None = None
        if ptd is not None:
            ptd_path = d / f"{case.name}.ptd"
            ptd_path.write_bytes(ptd)
        fx = get_fixture(case.fixture)
        jobs.append(
            Job(d / f"{case.name}.pte", inputs=fx.inputs["forward"], ptd=ptd_path, label=case.name)
        )
    return {r.label: r for r in run_programs(jobs)}


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_the_runtime_refuses_it(case: Damaged, verdicts: dict[str, Result]) -> None:
    result = verdicts[case.name]
    assert not result.ok and not result.crashed, result.describe()
    assert case.runtime in result.log, result.describe()


#: mlp_xnnpack's first weight (float32 [32, 16], 2048 bytes) and last bias (float32 [8]).
W1 = "9eed8098f924a1e1efe5fd1dfba5ab56b5a8fa3bfbe4bb50eef0b5520f2a05a0"
B2 = "3bf604f25ef5fac19ec896e5dd1421db740d59bb3ff76838ded16846172d0ee5"


def test_a_pte_value_shorter_than_its_tensor_crashes_or_misreads(tmp_path: Path) -> None:
    """Why a run of a .pte alone refuses such a value
    (tests/coordinator/test_short_values_alone.py): loaded from its path (mmap), an
    XNNPACK weight or bias cut to 0 bytes is a SIGSEGV, and the first weight cut to 1 byte
    is read past its end into other bytes (outputs that differ from the whole file's,
    without an error)."""
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    whole = Path(fx.pte_path).read_bytes()
    cuts = {"w1_0": (W1, 0), "b2_0": (B2, 0), "w1_1": (W1, 1)}
    jobs = [Job(fx.pte_path, inputs=fx.inputs["forward"], label="whole")]
    for name, (key, size) in cuts.items():
        (tmp_path / f"{name}.pte").write_bytes(cut_value(whole, key, size))
        jobs.append(Job(tmp_path / f"{name}.pte", inputs=fx.inputs["forward"], label=name))
    ok, *cut = run_programs(jobs)
    assert ok.ok and ok.outputs is not None, ok.describe()
    verdicts = {r.label: r for r in cut}
    for crash in (verdicts["w1_0"], verdicts["b2_0"]):
        assert crash.crashed and crash.returncode == -11, crash.describe()
    misread = verdicts["w1_1"]
    assert misread.ok and misread.outputs is not None, misread.describe()
    assert not np.array_equal(misread.outputs[0], ok.outputs[0])


def test_the_runtime_loads_a_pair_whose_xnnpack_header_length_is_29(tmp_path: Path) -> None:
    """Why tests/coordinator/test_refused_sources.py accepts it: the runtime does not
    read the header's length field."""
    pte, ptd = xh29_pair()
    (tmp_path / "in.pte").write_bytes(pte)
    (tmp_path / "in.ptd").write_bytes(ptd)
    fx = get_fixture("mlp_xnnpack_ext")
    whole, xh29 = run_programs(
        [
            Job(fx.pte_path, inputs=fx.inputs["forward"], ptd=fx.ptd_path),
            Job(tmp_path / "in.pte", inputs=fx.inputs["forward"], ptd=tmp_path / "in.ptd"),
        ]
    )
    assert whole.ok and xh29.ok, (whole.describe(), xh29.describe())
    assert whole.outputs is not None and xh29.outputs is not None
    assert np.array_equal(whole.outputs[0], xh29.outputs[0])
