"""End to end through ``ptestore.specialize``: a segment whose offset field is absent
(it held the default 0) is moved, so the patch engine must re-emit its table (the
redirect path); the result runs in the real ExecuTorch runtime with the original
outputs, and ExecuTorch's own reader sees every segment where ptestore put it with the
original bytes (issue 12: a redirected table offset off by one was caught by no
coordinator or ``specialize`` test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.et_reference import reference_facts, reference_segment_field_presence, segment_bytes
from support.et_runtime import Job, run_programs
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.format import parse

pytestmark = pytest.mark.interop

#: Larger than any base alignment ptestore picks by itself: every replaced segment moves.
ALIGN = 1 << 14


class Realign(BackendInterface):
    """Rewrites every processed blob and named key with its own bytes, asking for a
    large alignment."""

    def __init__(self, backend_id: str) -> None:
        self.name = backend_id
        self.keys: list[str] = []

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for item in context:
            output.write_processed_data(BackendData(bytes(item.processed), alignment=ALIGN))
            self.keys.append(f"<processed {item.method}>")
        named = context.get_named_data_map()
        keys = named.keys()  # a NamedDataMap, not a dict
        for key in keys:
            output.write_named_data(key, BackendData(bytes(named.get_data(key)), alignment=ALIGN))
            self.keys.append(key)


def test_specialize_moves_segments_with_an_absent_offset(tmp_path: Path) -> None:
    jobs: list[Job] = []
    for name in ("mlp_xnnpack", "two_methods_xnnpack"):
        fx = get_fixture(name)
        assert fx.pte_path is not None
        src = fx.pte_path.read_bytes()
        before = parse(src, len(src), str(fx.pte_path))
        absent = [s.index for s in before.segments if not s.offset_present and s.size]
        assert absent, f"{name}: no non-empty segment with an absent offset field"

        dst = tmp_path / f"{name}-realigned.pte"
        backend = Realign(str(before.delegates[0].id))
        report = ptestore.specialize(fx.pte_path, dst, backends=[backend])
        assert backend.keys and report.backends[0].status == "specialized"

        facts = reference_facts(dst, "pte")
        base = facts["header"]["segment_base_offset"]
        for index in absent:
            # ExecuTorch's reader: the segment moved, has an offset field, same bytes.
            seg = facts["segments"][index]
            assert seg["offset"] != 0, f"{name}: segment {index} did not move"
            assert (base + seg["offset"]) % ALIGN == 0
            assert segment_bytes(dst, index, "pte") == segment_bytes(fx.pte_path, index, "pte")
        presence = reference_segment_field_presence(dst)
        assert all(presence[i]["offset_present"] for i in absent), presence
        jobs += [
            Job(
                pte=dst,
                method=m,
                inputs=fx.inputs[m],
                load_mode=mode,
                label=f"{name}/{m}/{mode}",
            )
            for m in fx.methods
            for mode in ("path", "bytes")
        ]

    results = run_programs(jobs)
    for job, result in zip(jobs, results, strict=True):
        assert result.outputs is not None, f"{job.label}: {result.error} {result.log[-400:]}"
        want = get_fixture(job.label.split("/")[0]).outputs_runtime[job.method]
        assert len(want) == len(result.outputs), job.label
        for a, b in zip(want, result.outputs, strict=True):
            assert np.array_equal(a, b), f"{job.label}: outputs differ"
