"""Issue 8, items 4-10: the CLI says what happened, and why, with the right exit status."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendInterface, NotSupported
from ptestore.cli import build_parser, main
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from ptestore.cli.gc import DEFAULT_OLDER_THAN, human_duration, parse_duration
from ptestore.cli.options import human_bytes
from ptestore.cli.progress import Progress, progress_wanted
from ptestore.testing.moto import MotoS3

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
QUANT = get_fixture("quant_xnnpack")
assert MLP.pte_path is not None and EXT.pte_path is not None and EXT.ptd_path is not None
assert QUANT.pte_path is not None
SRC = str(MLP.pte_path)


class Declines(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, writer: Any) -> None:
        raise NotSupported("not this one")


class Divides(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, writer: Any) -> None:
        def deep_inside_the_backend() -> None:
            raise ZeroDivisionError("the backend's own error")

        deep_inside_the_backend()


HERE = f"{__name__}"


# ------------------------------------------------------------------ 4: no silent no-op
def test_nothing_registered_for_the_program_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    assert main(["specialize", SRC, str(dst), "--quiet"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(
        f"ptestore specialize: error: nothing was specialized in {SRC}: no installed backend "
        "serves a backend id of the program. Backend ids in the program: XnnpackBackend. "
        "Installed backends: "
    ), err
    assert "passthrough (ptestore.backends.passthrough:PassthroughBackend" in err
    assert "Nothing was published; --allow-unchanged publishes an unchanged copy." in err
    assert not dst.exists()


def test_a_backend_for_no_id_of_the_program_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    argv = ["specialize", SRC, str(dst), "--backend", "passthrough@NpuBackend"]
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert (
        "the backends given serve no backend id of the program: passthrough@NpuBackend "
        "(serves 'NpuBackend')" in err
    )
    assert "Use SPEC@BACKEND_ID to make a backend serve a given id." in err
    assert not dst.exists()


def test_external_weights_without_their_ptd_hint_at_ptd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    argv = ["specialize", str(EXT.pte_path), str(dst), "--backend", f"{HERE}:Declines"]
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"every backend declined ('XnnpackBackend': {HERE}:Declines declined" in err
    assert "pass it (CLI: --ptd SRC_PTD DST_PTD; Python: ptd=(src, dst))" in err


def test_allow_unchanged_publishes_the_copy_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    # An unchanged copy without provenance is the source byte for byte.
    assert main(["specialize", SRC, str(dst), "--allow-unchanged", "--no-provenance"]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"ptestore specialize: warning: nothing was specialized in {SRC}: "
    )
    assert "unchanged: no installed backend serves a backend id of the program" in captured.out
    assert dst.read_bytes() == MLP.pte_path.read_bytes()  # type: ignore[union-attr]


def test_passthrough_named_explicitly_is_a_deliberate_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    assert main(["specialize", SRC, str(dst), "--backend", "passthrough", "--json"]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == ""
    report = json.loads(captured.out)
    assert report["specialized"] is True
    assert report["unchanged_reason"] is None


# ------------------------------------------------------------------ 5: tracebacks, logs
def test_debug_prints_the_backends_own_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["specialize", SRC, str(tmp_path / "o.pte"), "--backend", f"{HERE}:Divides"]
    assert main(argv) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "ptestore specialize: failed, nothing published: backend 'XnnpackBackend' "
        "(cli.test_cli_ux:Divides): "
        "initialize_backend_data failed: ZeroDivisionError: the backend's own error",
        "ptestore specialize: (--debug prints the full traceback, ZeroDivisionError included)",
    ]
    assert main([*argv, "--debug"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "in deep_inside_the_backend" in err
    assert "ZeroDivisionError: the backend's own error" in err
    assert "The above exception was the direct cause of the following exception" in err
    assert err.rstrip().endswith("ZeroDivisionError: the backend's own error")


def test_every_subcommand_takes_verbose_and_debug() -> None:
    parser = build_parser()
    for argv in (
        ["inspect", "m.pte"],
        ["specialize", "a", "b"],
        ["gc", "."],
        ["backends"],
        ["verify", "a.pte"],
        ["fleet", "run", "job.toml"],
        ["fleet", "plan", "job.toml"],
        ["ensure", "m.pte", "--cache-dir", "c"],
        ["cache", "ls", "--cache-dir", "c"],
        ["select", "i.json", "--model", "m", "--device", "d"],
        ["fetch", "i.json", "out.pte"],
    ):
        ns = parser.parse_args([*argv, "-v", "--debug"])
        assert (ns.verbose, ns.debug) == (1, True), argv
    assert set(parser.commands) == {
        "inspect",
        "specialize",
        "gc",
        "backends",
        "verify",
        "fleet",
        "ensure",
        "cache",
        "select",
        "fetch",
    }


def test_help_is_as_wide_as_argparse_makes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formatter asks os, not shutil, for the width: the same answer as argparse's."""
    import shutil

    from ptestore.cli.parser import HelpFormatter, _terminal_columns

    for columns in ("60", "133", "not a number"):
        monkeypatch.setenv("COLUMNS", columns)
        assert _terminal_columns() == shutil.get_terminal_size().columns
        parser = build_parser("specialize").commands["specialize"]
        width = shutil.get_terminal_size().columns - 2
        explicit = HelpFormatter(parser.prog, width=width)
        assert parser._get_formatter()._width == explicit._width == width
        assert parser.format_help() != ""


