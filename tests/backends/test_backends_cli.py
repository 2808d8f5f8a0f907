"""Backend registry and SPEC grammar, the command backend, and the CLI."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import all_fixtures, get_fixture

import ptestore
from ptestore import errors
from ptestore.backends import (
    BackendInterface,
    load_backend,
    register_backend,
    registered_backends,
    unregister_backend,
)
from ptestore.backends.command import CommandBackend
from ptestore.backends.passthrough import PassthroughBackend
from ptestore.cli import main
from ptestore.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    guarded,
)
from ptestore.cli.options import human_bytes, parse_storage_option
from ptestore.errors import BackendError, ConfigurationError, PteStoreError
from ptestore.format import parse
from ptestore.inspection import describe

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
KEYS = [e["key"] for e in MLP.facts["pte"]["named_data"]]


class Named(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, arg: str | None = None) -> None:
        self.arg = arg


# ------------------------------------------------------------------ registry
def test_register_and_load_by_name() -> None:
    register_backend(Named, "test-named")
    try:
        b = load_backend("test-named")
        assert isinstance(b, Named)
        assert b.name == "XnnpackBackend"
        b = load_backend("test-named@OtherBackend=hello world")
        assert (b.name, b.arg) == ("OtherBackend", "hello world")
        with pytest.raises(ConfigurationError, match=r"'test-named' is already registered"):
            register_backend(PassthroughBackend, "test-named")
        register_backend(PassthroughBackend, "test-named", replace=True)
        assert isinstance(load_backend("test-named"), PassthroughBackend)
    finally:
        unregister_backend("test-named")


def test_registered_instance_is_never_renamed() -> None:
    instance = PassthroughBackend()
    register_backend(instance, "test-instance")
    try:
        renamed = load_backend("test-instance@XnnpackBackend")
        assert renamed.name == "XnnpackBackend"
        assert instance.name == "*"
    finally:
        unregister_backend("test-instance")


def test_entry_points_and_import_paths() -> None:
    assert {"passthrough", "command"} <= set(registered_backends())
    assert isinstance(load_backend("passthrough"), PassthroughBackend)
    b = load_backend("ptestore.backends.command:CommandBackend=cat")
    assert isinstance(b, CommandBackend)
    assert b.argv == ["cat"]


def test_the_builtin_names_are_the_entry_points_ptestore_declares() -> None:
    import tomllib

    from ptestore.backends.registry import BUILTIN_BACKENDS

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["ptestore.backends"] == dict(BUILTIN_BACKENDS)
    declared = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="ptestore.backends")
        if ep.dist is not None and ep.dist.name == "ptestore"
    }
    assert declared == dict(BUILTIN_BACKENDS)


def test_a_builtin_name_resolves_without_reading_metadata_and_cannot_be_shadowed(
    tmp_path: Path,
) -> None:
    """``passthrough`` loads without :mod:`importlib.metadata`; another distribution's
    entry point of the same name neither replaces it nor is imported: it is listed
    beside it with why it is not used (it was dropped silently)."""
    info = tmp_path / "shadow-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ptestore.backends]\npassthrough = shadow_mod:Evil\n")
    (tmp_path / "shadow_mod.py").write_text("raise SystemExit('shadow imported')\n")
    probe = textwrap.dedent(
        """
        import json, sys
        from ptestore.backends import load_backend
        from ptestore.backends.passthrough import PassthroughBackend
        ok = isinstance(load_backend("passthrough"), PassthroughBackend)
        read = "importlib.metadata" in sys.modules
        from ptestore.backends.registry import installed_backends
        listed = [[b.spec, b.error] for b in installed_backends() if b.name == "passthrough"]
        print(json.dumps({"ok": ok, "metadata": read, "listed": listed}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "ok": True,
        "metadata": False,
        "listed": [
            ["ptestore.backends.passthrough:PassthroughBackend", None],
            [
                "shadow_mod:Evil",
                "the name 'passthrough' is ptestore's built-in backend "
                "(ptestore.backends.passthrough:PassthroughBackend), which keeps it: this "
                "entry point of shadow 1.0 (shadow_mod:Evil) is not used; give it by its "
                "import path (shadow_mod:Evil) or declare it under another name",
            ],
        ],
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", r"backend 'nosuch': unknown name 'nosuch'; known: .*command.*passthrough.*"),
        ("no.such.module:X", r"backend 'no.such.module:X': cannot import 'no.such.module': .*"),
        (  # was a BackendError (exit 1): import_module's TypeError blamed the backend
            ".good:NegateTwice",
            r"backend '\.good:NegateTwice': '\.good' is a relative module name; give the "
            r"absolute one \(package\.module:attr\), importable from sys\.path",
        ),
        (
            "ptestore.backends:Nope",
            r"backend 'ptestore.backends:Nope': module 'ptestore.backends' "
            r"has no attribute 'Nope'",
        ),
        ("passthrough@", r"backend 'passthrough@': empty backend id after '@'"),
        (
            "ptestore.errors:PteStoreError",
            r"backend 'ptestore.errors:PteStoreError': .* returned "
            r"PteStoreError, not a BackendInterface",
        ),
        ("command", r"the command backend needs a program: .*"),
        ("", r"backend spec must be a non-empty string, got ''"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_backend(spec)
    assert re.fullmatch(message, str(info.value)), str(info.value)


def test_register_needs_a_name() -> None:
    with pytest.raises(ConfigurationError, match="a name is required"):
        register_backend(PassthroughBackend)


def test_two_implementations_for_one_id_are_refused(tmp_path: Path) -> None:
    import ptestore

    assert MLP.pte_path is not None
    with pytest.raises(ConfigurationError, match="two implementations given for backend id"):
        ptestore.specialize(MLP.pte_path, tmp_path / "o.pte", backends=[Named(), Named()])
    with pytest.raises(ConfigurationError, match="two generic backends given"):
        ptestore.specialize(
            MLP.pte_path, tmp_path / "o.pte", backends=["passthrough", "passthrough"]
        )


# ------------------------------------------------------------------ command backend
SCRIPT = textwrap.dedent(
    """
    import os, sys
    data = sys.stdin.buffer.read()
    kind = os.environ["PTESTORE_KIND"]
    assert os.environ["PTESTORE_BACKEND_ID"] == "XnnpackBackend"
    assert int(os.environ["PTESTORE_SIZE"]) == len(data)
    if kind == "processed":
        assert os.environ["PTESTORE_METHOD"] == "forward"
        sys.stdout.buffer.write(data + b"PTESTORE")
    elif os.environ["PTESTORE_KEY"] == os.environ["WANT_KEY"]:
        if os.environ.get("FAIL"):
            sys.stderr.write("vendor compiler: unsupported op\\n")
            sys.exit(3)
        sys.stdout.buffer.write(bytes(reversed(data)))
    """
)


def test_command_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ptestore

    assert MLP.pte_path is not None
    script = tmp_path / "compile.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("WANT_KEY", KEYS[1])
    spec = f"command@XnnpackBackend={sys.executable} {script}"
    report = ptestore.specialize(MLP.pte_path, tmp_path / "o.pte", backends=[spec])
    assert report.backends[0].keys_replaced == [KEYS[1]]
    assert report.backends[0].blobs_replaced == 1
    out = (tmp_path / "o.pte").read_bytes()
    c = parse(out, len(out), "o")
    orig = MLP.pte_path.read_bytes()
    c0 = parse(orig, len(orig), "i")

    def seg(data: bytes, cc: Any, i: int) -> bytes:
        s = cc.segments[i]
        return data[cc.segment_base_offset + s.offset :][: s.size]

    assert seg(out, c, 1) == seg(orig, c0, 1) + b"PTESTORE"
    assert seg(out, c, 3) == bytes(reversed(seg(orig, c0, 3)))

    monkeypatch.setenv("FAIL", "1")
    dst = tmp_path / "o2.pte"
    with pytest.raises(BackendError) as info:
        ptestore.specialize(MLP.pte_path, dst, backends=[spec])
    assert re.fullmatch(
        # Named by its id and spec, as every error of a run names a backend.
        rf"backend 'XnnpackBackend' \({re.escape(spec)}\), key '{KEYS[1]}': command "
        rf"'.*compile.py' exited with "
        rf"status 3 on key '{KEYS[1]}': vendor compiler: unsupported op",
        str(info.value),
    ), str(info.value)
    assert not dst.exists()


def test_command_backend_missing_program(tmp_path: Path) -> None:
    import ptestore

    assert MLP.pte_path is not None
    with pytest.raises(BackendError, match=r"command 'no-such-program-ptestore' not found"):
        ptestore.specialize(
            MLP.pte_path, tmp_path / "o.pte", backends=["command=no-such-program-ptestore"]
        )
    assert not (tmp_path / "o.pte").exists()


# ------------------------------------------------------------------ CLI
@pytest.mark.parametrize("fx", all_fixtures(), ids=lambda f: f.name)
def test_inspect_json(fx: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for role, path in (("pte", fx.pte_path), ("ptd", fx.ptd_path)):
        if path is None:
            continue
        assert main(["inspect", "--json", str(path)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out == json.loads(json.dumps(ptestore.describe(path)))
        data = path.read_bytes()
        bare = describe(parse(data, len(data), str(path)))  # metadata alone: no tensor info
        assert [{**r, "tensor_info": None} for r in out["named_data"]] == bare["named_data"]
        for k in ("format", "file_size", "header", "methods", "delegates"):
            assert out[k] == fx.facts[role][k]
        keep = ("key", "segment_index", "tensor_layout")
        assert [{k: r[k] for k in keep if k in r} for r in out["named_data"]] == (
            fx.facts[role]["named_data"]
        )


def test_inspect_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert MLP.pte_path is not None
    assert main(["inspect", str(MLP.pte_path)]) == 0
    text = capsys.readouterr().out
    for needle in ("XnnpackBackend", "segments (6)", "named data (4)", "waste:", "align"):
        assert needle in text


def test_inspect_malformed_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\0\0\0\0NOPE" + b"\0" * 100)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: file identifier (bytes 4..8) = b'NOPE'" in err
    assert main(["inspect", str(tmp_path / "missing.pte")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_specialize_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert MLP.pte_path is not None
    dst = tmp_path / "o.pte"
    assert (
        main(
            [
                "specialize",
                str(MLP.pte_path),
                str(dst),
                "--backend",
                "passthrough",
                "--json",
                "--no-provenance",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["backends"][0]["status"] == "specialized"
    assert dst.read_bytes() == MLP.pte_path.read_bytes()
    # --create over an existing file: bad input (rerunning cannot help), exit 2, unchanged.
    assert main(["specialize", str(MLP.pte_path), str(dst), "--create", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore specialize: error: {dst}"), err
    assert "already exists" in err.lower()
    # Summary on stdout by default.
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "passthrough"]) == 0
    assert "backend XnnpackBackend (passthrough): 1 inputs" in capsys.readouterr().out
    # Bad input: exit 2.
    assert main(["specialize", str(tmp_path / "nope.pte"), str(dst)]) == 2
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "nosuch"]) == 2
    # Backend failure: exit 1, the destination as it was.
    before = dst.read_bytes()
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "command=false"]) == 1
    assert "nothing published" in capsys.readouterr().err
    assert dst.read_bytes() == before


# ------------------------------------------------------------------ exit codes, one mapping
def _raising(exc: BaseException) -> Any:
    def run(args: argparse.Namespace) -> int:
        raise exc

    return run


MAPPINGS: list[tuple[BaseException, bool, int, str]] = [
    # (error, publishes, exit code, the line on stderr)
    (
        errors.FormatError("m.pte", "header.length", 3, ">= 24"),
        True,
        EXIT_BAD_INPUT,
        "ptestore x: error: m.pte: header.length = 3: must be >= 24",
    ),
    (
        errors.ConfigurationError("bad option"),
        True,
        EXIT_BAD_INPUT,
        "ptestore x: error: bad option",
    ),
    (
        errors.ObjectNotFound("m.pte: no such file"),
        True,
        EXIT_BAD_INPUT,
        "ptestore x: error: m.pte: no such file",
    ),
    (
        errors.AlreadyExists("o.pte: already exists"),
        True,
        EXIT_BAD_INPUT,
        "ptestore x: error: o.pte: already exists",
    ),
    (
        errors.PermissionDenied("s3://b/k: AccessDenied (403)"),
        True,
        EXIT_BAD_INPUT,
        "ptestore x: error: s3://b/k: AccessDenied (403)",
    ),
    (
        errors.StorageError("s3://b/k: timed out"),
        True,
        EXIT_FAILURE,
        "ptestore x: failed, nothing published: s3://b/k: timed out",
    ),
    (
        errors.StorageError("s3://b/k: timed out"),
        False,
        EXIT_FAILURE,
        "ptestore x: error: s3://b/k: timed out",
    ),
    (
        BackendError("exited with status 3", backend="XnnpackBackend"),
        True,
        EXIT_FAILURE,
        "ptestore x: failed, nothing published: backend 'XnnpackBackend': exited with status 3",
    ),
    (
        errors.InvalidReplacement("unknown key 'w'"),
        True,
        EXIT_FAILURE,
        "ptestore x: failed, nothing published: unknown key 'w'",
    ),
    (
        errors.PartialPublish("o.pte published, o.ptd not"),
        True,
        EXIT_FAILURE,
        "ptestore x: failed after a partial publish: o.pte published, o.ptd not",
    ),
    (
        errors.PublishUncertain("lost response"),
        True,
        EXIT_FAILURE,
        "ptestore x: publish uncertain (it may or may not have taken effect): lost response",
    ),
    (
        errors.IntegrityError("s3://b/k: 5 bytes, 6 written"),
        True,
        EXIT_FAILURE,
        "ptestore x: failed after publishing: s3://b/k: 5 bytes, 6 written",
    ),
    (
        OSError(28, "No space left on device"),
        False,
        EXIT_FAILURE,
        "ptestore x: error: [Errno 28] No space left on device",
    ),
    (KeyboardInterrupt(), True, EXIT_INTERRUPTED, "ptestore x: interrupted; nothing was published"),
    (KeyboardInterrupt(), False, EXIT_INTERRUPTED, "ptestore x: interrupted"),
    (
        KeyboardInterrupt("after out.pte was published"),
        True,
        EXIT_INTERRUPTED,
        "ptestore x: interrupted after out.pte was published",
    ),
]


@pytest.mark.parametrize(
    ("exc", "publishes", "code", "message"),
    MAPPINGS,
    ids=[f"{type(m[0]).__name__}-{'publishes' if m[1] else 'reads'}" for m in MAPPINGS],
)
def test_exit_code_mapping(
    exc: BaseException,
    publishes: bool,
    code: int,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = guarded("x", publishes=publishes)(_raising(exc))
    assert run(argparse.Namespace()) == code
    captured = capsys.readouterr()
    assert captured.err == message + "\n"
    assert captured.out == ""


def test_an_error_line_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name with an escape sequence or a carriage return (a file's, or a path given)
    is printed escaped in the error line: it cannot clear the screen or overwrite the
    line. The error is one line: a line break in it is escaped too (one in a name, an
    index's URL, started a forged line), and a run longer than any local path (4096
    characters) cut."""
    from ptestore.cli import main

    name = tmp_path / "m\x1b[2J\r.pte"
    assert main(["inspect", str(name)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    shown = f"{tmp_path}/m\\x1b[2J\\r.pte"
    assert err.splitlines()[0] == f"ptestore inspect: error: {shown}: no such file"
    assert "\x1b" not in err and "\r" not in err
    run = guarded("x")(_raising(PteStoreError("first line\nsecond \x07line")))
    assert run(argparse.Namespace()) == EXIT_FAILURE
    assert capsys.readouterr().err == "ptestore x: error: first line\\nsecond \\x07line\n"
    long = "/tmp/" + "a" * 3_000_000
    run = guarded("x")(_raising(PteStoreError(f"{long}: no such file")))
    assert run(argparse.Namespace()) == EXIT_FAILURE
    assert capsys.readouterr().err == (
        f"ptestore x: error: {long[:4096]}... (3000005 characters): no such file\n"
    )


def test_a_name_in_a_report_line_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL or path given, in verify's verdict lines (intact, current, stale,
    invalid, a --range), inspect's first report line (and --compare's) and fetch's
    summary, is printed escaped as the error line prints it (it was printed raw: an
    escape sequence in a file name cleared the screen)."""
    name = tmp_path / "a\x1b[2Jb.pte"
    spec = "passthrough@XnnpackBackend"
    ptestore.specialize(MLP.pte_path, name, backends=[spec], allow_unchanged=True)
    shown = f"{tmp_path}/a\\x1b[2Jb.pte"
    printed: list[str] = []

    def said(argv: list[str], code: int) -> str:
        assert main(argv) == code
        out, err = capsys.readouterr()
        printed.append(out + err)
        return out + err

    assert said(["verify", str(name)], 0).startswith(f"{shown}: intact; nothing to compare")
    assert said(["verify", str(name), "--backend", spec], 0) == f"{shown}: current\n"
    assert said(["verify", str(name), "--device", "x"], 1).startswith(
        f"{shown}: stale: device.name: "
    )
    assert said(["verify", str(name), "--range", "0:100"], 0).startswith(f"{shown}: bytes 0:")
    damaged = tmp_path / "d\x1b[2J.pte"
    data = bytearray(name.read_bytes())
    data[8] ^= 0xFF  # the FlatBuffer's identifier: not a .pte any more
    damaged.write_bytes(bytes(data))
    assert said(["verify", str(damaged)], 2).startswith(f"{tmp_path}/d\\x1b[2J.pte: invalid: ")
    assert said(["inspect", str(name)], 0).startswith(f"{shown}: .pte (ExecuTorch Program), ")
    assert said(["inspect", str(name), "--compare", str(MLP.pte_path)], 0).startswith(
        f"{shown} compared with its source {MLP.pte_path}\n"
    )
    dest = tmp_path / "f\x1b[2J.pte"
    assert f"{shown} -> {tmp_path}/f\\x1b[2J.pte: " in said(["fetch", str(name), str(dest)], 0)
    assert dest.read_bytes() == name.read_bytes()
    assert not [text for text in printed if "\x1b" in text], printed


def test_specialize_and_gc_report_lines_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specialize``'s summary (``pte: SRC -> DST``) and ``gc``'s listing printed the
    names raw: an escape sequence in a file name cleared the screen, a carriage return
    overwrote the line. They are escaped now, as verify's and inspect's lines are."""
    import os

    from ptestore.cli import main

    src = tmp_path / "s\x1b[2J\r.pte"
    src.write_bytes(MLP.pte_path.read_bytes())
    dst = tmp_path / "o\x1b[2J\r.pte"
    argv = ["specialize", str(src), str(dst), "--backend", "passthrough@XnnpackBackend"]
    assert main([*argv, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"pte: {tmp_path}/s\\x1b[2J\\r.pte -> {tmp_path}/o\\x1b[2J\\r.pte: "), out
    assert "\x1b" not in out + err and "\r" not in out + err
    staging = tmp_path / ".o\x1b[2J\r.pte.ptestore-0123456789abcdef.tmp"
    staging.write_bytes(b"x")
    old = staging.stat().st_mtime - 86400
    os.utime(staging, (old, old))
    assert main(["gc", str(tmp_path), "--older-than", "1h", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].endswith(
        f"  {tmp_path}/.o\\x1b[2J\\r.pte.ptestore-0123456789abcdef.tmp"
    ), out
    assert "\x1b" not in out + err and "\r" not in out + err


def test_warnings_of_a_command_cannot_drive_the_terminal(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """While a command runs, a warning's string and exception arguments are escaped
    (ptestore._log); with -v every record is (the handler's formatter); the library
    outside a command leaves them as they are."""
    import logging

    from ptestore._log import get_logger

    hostile = "s3://b/k\x1b[2J\rforged"

    shown: list[str] = []

    class Costly(Exception):
        def __str__(self) -> str:
            shown.append("str")
            return "costly"

    def run(args: argparse.Namespace) -> int:
        logging.getLogger("ptestore.test").setLevel(logging.INFO)
        get_logger("ptestore.test").debug("%s", Costly())  # dropped: never formatted
        get_logger("ptestore.test").warning("%s: %s", hostile, PteStoreError("why\x07"))
        logging.getLogger("ptestore.test.plain").warning("plain %s", hostile)
        return 0

    caplog.set_level(logging.WARNING, logger="ptestore")
    assert guarded("x")(run)(argparse.Namespace(verbose=1)) == 0
    err = capsys.readouterr().err
    assert "ptestore.test: WARNING: s3://b/k\\x1b[2J\\rforged: why\\x07" in err
    assert "ptestore.test.plain: WARNING: plain s3://b/k\\x1b[2J\\rforged" in err
    assert "\x1b" not in err and "\r" not in err and "\x07" not in err
    # the arguments themselves (what any handler gets), not only the CLI's formatter
    mine = [r.getMessage() for r in caplog.records if r.name == "ptestore.test"]
    assert mine == ["s3://b/k\\x1b[2J\\rforged: why\\x07"]
    assert shown == []  # logging stays lazy: a record dropped is never formatted
    logging.getLogger("ptestore.test").setLevel(logging.NOTSET)
    caplog.clear()
    get_logger("ptestore.test").warning("%s", hostile)  # not in a command: as it is
    assert caplog.records[-1].getMessage() == hostile


def test_exit_codes_are_the_documented_numbers() -> None:
    assert (EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED) == (0, 1, 2, 130)


def test_errors_not_ours_propagate() -> None:
    run = guarded("x")(_raising(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        run(argparse.Namespace())


def test_a_broken_pipe_that_is_not_stdouts_is_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ``BrokenPipeError`` of a socket or a backend's pipe, stdout's reader still
    there, is a failure (it exited 0, the "reader of stdout went away" success); the
    reader of stdout gone is tests/cli/test_streams.py's."""
    run = guarded("x")(_raising(BrokenPipeError(32, "Broken pipe")))
    assert run(argparse.Namespace()) == EXIT_FAILURE
    assert capsys.readouterr().err == "ptestore x: error: [Errno 32] Broken pipe\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["specialize", "a.pte"],
            "ptestore specialize: error: the following arguments are required: DST",
        ),
        (
            ["inspect", "m.pte", "-o", "novalue"],
            "ptestore inspect: error: argument "
            "--storage-option/-o: expected KEY=VALUE, got 'novalue'",
        ),
        (
            ["gc", ".", "--older-than", "soon"],
            "ptestore gc: error: argument --older-than: expected a duration such as 90s, 30m, "
            "12h or 7d (a number with an optional unit s, m, h, d or w), got 'soon'",
        ),
        (["frobnicate"], "ptestore: error: argument COMMAND: invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("usage: ptestore"), err
    assert message in err, err


def test_storage_option_values_parse_as_json_when_they_can() -> None:
    assert parse_storage_option("anon=true") == ("anon", True)
    assert parse_storage_option("endpoint_url=http://h:9000") == ("endpoint_url", "http://h:9000")
    assert parse_storage_option("a=b=c") == ("a", "b=c")
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE, got '=x'"):
        parse_storage_option("=x")


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 MiB",
        "3072.0 GiB",
    ]


def test_inspect_missing_and_refused_sources_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.pte"
    assert main(["inspect", str(missing)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore inspect: error: {missing}"), err
    assert main(["inspect", "nosuchscheme://x/m.pte"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("ptestore inspect: error: ")


# ------------------------------------------------------------------ public surface
def test_every_error_is_importable_from_the_root() -> None:
    classes = {n for n in errors.__all__ if isinstance(getattr(errors, n), type)}
    assert classes <= set(ptestore.__all__), classes - set(ptestore.__all__)
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.PteStoreError)
    }
    assert defined == classes
    for name in ptestore.__all__:
        assert getattr(ptestore, name) is not None, name
    for name in classes:
        assert getattr(ptestore, name) is getattr(errors, name), name


def test_the_version_is_written_once_and_the_metadata_says_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``ptestore/_version.py`` holds it (read without metadata); pyproject.toml reads it
    from there, so the installed distribution reports the same."""
    import tomllib

    from ptestore.backends.compat import distribution_version

    pyproject = tomllib.loads(
        (Path(ptestore.__file__).parent.parent / "pyproject.toml").read_text()
    )
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "ptestore._version.__version__"
    }
    assert ptestore.__version__ == importlib.metadata.version("ptestore")
    assert distribution_version(PassthroughBackend) == ptestore.__version__
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == EXIT_OK
    assert capsys.readouterr().out == f"ptestore {ptestore.__version__}\n"


def test_import_stays_light() -> None:
    heavy = ("tqdm", "s3fs", "boto3", "botocore", "aiobotocore", "torch", "executorch")
    code = (
        "import sys, ptestore, ptestore.cli, ptestore.inspection\n"
        f"print(ptestore.__file__); print([m for m in {heavy!r} if m in sys.modules])"
    )
    root = Path(ptestore.__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True
    )
    where, loaded = result.stdout.splitlines()
    assert where == ptestore.__file__
    assert loaded == "[]"


def test_a_backend_module_s_version_is_found_without_parsing_every_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose distribution is named otherwise (or that none provides) is looked
    up in the installed ``*.dist-info``/``*.egg-info`` directories' small files, as
    ``importlib.metadata.packages_distributions`` would decide, without it."""
    from importlib import metadata

    from ptestore.backends import compat

    site = tmp_path / "site"
    (site / "acme_backend_pkg-2.5.1.dist-info").mkdir(parents=True)
    (site / "acme_backend_pkg-2.5.1.dist-info" / "top_level.txt").write_text("acme_npu\n")
    (site / "other-0.3.dist-info").mkdir()
    (site / "other-0.3.dist-info" / "RECORD").write_text(
        "other_mod/__init__.py,sha256=x,1\nsingle.py,sha256=y,2\nother-0.3.dist-info/RECORD,,\n"
    )
    (site / "other_mod").mkdir()  # what a RECORD lists is installed beside it
    (site / "other_mod" / "__init__.py").write_text("")
    (site / "single.py").write_text("")
    (site / "legacy.egg-info").mkdir()
    (site / "legacy.egg-info" / "top_level.txt").write_text("legacy_mod\n")
    (site / "legacy.egg-info" / "PKG-INFO").write_text("Name: legacy\nVersion: 0.9\n")
    # Two declare ``dup_mod``: the one named so wins (importlib.metadata's
    # ``distribution("dup_mod")``); a directory name without a version: METADATA's.
    (site / "aaa-1.0.dist-info").mkdir()
    (site / "aaa-1.0.dist-info" / "top_level.txt").write_text("dup_mod\n")
    (site / "Dup.Mod-2.0.dist-info").mkdir()
    (site / "Dup.Mod-2.0.dist-info" / "RECORD").write_text("dup_mod.py,sha256=z,3\n")
    (site / "dup_mod.py").write_text("")
    (site / "noversion.dist-info").mkdir()
    (site / "noversion.dist-info" / "top_level.txt").write_text("nov_mod\n")
    (site / "noversion.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: noversion\nVersion: 4.2\n\nVersion: not this\n"
    )
    monkeypatch.syspath_prepend(str(site))
    compat._top_distribution_version.cache_clear()

    def no_scan(*args: object) -> None:
        raise AssertionError("importlib.metadata read the distributions")

    monkeypatch.setattr(metadata, "packages_distributions", no_scan)
    monkeypatch.setattr(metadata, "distribution", no_scan)
    assert compat._top_distribution_version("dup_mod") == "2.0"
    assert compat._top_distribution_version("nov_mod") == "4.2"
    assert compat._top_distribution_version("acme_npu") == "2.5.1"
    assert compat._top_distribution_version("other_mod") == "0.3"
    assert compat._top_distribution_version("single") == "0.3"
    assert compat._top_distribution_version("legacy_mod") == "0.9"
    assert compat._top_distribution_version("nobody_provides_this") == compat.UNKNOWN_VERSION
    # A RECORD is read only where the module is installed: one that lists a module
    # which is not there (deleted; or the module lives elsewhere on the path) is not.
    (site / "gone-1.0.dist-info").mkdir()
    (site / "gone-1.0.dist-info" / "RECORD").write_text("gone_mod.py,sha256=w,4\n")
    assert compat._top_distribution_version("gone_mod") == compat.UNKNOWN_VERSION
    compat._top_distribution_version.cache_clear()


def test_object_label_names_routines_as_inspect_tells_them() -> None:
    """``object_label`` tells a routine from an instance without importing inspect: the
    same answer as ``inspect.isroutine`` for every kind of callable a SPEC may name."""
    import inspect

    from ptestore.backends.registry import object_label

    class Local:
        def method(self) -> None: ...

        @classmethod
        def made(cls) -> None: ...

    def function() -> None: ...

    for obj in (
        function,
        lambda: None,
        len,
        Local().method,
        Local.made,
        str.join,
        object.__init__,
        (1).__add__,
        dict.__dict__["fromkeys"],
        Local,
        Local(),
        3,
    ):
        target = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
        want = f"{getattr(target, '__module__', None) or '?'}:{target.__qualname__}"
        assert object_label(obj) == want, obj
