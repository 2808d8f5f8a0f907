"""The loading snippet of docs/device.md ("Loading the artifact with the ExecuTorch
runtime"), run as written with the 1.4.1 wheel: on the fixture pair
``mlp_xnnpack_ext.pte`` + ``.ptd`` and a ``.pte`` alone (their outputs are the recorded
runtime outputs), and on the pair ``ensure`` returns (trailer and cache included)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile

pytestmark = pytest.mark.interop
pytest.importorskip("executorch.extension.pybindings.portable_lib")

DOC = Path(__file__).resolve().parents[2] / "docs" / "device.md"
EXT = get_fixture("mlp_xnnpack_ext")
MLP = get_fixture("mlp_xnnpack")
SPEC = "support.counting_backend:Counting=1.0"


def snippet() -> str:
    text = DOC.read_text()
    found = re.search(
        r"<!-- tested: tests/device/test_load_pair_doc.py[^>]*-->\n```python\n(.*?)```",
        text,
        re.S,
    )
    assert found is not None, "the tested loading snippet is gone from docs/device.md"
    return found.group(1)


def run(pte: Path | str, ptd: Path | str | None) -> dict[str, Any]:
    ns: dict[str, Any] = {
        "artifact": SimpleNamespace(pte=str(pte), ptd=None if ptd is None else str(ptd))
    }
    exec(compile(snippet(), str(DOC), "exec"), ns)
    return ns


def _same(out: Any, expected: np.ndarray, fx: Any) -> None:
    np.testing.assert_allclose(np.asarray(out), expected, atol=fx.atol, rtol=fx.rtol)


def test_the_documented_snippet_loads_a_pair_and_a_pte_alone() -> None:
    import torch

    ns = run(EXT.pte_path, EXT.ptd_path)
    expected = EXT.outputs_runtime["forward"][0]
    assert len(ns["outputs"]) == 1 and tuple(ns["outputs"][0].shape) == expected.shape
    # the module the snippet made gives the recorded outputs for the recorded inputs
    got = ns["module"].forward([torch.from_numpy(a) for a in EXT.inputs["forward"]])
    _same(got[0], EXT.outputs_runtime["forward"][0], EXT)

    ns = run(MLP.pte_path, None)
    method = ns["program"].load_method("forward")
    got = method.execute([torch.from_numpy(a) for a in MLP.inputs["forward"]])
    _same(got[0], MLP.outputs_runtime["forward"][0], MLP)


def test_the_snippet_loads_what_ensure_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(tmp_path / "calls.txt"))
    artifact = ptestore.ensure(
        EXT.pte_path,
        ptd=EXT.ptd_path,
        cache_dir=tmp_path / "cache",
        backends=[SPEC],
        device=DeviceProfile("phone", {"scale": 2.0}),
    )
    assert artifact.ptd is not None and artifact.provenance is not None  # a trailer
    ns = run(artifact.pte, artifact.ptd)
    assert tuple(ns["outputs"][0].shape) == EXT.outputs_runtime["forward"][0].shape
    assert bool(np.isfinite(np.asarray(ns["outputs"][0])).all())