def test_the_program_exits_without_a_final_collection_but_runs_exit_handlers(
    tmp_path: Path,
) -> None:
    """``python -m ptestore`` freezes the collector before exiting (no last pass over
    every object): exit handlers a backend registers still run, and the staging file of
    a failed run is gone."""
    (tmp_path / "exiting_backend.py").write_text(
        textwrap.dedent(
            """
            import atexit, gc, pathlib
            from ptestore.backends import BackendInterface

            class AtExit(BackendInterface):
                name = "XnnpackBackend"

                def initialize_backend_data(self, context, output):
                    def note():
                        pathlib.Path("exit-handler-ran").write_text(str(gc.get_freeze_count()))

                    atexit.register(note)
                    raise RuntimeError("this backend fails after registering its handler")
            """
        )
    )
    dst = tmp_path / "out.pte"
    backend = ["--backend", "exiting_backend:AtExit", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "ptestore", "specialize", SRC, str(dst), *backend],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_FAILURE, done.stderr
    assert "this backend fails after registering its handler" in done.stderr
    assert not dst.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # the handler ran at exit, after the collector was frozen (a failed run returns 1
    # from main() like any other: the program then exits the same way)
    assert int((tmp_path / "exit-handler-ran").read_text()) > 0


def test_verbose_logs_decisions_and_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    assert main(["specialize", SRC, str(dst), "--backend", "passthrough", "-q", "-v"]) == 0
    err = capsys.readouterr().err
    assert "ptestore.selection: INFO: backend id 'XnnpackBackend': passthrough" in err
    assert (
        f"ptestore.coordinator: INFO: {dst}: layout: segment base 1536 (was 1536), "
        "0 of 6 segments moved, 6048 bytes"
    ) in err
    assert "ptestore.coordinator: INFO: published in " in err
    assert "DEBUG" not in err
    # The handler is removed after the run: nothing leaks into the next one.
    assert logging.getLogger("ptestore").handlers == []
    assert main(["specialize", SRC, str(dst), "--backend", "passthrough", "-q", "-vv"]) == 0
    assert "ptestore.coordinator: DEBUG: backend ids in " in capsys.readouterr().err


