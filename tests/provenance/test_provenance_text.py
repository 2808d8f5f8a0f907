"""Provenance is JSON: text it cannot record is a clear error before any work (a device
name or option, a backend's compatibility string), or is recorded escaped (a source
path whose bytes are not UTF-8). Never a traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ptestore.cli import main
from ptestore.provenance import read_provenance
from ptestore.storage.loaders import open_loader

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEC = "support.fleet_backend:Scaler=1.0"


def test_a_non_utf8_source_path_is_recorded_escaped(tmp_path: Path) -> None:
    src = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"m\xff.pte"))
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", src)
    out = tmp_path / "o.pte"
    assert main(["specialize", src, str(out), "--backend", SPEC, "--provenance", "-q"]) == 0
    record = read_provenance(open_loader(out))
    assert record is not None
    assert record.source.url == f"{tmp_path}/m\\xff.pte"
    assert main(["verify", str(out), "--source", src]) == 0


def test_a_device_name_that_is_not_utf8_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.pte"
    src = str(FIXTURES / "mlp_xnnpack.pte")
    argv = ["specialize", src, str(out), "--backend", SPEC, "--device", "d\udcff", "--json"]
    assert main(argv) == 2
    error = json.loads(capsys.readouterr().out)
    assert (
        "device 'd\\udcff': the name is not valid UTF-8 text (character '\\udcff' at "
        in (error["error"]["message"])
    )
    assert not out.exists() and os.listdir(tmp_path) == []
    argv[5:7] = ["--device", "d", "--device-option", "soc=\udcff"]
    assert main(argv) == 2
    error = json.loads(capsys.readouterr().out)
    assert "device 'd': the options are not valid UTF-8 text" in error["error"]["message"]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("surrogate", "compatibility_info returned text that is not valid UTF-8 (character "),
        ("huge", f"compatibility_info returned {(1 << 20) + 1} bytes; the limit is 65536"),
    ],
)
def test_a_compatibility_string_provenance_cannot_record_is_a_backend_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    out = tmp_path / "o.pte"
    spec = f"support.odd_info_backend:OddInfo={kind}"
    argv = ["specialize", str(FIXTURES / "mlp_xnnpack.pte"), str(out), "--backend", spec]
    assert main([*argv, "--provenance", "--json"]) in (1, 2)
    error = json.loads(capsys.readouterr().out)
    assert message in error["error"]["message"]
    assert os.listdir(tmp_path) == []
