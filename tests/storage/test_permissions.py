"""Local access refused (EACCES/EPERM) is :class:`PermissionDenied`, exit 2, as the docs
promise: a destination directory without write permission, a source without read
permission. As root the permission bits do not apply, so the run happens in a forked
child without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from support.privileges import unprivileged

from ptestore.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_unwritable_destination_directory_is_permission_denied(tmp_path: Path) -> None:
    src = tmp_path / "m.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", src)
    src.chmod(0o644)
    out = tmp_path / "out"
    out.mkdir(mode=0o555)
    out.chmod(0o555)
    err = tmp_path / "err.txt"

    def run() -> int:
        with open(err, "w") as f, contextlib.redirect_stderr(f):
            return main(
                ["specialize", str(src), str(out / "m.pte"), "--backend", "passthrough", "-q"]
            )

    err.touch()
    err.chmod(0o666)
    assert unprivileged(run) == 2
    text = err.read_text()
    assert f"{out / 'm.pte'}: cannot create a staging file in {out}: " in text
    assert "Permission denied" in text
    assert os.listdir(out) == []


def test_unreadable_source_is_permission_denied(tmp_path: Path) -> None:
    src = tmp_path / "m.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", src)
    src.chmod(0o000)
    err = tmp_path / "err.txt"
    err.touch()
    err.chmod(0o666)

    def run() -> int:
        with open(err, "w") as f, contextlib.redirect_stderr(f):
            return main(
                ["specialize", str(src), str(tmp_path / "o.pte"), "--backend", "passthrough", "-q"]
            )

    assert unprivileged(run) == 2
    assert f"{src}: cannot open for reading: Permission denied" in err.read_text()
    assert not (tmp_path / "o.pte").exists()
