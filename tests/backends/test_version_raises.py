"""A backend whose ``version`` property raises is named wherever ptestore reads a version:
a run's provenance (``tests/coordinator/test_backend_naming.py``), the device cache's key
(``ensure``), a fleet plan, a fleet worker's check and ``verify --backend``. Before, all
but the first let the backend's own exception escape (a raw ``RuntimeError``; the CLI
called it an internal error), and a default ``ensure`` without backends failed for every
model because of one installed backend."""

from __future__ import annotations

from pathlib import Path

import pytest

import ptestore
from ptestore.errors import BackendError

SPEC = "support.broken_version:BrokenVersion"
MESSAGE = f"backend {SPEC!r}: reading its version failed: RuntimeError: cannot read VERSION"


def test_ensure_names_the_backend(src: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.ensure(src, cache_dir=tmp_path / "cache", backends=[SPEC])
    assert str(err.value) == MESSAGE
    assert not (tmp_path / "cache" / "entries").exists() or not any(
        (tmp_path / "cache" / "entries").iterdir()
    )


def test_a_fleet_plan_names_the_backend() -> None:
    from ptestore.fleet.plan import backend_versions

    with pytest.raises(BackendError) as err:
        backend_versions((f" {SPEC} ",))
    assert str(err.value) == MESSAGE


def test_verify_names_the_backend(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pte"
    ptestore.specialize(src, out, backends=["support.doubling_backend:Doubling=mlp_xnnpack"])
    with pytest.raises(BackendError) as err:
        ptestore.verify(out, backends=[SPEC])
    assert str(err.value) == MESSAGE
