"""Storage options given to a command that reads a fleet index (``select``, ``fetch
INDEX``, ``ensure INDEX``, ``fleet check-index``, ``fleet retire``) are checked by the
one check (``StorageOptions.check``) before the index is read: one that applies to none
of the index (as it is read, and written with ``--repair``) is refused, exit 2, with the
nearest accepted name; any, for a local index that only that index is read of. ``fetch``
and ``ensure`` also give them to the files the index names: a local index's options are
checked against those once it is read (unused when they are all local). The options the
index store passes on still work (memory's ``fs``; S3's in the moto/SeaweedFS tests)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.cli import main
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from ptestore.errors import ConfigurationError
from ptestore.fleet import parse_job, run_job
from ptestore.fleet.index import iter_entries, publish_entries
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_store import check_index_options

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"
TYPO = "storage options ['retry_atempts'] apply to none of {} (did you mean 'retry_attempts'?)"
LOCAL = "storage options ['{}'] do not apply to local files ({}): they are for remote URLs"


def _job_text(root: str, options: str = "") -> str:
    assert MLP.pte_path is not None
    fsspec.filesystem("memory").pipe(f"/{root}/src/mlp.pte", MLP.pte_path.read_bytes())
    return (
        f'destination = "memory://{root}/fleet/{{device}}/{{model}}.pte"\n'
        f'backends = ["{SPEC}"]\n[storage_options]\n{options}'
        f'[[models]]\nname = "mlp"\nsource = "memory://{root}/src/mlp.pte"\n[devices.d]\n'
    )


@pytest.fixture
def memory_fleet() -> str:
    """A fleet run in this process (memory:// is its own): the index's URL."""
    root = f"opts-{uuid.uuid4().hex[:8]}"
    result = run_job(parse_job(_job_text(root)), workers=1)
    assert [(p.status, p.error) for p in result.pairs] == [("done", None)]
    return f"memory://{root}/fleet/ptestore-index.json"


@pytest.fixture
def local_index(memory_fleet: str, tmp_path: Path) -> str:
    """A local index whose entry names the memory:// artifact of ``memory_fleet``."""
    index = str(tmp_path / "idx" / "ptestore-index.json")
    publish_entries(index, list(iter_entries(memory_fleet)), {})
    return index


def _argv(command: str, index: str, tmp_path: Path) -> list[str]:
    pair = ["--model", "mlp", "--device", "d"]
    return {
        "select": ["select", index, *pair],
        "fetch": ["fetch", index, str(tmp_path / "dl" / "m.pte"), *pair],
        "ensure": ["ensure", index, "--cache-dir", str(tmp_path / "cache"), *pair],
        "check-index": ["fleet", "check-index", index],
        "check-index --repair": ["fleet", "check-index", index, "--repair"],
    }[command]


COMMANDS = ["select", "fetch", "ensure", "check-index", "check-index --repair"]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    return err.splitlines()[0]


def _name(argv: list[str]) -> str:
    return "fleet" if argv[0] == "fleet" else argv[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_option_a_memory_index_does_not_take_is_refused_before_it_is_read(
    command: str, memory_fleet: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bogus_option`` and a misspelt option on a memory:// index: exit 2 with the
    shared check's message (they were dropped and the command exited 0); the same
    message for an index that is not there: the check comes before the read."""
    for index in (memory_fleet, "memory://opts-none/fleet/ptestore-index.json"):
        argv = _argv(command, index, tmp_path)
        first = _refused([*argv, "-o", "retry_atempts=2"], capsys)
        assert first == f"ptestore {_name(argv)}: error: {TYPO.format(index)}"
    argv = _argv(command, memory_fleet, tmp_path)
    first = _refused([*argv, "-o", "bogus_option=1"], capsys)
    assert first.startswith(
        f"ptestore {_name(argv)}: error: storage options ['bogus_option'] apply to none of "
        f"{memory_fleet} (accepted: ['fs', "
    ), first
    assert not (tmp_path / "dl").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_misspelt_option_for_an_s3_index_names_the_accepted_one(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o endpoint_ulr=...`` was dropped by the index store's routing and the index
    read from AWS's endpoint ("Unable to locate credentials"): now refused first (no
    server is needed: nothing is read)."""
    pytest.importorskip("s3fs")
    index = "s3://bkt/fleet/ptestore-index.json"
    argv = _argv(command, index, tmp_path)
    first = _refused([*argv, "-o", "endpoint_ulr=http://127.0.0.1:1"], capsys)
    assert first == (
        f"ptestore {_name(argv)}: error: storage options ['endpoint_ulr'] apply to none of "
        f"{index} (did you mean 'endpoint_url'?)"
    )


def test_the_index_is_read_and_written_as_the_store_does() -> None:
    """What the index store passes on is accepted: S3 reads take the loader's options,
    a write (``check-index --repair``) the writer's too; memory:// is read through its
    writer's store (``fs``)."""
    pytest.importorskip("s3fs")
    s3 = "s3://bkt/fleet/ptestore-index.json"
    check_index_options({"endpoint_url": "http://h", "key": "k", "secret": "s"}, s3)
    check_index_options({"client_kwargs": {"region_name": "us-east-1"}}, s3)
    check_index_options({"part_size": 5 << 20}, s3, write=True)
    with pytest.raises(ConfigurationError) as info:
        check_index_options({"part_size": 5 << 20}, s3)  # a read: no writer
    assert str(info.value).startswith(f"storage options ['part_size'] apply to none of {s3}")
    check_index_options({"fs": object()}, "memory://x/ptestore-index.json")


def test_options_the_memory_index_store_takes_still_work(memory_fleet: str) -> None:
    """The writer's ``fs`` (the store a memory:// index is read from) and the loader's
    retry options are not refused by select, check-index and fetch."""
    fs = fsspec.filesystem("memory")
    choice = ptestore.select(memory_fleet, "mlp", "d", storage_options={"fs": fs})
    assert choice.kind == "artifact"
    again = ptestore.select(memory_fleet, "mlp", "d", storage_options={"retry_attempts": 2})
    assert again.pte == choice.pte
    assert check_index(memory_fleet, {"fs": fs}, repair=True).ok


@pytest.mark.parametrize("command", ["select", "check-index", "check-index --repair"])
def test_options_for_a_local_index_alone_are_refused(
    command: str, local_index: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """select and check-index read the index only: any option for a local one is
    refused by the shared check (select had a check of its own, check-index none)."""
    argv = _argv(command, local_index, tmp_path)
    first = _refused([*argv, "-o", "anon=true"], capsys)
    assert first == f"ptestore {_name(argv)}: error: {LOCAL.format('anon', local_index)} " + (
        "(s3://..., memory://...)"
    )


@pytest.mark.parametrize("command", ["fetch", "ensure"])
def test_a_local_index_gives_its_options_to_the_files_it_names(
    command: str, local_index: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fetch and ensure from a local index naming memory:// files: an option for those
    reaches them (it was refused: select refused any option for a local index); a
    misspelt one is named, with the files, once the index is read and before they are."""
    argv = _argv(command, local_index, tmp_path)
    files = next(iter(iter_entries(local_index)))
    named = ", ".join(u for u in (files["pte"]["url"], (files.get("ptd") or {}).get("url")) if u)
    first = _refused([*argv, "-o", "retry_atempts=2"], capsys)
    assert first == (
        f"ptestore {command}: error: {local_index}: the files it names: {TYPO.format(named)}"
    )
    assert not (tmp_path / "dl").exists()
    assert main([*argv, "-o", "retry_attempts=2", "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    made = Path(out["pte"] if command == "ensure" else out["files"][0]["path"])
    assert made.read_bytes() == fsspec.filesystem("memory").cat(files["pte"]["url"])


def test_a_local_index_naming_local_files_leaves_options_unused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As cache prune --stale: the files a local index names may be remote on another
    run, so options none of them can take are left unused, not refused."""
    assert MLP.pte_path is not None
    text = (
        f'destination = "{tmp_path}/fleet/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n[devices.d]\n'
    )
    assert [p.status for p in run_job(parse_job(text), workers=1).pairs] == ["done"]
    index = str(tmp_path / "fleet" / "ptestore-index.json")
    dest = tmp_path / "dl" / "m.pte"
    result = ptestore.fetch(index, dest, model="mlp", device="d", storage_options={"anon": True})
    assert result.files and dest.is_file()


def test_fetch_of_a_url_checks_its_options_against_it(
    memory_fleet: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fetch URL DEST (no index): the shared check against the URL, DEST and the bases;
    options for a local URL refused, as specialize refuses them."""
    url = memory_fleet.replace("ptestore-index.json", "d/mlp.pte")
    dest = str(tmp_path / "dl" / "m.pte")
    first = _refused(["fetch", url, dest, "-o", "retry_atempts=2"], capsys)
    assert first == f"ptestore fetch: error: {TYPO.format(url)}"
    assert main(["fetch", url, dest, "-o", "retry_attempts=2"]) == EXIT_OK
    capsys.readouterr()
    first = _refused(["fetch", dest, str(tmp_path / "again.pte"), "-o", "anon=true"], capsys)
    pair = f"{dest}, {tmp_path / 'again.pte'}"
    assert first == f"ptestore fetch: error: {LOCAL.format('anon', pair)} (s3://..., memory://...)"


def test_select_refuses_options_with_an_index_object(memory_fleet: str) -> None:
    whole = {"entries": list(iter_entries(memory_fleet))}
    assert ptestore.select(whole, "mlp", "d").kind == "artifact"
    with pytest.raises(ConfigurationError) as info:
        ptestore.select(whole, "mlp", "d", storage_options={"retry_attempts": 2})
    assert str(info.value) == (
        "storage options ['retry_attempts'] apply to no URL: the index was given as an "
        "object, not read"
    )


def test_retire_checks_the_job_options_as_fleet_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fleet retire reads and writes the job's index with the job file's options: one
    no URL of the job (nor its index) takes is refused before the index is read."""
    root = f"opts-{uuid.uuid4().hex[:8]}"
    job = tmp_path / "job.toml"
    job.write_text(_job_text(root, "retry_atempts = 2\n"))
    where = (
        f"memory://{root}/src/mlp.pte, memory://{root}/fleet/d/mlp.pte, "
        f"memory://{root}/fleet/ptestore-index.json"
    )
    first = _refused(["fleet", "retire", str(job)], capsys)
    assert first == f"ptestore fleet: error: {job}: storage_options: {TYPO.format(where)}"
    job.write_text(_job_text(root, "retry_attempts = 2\n"))
    assert main(["fleet", "retire", str(job)]) == EXIT_OK
    assert f"no index at memory://{root}/fleet/ptestore-index.json" in capsys.readouterr().out
