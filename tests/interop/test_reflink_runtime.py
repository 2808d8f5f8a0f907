"""Clone-laid-out outputs run in the real ExecuTorch runtime.

On a loop-mounted XFS with reflink the local writer reports a clone block size, so the
layout keeps unchanged segments congruent to their source offsets modulo 4096 (padding
after a change). Each keyed fixture gets its weight doubled and grown by trailing bytes
(a size change, alignment 64), which moves every later segment; the output must give
exactly the runtime outputs of the byte-doubled file, and every unchanged segment must
sit block-congruent to its source offset with its bytes intact (ExecuTorch's own reader).
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
from support.et_reference import reference_facts, segment_bytes
from support.et_runtime import Job, run_programs
from support.fixtures import Fixture, doubled_fixtures
from support.xfs import xfs_reflink_mount

import ptestore
from ptestore.backends import BackendData, BackendInterface

pytestmark = [pytest.mark.interop, pytest.mark.reflink]

BLOCK = 4096
EXTRA = 5000  # trailing bytes after the doubled value: every later segment moves


class DoubleAndGrow(BackendInterface):
    def __init__(self, fx: Fixture, backend_id: str) -> None:
        assert fx.doubled is not None and fx.doubled.key is not None
        self.doubled = fx.doubled
        self.name = backend_id

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        key = self.doubled.key
        assert key is not None
        value = bytes(context.get_named_data_map().get_data(key))
        grown = self.doubled.doubled_value(value) + bytes(EXTRA)
        output.write_named_data(key, BackendData(grown, alignment=64, allow_size_change=True))


def _keyed() -> list[Fixture]:
    return [
        f for f in doubled_fixtures() if f.doubled and f.doubled.key and f.facts["pte"]["delegates"]
    ]


def test_clone_laid_out_outputs_run_in_runtime() -> None:
    fixtures = _keyed()
    assert len(fixtures) >= 3
    jobs: list[Job] = []
    want: list[list[np.ndarray]] = []
    padded = 0  # fixtures where later segments moved and congruence added padding
    with xfs_reflink_mount("1G") as xfs:
        for fx in fixtures:
            assert fx.pte_path is not None and fx.doubled is not None
            d = xfs.path / fx.name
            d.mkdir()
            src = d / "model.pte"
            shutil.copyfile(fx.pte_path, src)
            ptd = None
            if fx.ptd_path is not None:
                shutil.copyfile(fx.ptd_path, d / "model.ptd")
                ptd = (d / "model.ptd", d / "out.ptd")
            backend_id = str(fx.facts["pte"]["delegates"][0]["id"])
            report = ptestore.specialize(
                src, d / "out.pte", ptd=ptd, backends=[DoubleAndGrow(fx, backend_id)]
            )
            role = fx.doubled.file
            f = next(r for r in report.files if r.role == role)
            assert f.clone_block_size == BLOCK and f.segments_replaced == 1
            padded += f.segments_moved > 1 and f.clone_padding > 0
            before_path = src if role == "pte" else d / "model.ptd"
            after_path = d / ("out.pte" if role == "pte" else "out.ptd")
            before = reference_facts(before_path, role)
            after = reference_facts(after_path, role)
            b0 = before["header"]["segment_base_offset"]
            b1 = after["header"]["segment_base_offset"]
            index = fx.doubled.segment_index
            for old, new in zip(before["segments"], after["segments"], strict=True):
                if old["index"] == index or old["size"] == 0:
                    continue
                assert (b1 + new["offset"] - b0 - old["offset"]) % BLOCK == 0, (fx.name, old)
                assert segment_bytes(after_path, old["index"], role) == segment_bytes(
                    before_path, old["index"], role
                )
            assert after["segments"][index]["size"] == before["segments"][index]["size"] + EXTRA
            jobs += [
                Job(
                    pte=d / "out.pte",
                    ptd=ptd[1] if ptd else None,
                    method=m,
                    inputs=fx.inputs[m],
                    label=f"{fx.name}/{m}",
                )
                for m in fx.methods
            ]
            want += [fx.doubled.outputs_runtime[m] for m in fx.methods]
        results = run_programs(jobs)
    assert padded, "no fixture moved a segment after the grown weight"
    failures = []
    for result, expected in zip(results, want, strict=True):
        if result.outputs is None:
            failures.append(f"{result.label}: {result.error or 'crashed'} {result.log[-400:]}")
        elif not all(np.array_equal(a, b) for a, b in zip(expected, result.outputs, strict=True)):
            failures.append(f"{result.label}: outputs differ")
    assert not failures, "\n".join(failures)