# ------------------------------------------------------------------ 6: storage options
def test_inspect_s3_with_a_misspelt_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("s3fs")
    assert main(["inspect", "s3://bucket/m.pte", "-o", "endpoint=http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "ptestore inspect: error: s3://bucket/m.pte: options ['endpoint'] do not apply to "
        "s3:// (accepted: ["
    ), err
    assert "'endpoint_url'" in err and "'retry_attempts'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["inspect", SRC, "-o", "anon=true"],
            f"ptestore inspect: error: {SRC}: options ['anon'] do not apply to local files",
        ),
        (
            [
                "specialize",
                SRC,
                "memory://clix/o.pte",
                "--backend",
                "passthrough",
                "--src-option",
                "anon=true",
            ],
            f"ptestore specialize: error: {SRC}: options ['anon'] do not apply to local files",
        ),
        (
            [
                "specialize",
                SRC,
                "memory://clix/o.pte",
                "--backend",
                "passthrough",
                "--dst-option",
                "bogus=1",
            ],
            "ptestore specialize: error: memory://clix/o.pte: options ['bogus'] do not apply",
        ),
        (
            ["gc", "s3://bucket/p/", "-o", "bogus=1"],
            "ptestore gc: error: s3://bucket/p/: options ['bogus'] do not apply to gc of s3://",
        ),
    ],
    ids=["inspect-local", "specialize-src", "specialize-dst", "gc-s3"],
)
def test_every_subcommand_checks_options_the_same_way(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "gc":
        pytest.importorskip("s3fs")
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(message), err


def _fleet_job(tmp_path: Path, options: str, models: int = 3, devices: int = 40) -> Path:
    """A job of ``models`` x ``devices`` pairs on s3:// (never opened: the options are
    refused first) with the ``[storage_options]`` lines ``options``."""
    lines = [
        'destination = "s3://bkt/out/{device}/{model}.pte"',
        'backends = ["passthrough"]',
        "[storage_options]",
        options,
    ]
    for i in range(models):
        lines += ["[[models]]", f'name = "m{i}"', f'source = "s3://bkt/src/m{i}.pte"']
    lines += [f"[devices.d{i}]" for i in range(devices)]
    job = tmp_path / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


def test_fleet_misspelt_option_is_named_once_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29, item 18: the refusal names the option once, three of the job's 123 URLs
    and the nearest accepted name (it was a 3.7 KB line listing every URL)."""
    job = _fleet_job(tmp_path, 'endpoint_ulr = "http://127.0.0.1:1"')
    assert main(["fleet", "run", str(job)]) == EXIT_BAD_INPUT
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"ptestore fleet: error: {job}: storage_options: storage options ['endpoint_ulr'] "
        "apply to none of s3://bkt/src/m0.pte, s3://bkt/src/m1.pte, s3://bkt/src/m2.pte "
        "and 120 more URL(s) of the run (did you mean 'endpoint_url'?)"
    )


@pytest.mark.parametrize(
    "argv",
    [["fleet", "plan"], ["fleet", "retire"], ["verify", "--job"], ["gc", "--job"]],
    ids=["plan", "retire", "verify", "gc"],
)
def test_every_job_command_refuses_a_misspelt_job_option(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gc --job`` filtered the job's ``[storage_options]`` to those its target's loader
    takes, silently dropping a misspelt ``endpoint_ulr``: gc then sent its requests to
    AWS. It refuses them now, as ``fleet plan``, ``retire`` and ``verify --job`` do."""
    job = _fleet_job(tmp_path, 'endpoint_ulr = "http://127.0.0.1:1"')
    assert main([*argv, str(job)]) == EXIT_BAD_INPUT
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"ptestore {argv[0]}: error: "), first
    assert "storage options ['endpoint_ulr'] apply to none of s3://bkt/src/m0.pte, " in first
    assert first.endswith("URL(s) of the run (did you mean 'endpoint_url'?)"), first
    if argv[0] == "gc":
        assert first == (
            f"ptestore gc: error: {job}: storage_options: storage options ['endpoint_ulr'] "
            "apply to none of s3://bkt/src/m0.pte, s3://bkt/src/m1.pte, s3://bkt/src/m2.pte "
            "and 121 more URL(s) of the run (did you mean 'endpoint_url'?)"
        )


