"""Each field of the provenance key decides on its own whether a fleet pair is current:
the source's digest, the .ptd's digest, the backends' versions, the device's name and
the digest of its options. One fast local test per field: change only that field after
a run, and the plan reruns exactly the pairs it concerns, naming the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.fleet import load_job, plan_job, run_job

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sources and the artifacts of one run (made once; each test copies them)."""
    assert MLP.pte_path is not None and EXT.pte_path is not None and EXT.ptd_path is not None
    base = tmp_path_factory.mktemp("published")
    src = base / "src"
    src.mkdir()
    for p in (MLP.pte_path, EXT.pte_path, EXT.ptd_path):
        shutil.copyfile(p, src / p.name)
    job = base / "job.toml"
    job.write_text(_text(base))
    assert run_job(load_job(job)).count("failed") == 0
    return base


def _setup(tmp: Path, published: Path) -> Path:
    for d in ("src", "out"):
        shutil.copytree(published / d, tmp / d)
    job = tmp / "job.toml"
    job.write_text(_text(tmp))
    return job


def _text(tmp: Path, *, version: str = "1.0", device: str = "a", scale: str = "2.0") -> str:
    return (
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["support.fleet_backend:Scaler={version}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{tmp}/src/mlp_xnnpack.pte"\n'
        f'[[models]]\nname = "ext"\nsource = "{tmp}/src/mlp_xnnpack_ext.pte"\n'
        f'ptd = "{tmp}/src/mlp_xnnpack_ext.ptd"\n'
        f'[devices.{device}]\nsoc = "x"\nscale = {scale}\n'
    )


def _plan(job: Path) -> dict[str, tuple[str, str]]:
    return {p.pair.model.name: (p.action, p.reason) for p in plan_job(load_job(job)).pairs}


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_unchanged_everything_is_current(tmp_path: Path, published: Path) -> None:
    job = _setup(tmp_path, published)
    assert {m: a for m, (a, _) in _plan(job).items()} == {"mlp": "skip", "ext": "skip"}


def test_the_source_digest(tmp_path: Path, published: Path) -> None:
    job = _setup(tmp_path, published)
    _flip_last_byte(tmp_path / "src" / "mlp_xnnpack.pte")
    plan = _plan(job)
    assert plan["ext"][0] == "skip"
    assert plan["mlp"][0] == "run"
    assert plan["mlp"][1].startswith("stale: source.sha256 is sha256-tree:")


def test_the_ptd_digest(tmp_path: Path, published: Path) -> None:
    job = _setup(tmp_path, published)
    _flip_last_byte(tmp_path / "src" / "mlp_xnnpack_ext.ptd")
    plan = _plan(job)
    assert plan["mlp"][0] == "skip"
    assert plan["ext"][0] == "run"
    assert plan["ext"][1].startswith("stale: ptd_source.sha256 is sha256-tree:")


def test_the_backend_versions(tmp_path: Path, published: Path) -> None:
    job = _setup(tmp_path, published)
    job.write_text(_text(tmp_path, version="1.1"))
    plan = _plan(job)
    for model in ("mlp", "ext"):
        assert plan[model] == (
            "run",
            "stale: backends are [support.fleet_backend:Scaler=1.0 1.0], expected "
            "[support.fleet_backend:Scaler=1.1 1.1]",
        )


@pytest.mark.parametrize("change", ["name", "options"])
def test_the_device(tmp_path: Path, published: Path, change: str) -> None:
    job = _setup(tmp_path, published)
    if change == "name":
        # The same options under another name: device a's artifacts now sit where
        # device b's belong.
        (tmp_path / "out" / "a").rename(tmp_path / "out" / "b")
        job.write_text(_text(tmp_path, device="b"))
    else:
        job.write_text(_text(tmp_path, scale="3.0"))
    expected = "stale: device is a (sha256:"
    plan = _plan(job)
    for model in ("mlp", "ext"):
        assert plan[model][0] == "run"
        assert plan[model][1].startswith(expected)
        assert (
            ", expected " + ("b (sha256:" if change == "name" else "a (sha256:") in plan[model][1]
        )
