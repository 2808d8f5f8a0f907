"""Why ptestore refuses the sources of tests/support/damaged.py: the stock runtime
refuses each one itself (one batch in one child process), for the reason its log names;
tests/coordinator/test_refused_sources.py pins ptestore's refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.damaged import ALL, Damaged
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