def test_fleet_options_without_a_near_name_list_the_accepted_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = "s3://bkt/src/m0.pte, s3://bkt/out/d0/m0.pte, s3://bkt/out/d1/m0.pte"
    job = _fleet_job(tmp_path, "bogus = 1\nretry_atempts = 2", models=1, devices=2)
    assert main(["fleet", "run", str(job)]) == EXIT_BAD_INPUT
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"ptestore fleet: error: {job}: storage_options: storage options ['bogus', "
        f"'retry_atempts'] apply to none of {where} (did you mean 'retry_attempts' for "
        "'retry_atempts'?)"
    )
    job = _fleet_job(tmp_path, "bogus = 1", models=1, devices=2)
    assert main(["fleet", "run", str(job)]) == EXIT_BAD_INPUT
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(
        f"ptestore fleet: error: {job}: storage_options: storage options ['bogus'] apply to "
        f"none of {where} (accepted: ["
    ), first
    assert "'endpoint_url'" in first and "'part_size'" in first and first.endswith("])")


def test_dst_option_gives_a_local_destination_its_writers_own_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dst-option`` passes the local writer's own options (``durable``,
    ``auto_mkdir``) to a local destination, as docs/cli.md says (it said local paths
    take none): ``durable=false`` publishes without an fsync. ``-o`` (options for every
    remote URL) and ``--src-option`` still refuse them for local files. With ``--create``
    the destination's probe refused ``durable`` (a read takes no writer option)."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    base = ["specialize", SRC, "--backend", "passthrough", "--no-provenance", "-q"]
    assert main([*base[:2], str(tmp_path / "d.pte"), *base[2:]]) == EXIT_OK
    assert synced  # durable by default: the file and its directory
    synced.clear()
    fast = [*base[:2], str(tmp_path / "f.pte"), *base[2:], "--dst-option", "durable=false"]
    assert main(fast) == EXIT_OK and synced == []
    deep = tmp_path / "new" / "dir" / "c.pte"
    argv = [*base[:2], str(deep), *base[2:], "--create", "--dst-option", "auto_mkdir=true"]
    assert main([*argv, "--dst-option", "durable=false"]) == EXIT_OK and deep.exists()
    assert synced == []
    capsys.readouterr()
    assert main(argv) == EXIT_BAD_INPUT  # --create: it exists now
    assert "already exists (create mode refuses to replace it)" in capsys.readouterr().err
    refused = [
        (["-o", "durable=false"], "storage options ['durable'] do not apply to local files"),
        (["--src-option", "durable=false"], f"{SRC}: options ['durable'] do not apply"),
        (["--dst-option", "part_size=5"], "options ['part_size'] do not apply to local files"),
    ]
    for flags, message in refused:
        assert main([*base[:2], str(tmp_path / "r.pte"), *base[2:], *flags]) == EXIT_BAD_INPUT
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r.pte").exists()
    # A misspelt one is refused naming what the writer accepts, with --create too (the
    # create probe, a read, refused it naming the reader's: "accepted: []").
    r = tmp_path / "r.pte"
    for create in ([], ["--create"]):
        argv = [*base[:2], str(r), *base[2:], *create, "--dst-option", "auto_mkdri=true"]
        assert main(argv) == EXIT_BAD_INPUT
        assert capsys.readouterr().err == (
            f"ptestore specialize: error: {r}: options ['auto_mkdri'] do not apply to local "
            "files (accepted: ['auto_mkdir', 'durable'])\n"
        )
    assert not r.exists()


