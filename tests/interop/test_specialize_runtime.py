"""End-to-end specialization of every real fixture, checked in the real runtime.

- ``passthrough`` output runs with outputs identical to the original;
- a backend that doubles one named weight gives exactly the runtime outputs of the
  byte-doubled file and, within the fixture tolerance, eager PyTorch with that weight
  doubled;
- a replacement of a different size with alignment 64 yields a file whose structure
  ExecuTorch's own reader confirms (new sizes and offsets, replaced bytes in place, all
  other segments byte-identical);
- the same through ``memory://`` and through ``s3://`` on moto and on SeaweedFS.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from support.et_reference import reference_facts, segment_bytes
from support.et_runtime import Job, Result, run_programs
from support.fixtures import Fixture, doubled_fixtures, runnable_fixtures

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.interop


class DoubleKey(BackendInterface):
    """Doubles the float32 weight stored under one key (the test backend)."""

    def __init__(self, fx: Fixture, backend_id: str) -> None:
        assert fx.doubled is not None and fx.doubled.key is not None
        self.doubled = fx.doubled
        self.name = backend_id
        self.inputs = 0

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            self.inputs += 1
        named = context.get_named_data_map()
        key = self.doubled.key
        value = bytes(named.get_data(key))
        output.write_named_data(key, BackendData(self.doubled.doubled_value(value)))


class GrowKey(BackendInterface):
    """Replaces one key with bytes of a different size, asking for alignment 64."""

    def __init__(self, key: str, backend_id: str, extra: int = 100) -> None:
        self.key = key
        self.name = backend_id
        self.extra = extra
        self.replacement = b""

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = bytes(context.get_named_data_map().get_data(self.key))
        self.replacement = bytes(reversed(value)) + bytes(range(self.extra))
        output.write_named_data(
            self.key, BackendData(self.replacement, alignment=64, allow_size_change=True)
        )


def keyed_doubled() -> list[Fixture]:
    """Fixtures with a doubled-weight expectation on a named key of a delegated program
    (a portable program has no backend to call)."""
    return [
        f for f in doubled_fixtures() if f.doubled and f.doubled.key and f.facts["pte"]["delegates"]
    ]


def _backend_id(fx: Fixture) -> str:
    ids = [d["id"] for d in fx.facts["pte"]["delegates"]]
    assert ids, f"{fx.name} has no delegate"
    return str(ids[0])


def _jobs(fx: Fixture, pte: Path, ptd: Path | None, label: str) -> list[Job]:
    return [
        Job(pte=pte, ptd=ptd, method=m, inputs=fx.inputs[m], label=f"{label}/{m}")
        for m in fx.methods
    ]


def _check(results: list[Result], want: list[list[np.ndarray]]) -> list[str]:
    failures = []
    for result, expected in zip(results, want, strict=True):
        if result.outputs is None:
            failures.append(f"{result.label}: {result.error or 'crashed'} {result.log[-400:]}")
        elif len(expected) != len(result.outputs) or not all(
            np.array_equal(a, b) for a, b in zip(expected, result.outputs, strict=True)
        ):
            failures.append(f"{result.label}: outputs differ")
    return failures


def test_passthrough_and_doubled_weight_run_in_runtime(tmp_path: Path) -> None:
    jobs: list[Job] = []
    want: list[list[np.ndarray]] = []
    for fx in runnable_fixtures():
        assert fx.pte_path is not None
        dst = tmp_path / f"{fx.name}-pass.pte"
        ptd = (fx.ptd_path, tmp_path / f"{fx.name}-pass.ptd") if fx.ptd_path else None
        report = ptestore.specialize(fx.pte_path, dst, ptd=ptd, backends=["passthrough"])
        assert all(b.status == "specialized" for b in report.backends)
        jobs += _jobs(fx, dst, ptd[1] if ptd else None, f"{fx.name}/passthrough")
        want += [fx.outputs_runtime[m] for m in fx.methods]

    doubled = keyed_doubled()
    assert len(doubled) >= 3
    for fx in doubled:
        assert fx.pte_path is not None and fx.doubled is not None
        dst = tmp_path / f"{fx.name}-x2.pte"
        ptd = (fx.ptd_path, tmp_path / f"{fx.name}-x2.ptd") if fx.ptd_path else None
        backend = DoubleKey(fx, _backend_id(fx))
        report = ptestore.specialize(fx.pte_path, dst, ptd=ptd, backends=[backend])

        assert report.backends[0].keys_replaced == [fx.doubled.key]
        jobs += _jobs(fx, dst, ptd[1] if ptd else None, f"{fx.name}/doubled")
        want += [fx.doubled.outputs_runtime[m] for m in fx.methods]

    results = run_programs(jobs)
    failures = _check(results, want)
    assert not failures, "\n".join(failures)
    # And against eager PyTorch with the weight doubled.
    i = len(jobs) - sum(len(fx.methods) for fx in doubled)
    for fx in doubled:
        assert fx.doubled is not None
        for m in fx.methods:
            got = results[i].outputs
            assert got is not None
            for a, b in zip(got, fx.doubled.outputs_eager[m], strict=True):
                np.testing.assert_allclose(a, b, atol=max(fx.atol, 1e-5), rtol=max(fx.rtol, 1e-5))
            i += 1


@pytest.mark.parametrize("fx", keyed_doubled(), ids=lambda f: f.name)
def test_size_changing_replacement_structure(fx: Fixture, tmp_path: Path) -> None:
    assert fx.doubled is not None and fx.doubled.key is not None and fx.pte_path is not None
    role = fx.doubled.file
    src = fx.pte_path if role == "pte" else fx.ptd_path
    assert src is not None
    before = reference_facts(src, role)
    index = next(e["segment_index"] for e in before["named_data"] if e["key"] == fx.doubled.key)
    backend = GrowKey(fx.doubled.key, _backend_id(fx))
    dst = tmp_path / "out.pte"
    ptd = (fx.ptd_path, tmp_path / "out.ptd") if fx.ptd_path else None
    ptestore.specialize(fx.pte_path, dst, ptd=ptd, backends=[backend], provenance=False)
    out = dst if role == "pte" else tmp_path / "out.ptd"
    after = reference_facts(out, role)
    hdr = after["header"]
    assert hdr is not None
    seg = after["segments"][index]
    assert seg["size"] == before["segments"][index]["size"] + 100
    assert (hdr["segment_base_offset"] + seg["offset"]) % 64 == 0
    assert segment_bytes(out, index, role) == backend.replacement
    for s in before["segments"]:
        if s["index"] != index:
            assert segment_bytes(out, s["index"], role) == segment_bytes(src, s["index"], role)
    # Only the replaced key's size changed; keys, methods, delegates are as before.
    assert after["named_data"] == before["named_data"]
    assert after["delegates"] == before["delegates"]
    assert after["methods"] == before["methods"]
    assert hdr["segment_data_size"] == max(s["offset"] + s["size"] for s in after["segments"])
    assert after["file_size"] == hdr["segment_base_offset"] + hdr["segment_data_size"]


@pytest.mark.parametrize(
    ("where", "s3_server"),  # memory once (the moto server it is given stays unused)
    [("memory", "moto"), ("s3", "moto"), ("s3", "seaweedfs")],
    indirect=["s3_server"],
    ids=["memory", "s3-moto", "s3-seaweedfs"],
)
def test_specialize_through_remote_storage(
    where: str, tmp_path: Path, s3_server: S3TestServer
) -> None:
    fixtures = keyed_doubled()[:3]
    fixtures.append(next(f for f in runnable_fixtures() if f.ptd_path is not None))
    if where == "memory":
        fs = fsspec.filesystem("memory")
        root = f"memory://ptestore-interop-{uuid.uuid4().hex[:8]}"
        options: dict[str, Any] = {}
    else:
        options = s3_server.storage_options
        fs = fsspec.filesystem("s3", **options)
        root = f"s3://{s3_server.new_bucket()}"
    jobs: list[Job] = []
    want: list[list[np.ndarray]] = []
    for fx in fixtures:
        assert fx.pte_path is not None
        src = f"{root}/{fx.name}/model.pte"
        fs.pipe(src, fx.pte_path.read_bytes())
        ptd = None
        if fx.ptd_path is not None:
            fs.pipe(f"{root}/{fx.name}/model.ptd", fx.ptd_path.read_bytes())
            ptd = (f"{root}/{fx.name}/model.ptd", f"{root}/{fx.name}/out.ptd")
        if fx.doubled is not None and fx.doubled.key is not None:
            backends: list[Any] = [DoubleKey(fx, _backend_id(fx))]
            expected = fx.doubled.outputs_runtime
        else:
            backends = ["passthrough"]
            expected = fx.outputs_runtime
        dst = f"{root}/{fx.name}/out.pte"
        ptestore.specialize(
            src, dst, ptd=ptd, backends=backends, storage_options=options, provenance=False
        )
        local = tmp_path / f"{fx.name}-{where}.pte"
        local.write_bytes(fs.cat_file(dst))
        local_ptd = None
        if ptd is not None:
            local_ptd = tmp_path / f"{fx.name}-{where}.ptd"
            local_ptd.write_bytes(fs.cat_file(ptd[1]))
        jobs += _jobs(fx, local, local_ptd, f"{fx.name}/{where}")
        want += [expected[m] for m in fx.methods]
        # In-place replacement of the .pte alone works on remote storage too, and gives
        # what the same run gives into a fresh destination.
        if ptd is None:
            fresh = f"{root}/{fx.name}/fresh.pte"
            ptestore.specialize(
                src, fresh, backends=["passthrough"], storage_options=options, provenance=False
            )
            ptestore.specialize(
                src, src, backends=["passthrough"], storage_options=options, provenance=False
            )
            assert fs.cat_file(src) == fs.cat_file(fresh)
    if where == "s3":
        bucket = root[len("s3://") :]
        assert not s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    failures = _check(run_programs(jobs), want)
    assert not failures, "\n".join(failures)
