"""Local access refused (EACCES/EPERM) is :class:`PermissionDenied`, exit 2, as the docs
promise: a destination directory without write permission, a source without read
permission. As root the permission bits do not apply, so the run happens in a forked
child without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ptestore.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _drop_dac_capabilities() -> None:
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from this process: root then meets
    permission bits like anyone else (what a container with dropped capabilities sees)."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    mask = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0].effective &= mask
    data[0].permitted &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def unprivileged(fn: Callable[[], int]) -> int:
    """``fn()``'s return value, computed where permission bits apply (as root: in a
    forked child without the capabilities that bypass them)."""
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(r)
            _drop_dac_capabilities()
            code = fn()
        except BaseException as exc:
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            os.write(w, bytes([code & 0xFF]))
            os._exit(0)
    os.close(w)
    out = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return out[0] if out else 98


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