@pytest.mark.s3
def test_dst_options_reach_the_destination_only(
    moto_s3: MotoS3, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = moto_s3.new_bucket()
    opts = [f"--dst-option={k}={json.dumps(v)}" for k, v in moto_s3.storage_options.items()]
    dst = f"s3://{bucket}/o.pte"
    # A local source refuses every option: they must not reach it.
    argv = ["specialize", SRC, dst, "--backend", "passthrough", "--no-provenance", *opts]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    # The summary shows what the publish returned (issue 8, item 7).
    head = moto_s3.client().head_object(Bucket=bucket, Key="o.pte")
    assert f"  published: 5.9 KiB, etag {head['ETag']}" in out
    described = ptestore.describe(dst, **moto_s3.storage_options)
    assert described["file_size"] == 6048


# ------------------------------------------------------------------ 7: reports
def test_json_failure_prints_an_error_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["specialize", SRC, str(tmp_path / "o.pte"), "--backend", f"{HERE}:Divides", "--json"]
    assert main(argv) == EXIT_FAILURE
    error = json.loads(capsys.readouterr().out)
    assert error == {
        "error": {
            "type": "BackendError",
            # the message as stderr shows it: the backend it names included
            "message": "backend 'XnnpackBackend' (cli.test_cli_ux:Divides): "
            "initialize_backend_data failed: ZeroDivisionError: the backend's own error",
            "exit_code": 1,
            "command": "specialize",
            "backend": "XnnpackBackend",
            "spec": "cli.test_cli_ux:Divides",
            "cause": "ZeroDivisionError: the backend's own error",
            "published": "nothing",
        }
    }
    assert main(["specialize", SRC, str(tmp_path / "o.pte"), "--json"]) == EXIT_BAD_INPUT
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "NothingSpecialized"
    assert error["backend_ids"] == ["XnnpackBackend"]
    assert "passthrough" in " ".join(error["installed"])
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\0\0\0\0NOPE" + b"\0" * 100)
    assert main(["inspect", str(bad), "--json"]) == EXIT_BAD_INPUT
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["type"], error["source"], error["field"]) == (
        "FormatError",
        str(bad),
        "file identifier (bytes 4..8)",
    )
    assert "published" not in error  # inspect publishes nothing


