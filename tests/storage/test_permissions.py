"""Local access refused (EACCES/EPERM) is :class:`PermissionDenied`, exit 2, as the docs
promise: a destination directory without write permission, a source without read
permission. As root the permission bits do not apply, so the run happens in a forked
child without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. The other local failures that
rerunning cannot change are bad input too: a path through a file (ENOTDIR) is
:class:`ObjectNotFound`, a name or path longer than the file system takes (ENAMETOOLONG)
a :class:`ConfigurationError` naming the limit, and a directory whose file system takes
no new file (``/proc``) is not said to be missing."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

import pytest
from support.privileges import unprivileged

from ptestore._oserror import local_error
from ptestore.cli import main
from ptestore.errors import ConfigurationError, ObjectNotFound, StorageError

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


def test_a_path_through_a_file_is_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOTDIR (``m.pte/x.pte``) was a StorageError, exit 1, as if rerunning could help."""
    src = tmp_path / "m.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", src)
    through = src / "x.pte"
    assert main(["inspect", str(through)]) == 2
    assert capsys.readouterr().err.startswith(
        f"ptestore inspect: error: {through}: cannot open for reading: Not a directory\n"
    )
    assert main(["specialize", str(src), str(through), "--backend", "passthrough", "-q"]) == 2
    assert capsys.readouterr().err.startswith(
        f"ptestore specialize: error: {through}: cannot create a staging file in {src}: "
        "Not a directory\n"
    )
    error = local_error(NotADirectoryError(errno.ENOTDIR, "Not a directory"), "x: m")
    assert isinstance(error, ObjectNotFound) and error.errno == errno.ENOTDIR


def test_a_name_too_long_is_bad_input_naming_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENAMETOOLONG was a StorageError, exit 1; now exit 2, the name (or the path) and
    the file system's limit named."""
    name = tmp_path / ("a" * 300 + ".pte")
    assert main(["inspect", str(name)]) == 2
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    assert capsys.readouterr().err.startswith(
        f"ptestore inspect: error: {name}: cannot open for reading: File name too long (the "
        f"name {'a' * 40!r}... (304 characters) is 304 bytes long, over the file system's "
        f"limit of {limit} bytes per name (NAME_MAX))\n"
    )
    deep = str(tmp_path) + "/abcdefghij" * 420 + "/x.pte"
    assert main(["inspect", deep]) == 2
    size = len(os.fsencode(deep))
    path_max = os.pathconf(tmp_path, "PC_PATH_MAX")
    shown = f"{deep[:4096]}... ({len(deep)} characters)"  # past PATH_MAX: cut on the line
    assert capsys.readouterr().err.startswith(
        f"ptestore inspect: error: {shown}: cannot open for reading: File name too long (the "
        f"path is {size} bytes long, over the system's limit of {path_max} bytes per path "
        "(PATH_MAX, its terminating NUL included))\n"
    )
    error = local_error(OSError(errno.ENAMETOOLONG, "File name too long"), "x: too long")
    assert type(error) is ConfigurationError and str(error) == "x: too long"  # no path
    other = local_error(OSError(errno.EIO, "Input/output error"), "x: eio")
    assert type(other) is StorageError and other.errno == errno.EIO


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_directory_that_takes_no_new_file_is_not_called_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/proc exists, and refuses a new file with ENOENT: it said "destination directory
    /proc does not exist"."""
    src = tmp_path / "m.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", src)
    assert main(["specialize", str(src), "/proc/x.pte", "--backend", "passthrough", "-q"]) == 2
    assert capsys.readouterr().err.startswith(
        "ptestore specialize: error: /proc/x.pte: cannot create a staging file in /proc: No "
        "such file or directory (the directory exists; its file system takes no new files "
        "there)\n"
    )
