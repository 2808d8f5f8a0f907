"""Storage options are routed by one module (ptestore.storage.routing), from what each
loader and writer class declares: the front end (specialize and its pair runner), the
fleet and verify send the same options to the same side for local, memory and S3 URLs,
and refuse the same misplaced ones with the same message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.fleet import parse_job, run_job
from ptestore.fleet.job import pair_options
from ptestore.storage.loaders import FsspecLoader, LocalFileLoader, loader_options
from ptestore.storage.routing import StorageOptions, options_for_loader, options_for_writer
from ptestore.storage.types import StorageURL
from ptestore.writers import LocalFileWriter, MemoryWriter, writer_options

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"

#: One option of each kind: both sides of every remote URL (retry), fsspec's own
#: (loaders of every remote URL; writers over fsspec/s3fs), s3fs's own, S3 writer only.
OPTIONS: dict[str, Any] = {
    "retry_attempts": 2,
    "skip_instance_cache": True,
    "endpoint_url": "http://127.0.0.1:1",
    "part_size": 5 << 20,
}

#: Where each option goes, written out by hand: (loader options, writer options).
EXPECTED = {
    "local": (set(), set()),
    "memory": ({"retry_attempts", "skip_instance_cache"}, set()),
    "s3": (
        {"retry_attempts", "skip_instance_cache", "endpoint_url"},
        {"retry_attempts", "skip_instance_cache", "endpoint_url", "part_size"},
    ),
}


def _toml(options: dict[str, Any]) -> str:
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())


def _url(kind: str, tmp_path: Path) -> str:
    return {
        "local": str(tmp_path / "m.pte"),
        "memory": "memory://routing/m.pte",
        "s3": "s3://bucket/m.pte",
    }[kind]


def test_the_classes_declare_what_they_accept() -> None:
    local = StorageURL.of("/x/m.pte")
    memory = StorageURL.of("memory://x/m.pte")
    assert LocalFileLoader.accepted_options(local) == frozenset() == loader_options(local)
    assert FsspecLoader.options == {"retry_attempts", "retry_initial", "retry_max"}
    assert FsspecLoader.options < loader_options(memory)
    assert LocalFileWriter.options == writer_options(local) == {"durable", "auto_mkdir"}
    assert MemoryWriter.options == writer_options(memory) == {"fs"}


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_front_end_fleet_and_verify_route_alike(kind: str, tmp_path: Path) -> None:
    if kind == "s3":
        pytest.importorskip("s3fs")
    url = _url(kind, tmp_path)
    want_loader, want_writer = EXPECTED[kind]
    expected_loader = {k: OPTIONS[k] for k in want_loader}
    expected_writer = {k: OPTIONS[k] for k in want_writer}
    # The front end: specialize(storage_options=...) hands these to its pair runner.
    front = StorageOptions(OPTIONS)
    assert front.for_loader(url, "src") == expected_loader
    assert front.for_loader(url, "dst") == expected_loader  # the create-mode probe
    assert front.for_writer(url) == expected_writer
    # The fleet: a job's [storage_options] for the pair's reads and its runner.
    job = parse_job(
        f'destination = "{url[:-6]}/{{device}}/{{model}}.pte"\n[storage_options]\n'
        + _toml(OPTIONS)
        + f'[[models]]\nsource = "{url}"\n[devices.d]\n'
    )
    assert job.storage_options == OPTIONS
    assert job.options_for_loader(url) == expected_loader
    fleet = pair_options(url, job.storage_options)
    defaults = {"local": {"auto_mkdir": True}, "memory": {}, "s3": {"spool": False}}[kind]
    assert fleet.for_loader(url, "src") == expected_loader
    assert fleet.for_writer(url) == {**expected_writer, **defaults}
    # verify: the artifact is read as a destination, the source as a source.
    assert options_for_loader(url, OPTIONS, "dst") == expected_loader
    assert options_for_loader(url, OPTIONS, "src") == expected_loader
    assert options_for_writer(url, OPTIONS) == expected_writer


def _memory_source(name: str) -> str:
    assert MLP.pte_path is not None
    fsspec.filesystem("memory").pipe(f"/{name}/src/mlp.pte", MLP.pte_path.read_bytes())
    return f"memory://{name}/src/mlp.pte"


def _job_text(src: str, destination: str, options: dict[str, Any]) -> str:
    lines = _toml(options)
    return (
        f'destination = "{destination}"\nbackends = ["{SPEC}"]\n[storage_options]\n{lines}'
        f'[[models]]\nname = "mlp"\nsource = "{src}"\n[devices.d]\n'
    )


def test_options_each_side_takes_reach_it_in_all_three() -> None:
    """Options that apply to reading and not to writing memory:// (fsspec's own, the
    retry options): the front end, the fleet and verify run through."""
    options = {"retry_attempts": 2, "skip_instance_cache": True}
    src = _memory_source("routing-ok")
    dst = "memory://routing-ok/front/mlp.pte"
    report = ptestore.specialize(
        src, dst, backends=[SPEC], storage_options=options, provenance=True
    )
    assert report.specialized
    job = parse_job(_job_text(src, "memory://routing-ok/fleet/{device}/{model}.pte", options))
    result = run_job(job)
    assert [(p.status, p.error) for p in result.pairs] == [("done", None)]
    fleet_dst = "memory://routing-ok/fleet/d/mlp.pte"
    # verify, with the same options, of both artifacts
    verdict = ptestore.verify(fleet_dst, source=src, backends=[SPEC], storage_options=options)
    assert verdict.status == "current", verdict.message()
    verdict = ptestore.verify(dst, source=src, backends=[SPEC], storage_options=options)
    assert verdict.status == "current", verdict.message()


def test_an_option_no_side_takes_is_refused_alike_by_all_three() -> None:
    """``part_size`` applies to no loader and no writer of memory:// URLs: each of the
    three refuses it with the one message, and nothing is written."""
    options = {"retry_attempts": 2, "part_size": 5 << 20}
    src = _memory_source("routing-bad")
    dst = "memory://routing-bad/front/mlp.pte"
    fleet_dst = "memory://routing-bad/fleet/d/mlp.pte"
    expected = "storage options ['part_size'] apply to none of "
    with pytest.raises(ptestore.ConfigurationError) as info:
        ptestore.specialize(src, dst, backends=[SPEC], storage_options=options)
    assert str(info.value).startswith(f"{expected}{src}, {dst} (accepted: [")
    job = parse_job(_job_text(src, "memory://routing-bad/fleet/{device}/{model}.pte", options))
    # The fleet refuses it once, for the whole job, before any pair (its preflight).
    with pytest.raises(ptestore.ConfigurationError) as info:
        run_job(job)
    assert str(info.value).startswith(
        f"<job>: storage_options: {expected}{src}, {fleet_dst} (accepted: ["
    )
    with pytest.raises(ptestore.ConfigurationError) as info:  # raised, as the others do
        ptestore.verify(dst, source=src, storage_options=options)
    assert str(info.value).startswith(f"{expected}{src}, {dst} (accepted: [")
    fs = fsspec.filesystem("memory")
    assert not fs.exists("/routing-bad/front/mlp.pte")
    assert not fs.exists("/routing-bad/fleet/d/mlp.pte")


def test_options_for_a_run_on_local_files_only_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Local files take no common option: specialize, verify and select (its index
    alone) refuse one given for local files only (the CLI as the library, exit 2),
    before any work; a fleet job that also has a remote pair is checked as a whole and
    its local pairs take none."""
    from ptestore.cli import main

    assert MLP.pte_path is not None
    src, dst = str(MLP.pte_path), str(tmp_path / "o.pte")
    why = "do not apply to local files"
    with pytest.raises(ptestore.ConfigurationError) as info:
        ptestore.specialize(src, dst, backends=[SPEC], storage_options={"anon": True})
    assert str(info.value) == (
        f"storage options ['anon'] {why} ({src}, {dst}): they are for remote URLs "
        "(s3://..., memory://...)"
    )
    argv = ["specialize", src, dst, "--backend", SPEC, "-o", "endpoint_url=http://x"]
    assert main(argv) == 2 and not Path(dst).exists()
    assert f"storage options ['endpoint_url'] {why} ({src}, {dst})" in capsys.readouterr().err
    ptestore.specialize(src, dst, backends=[SPEC])
    with pytest.raises(ptestore.ConfigurationError) as info:
        ptestore.verify(dst, storage_options={"anon": True})
    assert why in str(info.value)
    assert main(["verify", dst, "-o", "anon=true"]) == 2
    assert f"storage options ['anon'] {why} ({dst})" in capsys.readouterr().err
    # a job with a local pair and a remote one: checked as a whole, then pair by pair
    remote = _memory_source("routing-mixed")
    text = _job_text(remote, str(tmp_path / "fleet/{device}/{model}.pte"), {"retry_attempts": 2})
    text += f'[[models]]\nname = "local"\nsource = "{src}"\n'
    job = tmp_path / "job.toml"
    job.write_text(text)
    result = run_job(parse_job(text), workers=1)  # in this process: memory:// is its own
    assert [(p.status, p.error) for p in result.pairs] == [("done", None)] * 2
    assert main(["verify", "--job", str(job)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "fleet/d/local.pte"), "--job", str(job)]) == 0
    index = tmp_path / "fleet" / "ptestore-index.json"
    assert ptestore.select(index, "local", "d").kind == "artifact"
    with pytest.raises(ptestore.ConfigurationError) as info:
        ptestore.select(index, "local", "d", storage_options={"anon": True})
    assert str(info.value) == (
        f"storage options ['anon'] {why} ({index}): they are for remote URLs "
        "(s3://..., memory://...)"
    )
