"""A small tmpfs for the tests of a full disk (mounting one needs root, as the test
environment is)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["tmpfs"]


@contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``: "1m", "4m") mounted at the new directory
    ``mnt``, unmounted afterwards."""
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=False
    )
    assert r.returncode == 0, "mounting a tmpfs needs root (the test environment is root)"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
