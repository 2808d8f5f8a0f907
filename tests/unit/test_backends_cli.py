"""Backend registry and SPEC grammar, the command backend, and the CLI."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import all_fixtures, get_fixture

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
from ptestore.errors import BackendError, ConfigurationError
from ptestore.format import parse
from ptestore.inspect import describe

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


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", r"backend 'nosuch': unknown name 'nosuch'; known: .*command.*passthrough.*"),
        ("no.such.module:X", r"backend 'no.such.module:X': cannot import 'no.such.module': .*"),
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
        rf"backend 'XnnpackBackend', key '{KEYS[1]}': command '.*compile.py' exited with "
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
        data = path.read_bytes()
        assert out == json.loads(json.dumps(describe(parse(data, len(data), str(path)))))
        for k in ("format", "file_size", "header", "methods", "named_data", "delegates"):
            assert out[k] == fx.facts[role][k]


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
        main(["specialize", str(MLP.pte_path), str(dst), "--backend", "passthrough", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["backends"][0]["status"] == "specialized"
    assert dst.read_bytes() == MLP.pte_path.read_bytes()
    # --create over an existing file: storage refusal, exit 1, nothing changed.
    assert main(["specialize", str(MLP.pte_path), str(dst), "--create", "--quiet"]) == 1
    assert "already exists" in capsys.readouterr().err.lower()
    # Summary on stdout by default.
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "passthrough"]) == 0
    assert "backend XnnpackBackend: 1 inputs" in capsys.readouterr().out
    # Bad input: exit 2.
    assert main(["specialize", str(tmp_path / "nope.pte"), str(dst)]) == 2
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "nosuch"]) == 2
    # Backend failure: exit 1.
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "command=false"]) == 1
    assert "nothing published" in capsys.readouterr().err
    assert dst.read_bytes() == MLP.pte_path.read_bytes()
