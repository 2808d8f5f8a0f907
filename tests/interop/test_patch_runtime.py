"""Patched fixtures load and run in the real ExecuTorch runtime with identical outputs.

Variants per fixture (each file of a .pte/.ptd pair is patched):
- ``moved``: every segment moved (a gap before each, 4096-aligned), which forces absent
  offset fields through the table-redirect path and changes every header size;
- ``moved16``: segments moved by small 16-byte-aligned steps (different header sizes,
  tighter packing);
- ``identity``: re-emitted with the original placements.
The runtime loads each from a path (mmap) and from bytes, with InternalConsistency
verification; outputs must equal the original's runtime outputs exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.et_reference import reference_facts
from support.et_runtime import Job, run_programs
from support.fixtures import Fixture, runnable_fixtures

from ptestore.format import parse, patch_metadata
from ptestore.format.model import Container

pytestmark = pytest.mark.interop


def _placements(c: Container, variant: str) -> tuple[list[tuple[int, int]], int]:
    if variant == "identity":
        return [(s.offset, s.size) for s in c.segments], 128
    step, align = (128, 4096) if variant == "moved" else (16, 64)
    out: list[tuple[int, int]] = [(0, 0)] * len(c.segments)
    cursor = 0
    for s in sorted(c.segments, key=lambda s: (s.offset, s.index)):
        cursor = (cursor + step + align - 1) // align * align
        out[s.index] = (cursor, s.size)
        cursor += s.size
    return out, align


def patched_file(path: Path, variant: str) -> tuple[bytes, Container, list[tuple[int, int]]]:
    data = path.read_bytes()
    c = parse(data, len(data), str(path))
    if c.header is None:
        return data, c, [(s.offset, s.size) for s in c.segments]
    placements, align = _placements(c, variant)
    result = patch_metadata(c, data, placements, base_alignment=max(align, 128))
    out = bytearray(result.file_size)
    out[: len(result.metadata)] = result.metadata
    for s, (off, size) in zip(c.segments, placements, strict=True):
        src = c.segment_base_offset + s.offset
        dst = result.segment_base_offset + off
        out[dst : dst + size] = data[src : src + size]
    return bytes(out), c, placements


VARIANTS = ("moved", "moved16", "identity")


def test_patched_fixtures_run_identically(tmp_path: Path) -> None:
    fixtures = runnable_fixtures()
    assert len(fixtures) >= 10
    jobs: list[Job] = []
    expected: list[tuple[Fixture, str]] = []
    redirected_somewhere = False
    for fx in fixtures:
        for variant in VARIANTS:
            assert fx.pte_path is not None
            pte, c, placements = patched_file(fx.pte_path, variant)
            if variant == "moved":
                redirected_somewhere |= any(
                    not s.offset_present and off != s.offset
                    for s, (off, _) in zip(c.segments, placements, strict=True)
                )
            ptd = None
            ptd_placements: list[tuple[int, int]] = []
            if fx.ptd_path is not None:
                ptd, _, ptd_placements = patched_file(fx.ptd_path, variant)
            pte_path = tmp_path / f"{fx.name}-{variant}.pte"
            pte_path.write_bytes(pte)
            ptd_path = None
            if ptd is not None:
                ptd_path = tmp_path / f"{fx.name}-{variant}.ptd"
                ptd_path.write_bytes(ptd)
                ptd_facts = reference_facts(ptd_path, "ptd")
                assert [(s["offset"], s["size"]) for s in ptd_facts["segments"]] == ptd_placements
            # The structure ExecuTorch's own reader sees is the one we meant.
            facts = reference_facts(pte_path, "pte")
            assert [(s["offset"], s["size"]) for s in facts["segments"]] == placements
            for method in fx.methods:
                for mode in ("path", "bytes"):
                    jobs.append(
                        Job(
                            pte=pte_path if mode == "path" else pte,
                            ptd=(ptd_path if mode == "path" else ptd) if ptd is not None else None,
                            method=method,
                            inputs=fx.inputs[method],
                            load_mode=mode,
                            label=f"{fx.name}/{variant}/{method}/{mode}",
                        )
                    )
                    expected.append((fx, method))
    assert redirected_somewhere, "no fixture exercised the redirect path"
    results = run_programs(jobs)
    failures = []
    for job, result, (fx, method) in zip(jobs, results, expected, strict=True):
        if result.outputs is None:
            failures.append(f"{job.label}: {result.error or 'crashed'} {result.log[-500:]}")
            continue
        want = fx.outputs_runtime[method]
        if len(want) != len(result.outputs) or not all(
            np.array_equal(a, b) for a, b in zip(want, result.outputs, strict=True)
        ):
            failures.append(f"{job.label}: outputs differ")
    assert not failures, "\n".join(failures)


def test_pre_1_0_header_patched_file_runs(tmp_path: Path) -> None:
    """A 24-byte (pre-1.0) header, synthesized from a real file, moved and patched: the
    runtime reads no segment_data_size from it and still runs it identically."""
    import struct

    from support.fixtures import get_fixture

    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    old = bytearray(fx.pte_path.read_bytes())
    struct.pack_into("<I", old, 12, 24)
    old[32:40] = b"\0" * 8
    src = tmp_path / "old.pte"
    src.write_bytes(bytes(old))
    moved, _, _ = patched_file(src, "moved")
    assert moved[32:40] == b"\0" * 8
    dst = tmp_path / "old-moved.pte"
    dst.write_bytes(moved)
    jobs = [
        Job(pte=p, method="forward", inputs=fx.inputs["forward"], label=p.name) for p in (src, dst)
    ]
    for result in run_programs(jobs):
        assert result.outputs is not None, result.error
        for a, b in zip(fx.outputs_runtime["forward"], result.outputs, strict=True):
            assert np.array_equal(a, b)