def test_report_names_backends_by_spec_and_shows_the_publish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    spec = "ptestore.backends.passthrough:PassthroughBackend"
    assert main(["specialize", SRC, str(dst), "--backend", spec, "--no-provenance"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"backend XnnpackBackend ({spec}): 1 inputs" in out
    assert "  published: 5.9 KiB" in out
    assert " at 0x" not in out
    assert main(["specialize", SRC, str(dst), "--backend", spec, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["backends"][0]["implementation"] == spec
    # With the provenance trailer (the default) the published size includes it.
    assert report["files"][0]["published_size"] == dst.stat().st_size > 6048


def test_inspect_json_named_data_has_size_and_tensor_info(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["inspect", "--json", str(QUANT.pte_path)]) == EXIT_OK
    rows = json.loads(capsys.readouterr().out)["named_data"]
    assert [r["size"] for r in rows] == [512, 128, 128, 128, 256, 32, 32, 32]
    assert [r["tensor_info"]["dtype"] for r in rows][:3] == [
        "qint8_per_channel",
        "float32",
        "qint32_per_channel",
    ]
    assert rows[0]["tensor_info"]["shape"] == [32, 16]
    assert main(["inspect", str(QUANT.pte_path)]) == EXIT_OK
    table = capsys.readouterr().out
    assert "dtype [shape]" in table
    assert "qint8_per_channel [32x16]" in table


# ------------------------------------------------------------------ 8: progress
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_covers_backends_writing_and_publish_in_binary_units(tmp_path: Path) -> None:
    stream = _Terminal()
    progress = Progress(stream)
    try:
        ptestore.specialize(
            SRC, tmp_path / "o.pte", backends=["passthrough"], event_tracer=progress
        )
    finally:
        progress.close()
    text = stream.getvalue()
    assert "backend XnnpackBackend" in text
    assert "specialized in" in text
    assert "writing" in text
    assert "writing: 5.9 KiB/5.9 KiB 100%|" in text  # the summary's units
    assert "1.2 KiB, specialized in " in text  # the input handed to the backend
    assert "6.0k" not in text  # no decimal units
    assert "publishing..." in text
    assert f"published {tmp_path / 'o.pte'}" in text
    assert human_bytes(6048) == "5.9 KiB"


def test_progress_only_on_a_terminal_and_when_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert progress_wanted(disabled=False, stream=_Terminal())
    assert not progress_wanted(disabled=True, stream=_Terminal())  # --no-progress, -q, --json
    assert not progress_wanted(disabled=False, stream=io.StringIO())  # not a terminal
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not progress_wanted(disabled=False, stream=_Terminal())
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert progress_wanted(disabled=False, stream=_Terminal())
    ns = build_parser().parse_args(["specialize", "a", "b", "--no-progress"])
    assert ns.no_progress is True


# ------------------------------------------------------------------ 9: gc
def test_gc_of_a_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-dir"
    assert main(["gc", str(missing)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"ptestore gc: error: {missing}: no such file or directory\n"


def test_gc_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "30m", "12h", "7d", "1w", "1.5h", "10", "0")] == [
        90.0,
        1800.0,
        43200.0,
        604800.0,
        604800.0,
        5400.0,
        10.0,
        0.0,
    ]
    assert DEFAULT_OLDER_THAN == ptestore.gc.DEFAULT_OLDER_THAN  # type: ignore[attr-defined]
    assert [human_duration(s) for s in (0, 45, 750, 3600, 93600, 8 * 86400 + 5)] == [
        "0s",
        "45s",
        "12m 30s",
        "1h",
        "1d 2h",
        "8d",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("soon", "expected a duration such as 90s, 30m, 12h or 7d"),
        ("5x", "expected a duration such as 90s, 30m, 12h or 7d"),
        ("=-1m", "expected a duration >= 0, got '-1m'"),
        ("nan", "expected a duration such as 90s, 30m, 12h or 7d"),
        ("inf", "expected a duration such as 90s, 30m, 12h or 7d"),
        ("1e999", "expected a finite duration, got '1e999'"),
    ],
)
def test_gc_bad_durations_exit_2(
    text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["gc", ".", f"--older-than={text.lstrip('=')}"])
    assert info.value.code == EXIT_BAD_INPUT
    assert f"ptestore gc: error: argument --older-than: {message}" in capsys.readouterr().err


def test_gc_prints_human_ages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    staging = tmp_path / ".m.pte.ptestore-0123456789abcdef.tmp"
    staging.write_bytes(b"x")
    old = staging.stat().st_mtime - 2 * 86400 - 3 * 3600 - 30
    os.utime(staging, (old, old))
    assert main(["gc", str(tmp_path), "--older-than", "1d", "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "   2d 3h" in out, out
    assert out.endswith("would remove 1 of 1 leftover(s) older than 1d; 0 failed\n")


@pytest.mark.s3
def test_gc_s3_ages_follow_the_servers_clock(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore import gc as gc_module
    from ptestore.writers import open_writer

    bucket = moto_s3.new_bucket()
    w = open_writer(f"s3://{bucket}/p/m.pte", **moto_s3.storage_options)
    w.write(bytes(9 << 20), 0)  # one complete 8 MiB part uploads
    w.wait_uploads()  # type: ignore[attr-defined]
    real = datetime

    class ClientClockTenDaysAhead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real.now(tz) + timedelta(days=10)

    (upload,) = moto_s3.client().list_multipart_uploads(Bucket=bucket)["Uploads"]
    initiated = upload["Initiated"]  # moto reports a fixed date in 2010
    monkeypatch.setattr(gc_module, "datetime", ClientClockTenDaysAhead)
    opts = [f"-o{k}={json.dumps(v)}" for k, v in moto_s3.storage_options.items()]
    try:
        argv = ["gc", f"s3://{bucket}/p/", "--json", "--dry-run", *opts]
        assert main(argv) == EXIT_OK
        (entry,) = json.loads(capsys.readouterr().out)["entries"]
        by_server = (real.now(timezone.utc) - initiated).total_seconds()
        # By the client's clock the upload would be ten days older than by the server's.
        assert abs(entry["age"] - by_server) < 60, (entry["age"], by_server)
        assert entry["action"] == "would remove"
    finally:
        w.discard()


# ------------------------------------------------------------------ 10: discoverability
def test_describe_returns_what_inspect_json_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for path in (MLP.pte_path, EXT.pte_path, EXT.ptd_path):
        assert main(["inspect", "--json", str(path)]) == EXIT_OK
        assert json.loads(capsys.readouterr().out) == json.loads(
            json.dumps(ptestore.describe(path))  # type: ignore[arg-type]
        )


def test_backends_lists_the_installed_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == EXIT_OK
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["passthrough"]["spec"] == "ptestore.backends.passthrough:PassthroughBackend"
    assert rows["passthrough"]["serves"] == "*"
    assert set(rows["passthrough"]) == {"name", "serves", "spec", "origin", "version", "error"}
    assert main(["backends"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "serves", "spec", "origin", "version", "status"]
    assert any(line.startswith("passthrough ") and line.endswith("ok") for line in lines)


def test_backends_exits_1_when_one_cannot_be_loaded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore.backends import InstalledBackend

    broken = InstalledBackend("npu", "*", "npu_pkg:Backend", "entry point", "1.0", "No module")
    monkeypatch.setattr("ptestore.backends.installed_backends", lambda: [broken])
    assert main(["backends"]) == EXIT_FAILURE
    assert "npu_pkg:Backend  entry point  1.0      No module" in capsys.readouterr().out


@pytest.mark.parametrize(
    "function",
    [
        "specialize",
        "initialize_and_save_backend_data",
        "describe",
        "open_loader",
        "open_writer",
        "verify",
    ],
)
def test_public_functions_document_arguments_returns_and_raises(function: str) -> None:
    doc = getattr(ptestore, function).__doc__ or ""
    for section in ("Args:", "Returns:", "Raises:"):
        assert section in doc, (function, section)


def test_every_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """``ptestore COMMAND --help`` (``fleet``'s sub-commands included) ends with examples,
    as cli.md says (the ``fleet`` sub-commands had none)."""
    parser = build_parser()
    commands = [[c] for c in parser.commands]  # every command, new ones too
    (actions,) = [
        a.choices for a in parser.commands["fleet"]._actions if isinstance(a.choices, dict)
    ]
    fleet = [["fleet", action] for action in actions]
    assert len(fleet) == 4, fleet
    for argv in ([], *commands, *fleet):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--help"])
        assert info.value.code == EXIT_OK
        out = capsys.readouterr().out
        assert "examples:\n  ptestore " in out, argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["specialize", "a", "b", "--alow-unchanged"],
            "ptestore specialize: error: unrecognized arguments: --alow-unchanged "
            "(did you mean --allow-unchanged?)",
        ),
        (
            ["inspect", "m.pte", "--jsno"],
            "ptestore inspect: error: unrecognized arguments: --jsno (did you mean --json?)",
        ),
        (["inspcet", "m.pte"], "(did you mean 'inspect'?)"),
        (
            ["fleet", "run", "job.toml", "--worker", "2", "--jsn"],
            "ptestore fleet: error: unrecognized arguments: --jsn (did you mean --json?)",
        ),
        (["fleet", "rnu", "job.toml"], "(did you mean 'run'?)"),
        (
            ["fleet", "plan", "job.toml", "--fail-fast"],
            "ptestore fleet: error: unrecognized arguments: --fail-fast\n",
        ),
        (
            ["fleet", "plan", "job.toml", "--jsn"],
            "ptestore fleet: error: unrecognized arguments: --jsn (did you mean --json?)",
        ),
    ],
)
def test_typos_get_the_nearest_suggestion(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------ issue 9: start-up
def _run(code: str) -> list[str]:
    root = Path(ptestore.__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=root,
        check=True,
    )
    return result.stdout.splitlines()


def test_import_ptestore_loads_only_the_errors() -> None:
    (loaded,) = _run(
        "import sys, ptestore\nprint(sorted(m for m in sys.modules if m.startswith('ptestore')))"
    )
    assert loaded == "['ptestore', 'ptestore.errors']"


def test_help_loads_no_storage_numpy_or_progress_library() -> None:
    lines = _run(
        """
        import sys
        from ptestore.cli import main
        for argv in ([], ["inspect"], ["specialize"], ["gc"], ["backends"], ["verify"],
                     ["fleet"], ["fleet", "run"], ["ensure"], ["cache"]):
            try:
                main([*argv, "--help"])
            except SystemExit:
                pass
        heavy = ("fsspec", "numpy", "tenacity", "s3fs", "tqdm", "importlib.metadata")
        print([m for m in heavy if m in sys.modules])
        """
    )
    assert lines[-1] == "[]"


def test_every_public_name_resolves_lazily() -> None:
    lines = _run(
        """
        import ptestore
        names = [n for n in ptestore.__all__ if getattr(ptestore, n, None) is None]
        print(names)
        print(sorted(set(ptestore.__all__) - set(dir(ptestore))))
        from ptestore import specialize, describe, DataWriter
        print(specialize is ptestore.specialize, describe.__module__, DataWriter.__name__)
        try:
            ptestore.nope
        except AttributeError as exc:
            print(exc)
        """
    )
    assert lines == [
        "[]",
        "[]",
        "True ptestore.inspection DataWriter",
        "module 'ptestore' has no attribute 'nope'",
    ]


def test_a_verdict_piped_away_keeps_its_exit_status(tmp_path: Path) -> None:
    """``verify ... | true``: the reader of stdout went away, and the status is still the
    verdict's (it was 0, the "reader went away" success, for an invalid artifact)."""
    out = tmp_path / "out.pte"
    ptestore.specialize(SRC, out, backends=["passthrough"])
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a byte of a segment: the record no longer matches
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))

    for json_flag in ([], ["--json"]):
        assert _piped_away("verify", str(out), *json_flag).returncode == 0
        done = _piped_away("verify", str(bad), *json_flag)
        assert done.returncode == 2, done.stderr


def _piped_away(*argv: str) -> subprocess.CompletedProcess[str]:
    """``ptestore ARGV`` with a stdout nobody reads: its reader closed before it starts,
    so the first write to stdout fails with EPIPE (no race, no wait)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "ptestore", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


def test_a_json_error_piped_away_keeps_its_exit_status(tmp_path: Path) -> None:
    """``... --json | true`` for a failing command: the error object cannot be written,
    and the status is still the error's (it was 1 after a BrokenPipeError traceback, which
    a script retrying on 1 takes for "rerunning may succeed")."""
    missing = str(tmp_path / "missing.pte")
    out = tmp_path / "out.pte"
    ptestore.specialize(SRC, out, backends=["passthrough"])
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a byte of a segment: the first chunk's digest differs
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))
    for argv, line in [
        (
            ["specialize", missing, str(tmp_path / "o.pte")],
            f"ptestore specialize: error: {missing}: no such file",
        ),
        (["inspect", missing], f"ptestore inspect: error: {missing}: no such file"),
        (
            ["verify", str(bad), "--range", "0:100"],  # a verdict, its status kept too
            f"{bad}: invalid: {bad}: content.chunks[0] = ",
        ),
    ]:
        done = _piped_away(*argv, "--json")
        assert done.returncode == EXIT_BAD_INPUT, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(line), done.stderr


def test_a_long_local_path_is_shown_whole_on_the_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error line is one line, yet a path given (up to PATH_MAX) is not cut: a
    345-character path lost its end, the file name that says which file failed, when
    every run over 300 characters was cut."""
    deep = tmp_path.joinpath(*["d" * 60] * 5)
    deep.mkdir(parents=True)
    missing = deep / "important-model-v2.pte"
    assert len(str(missing)) > 303
    assert main(["inspect", str(missing)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ptestore inspect: error: ")
    assert f"{missing}: " in err[0]
