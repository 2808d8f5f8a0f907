"""A loop-mounted XFS file system with reflink, for copy-on-write tests.

Needs root and ``mkfs.xfs`` (Debian's xfsprogs; ``scripts/test.sh`` installs it).
Where either is missing the fixture errors when ``PTESTORE_REQUIRE_REFLINK=1`` (as in
CI) and skips otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRE_REFLINK = os.environ.get("PTESTORE_REQUIRE_REFLINK", "") not in ("", "0")


@dataclass(frozen=True)
class XfsMount:
    path: Path
    image: Path

    def free_bytes(self) -> int:
        """Free space as the file system reports it (after a sync)."""
        os.sync()
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


def _unavailable(why: str) -> None:
    if REQUIRE_REFLINK:
        pytest.fail(f"reflink tests required (PTESTORE_REQUIRE_REFLINK=1) but {why}")
    pytest.skip(why)


@contextlib.contextmanager
def xfs_reflink_mount(size: str = "3G") -> Iterator[XfsMount]:
    """Make a sparse image, ``mkfs.xfs -m reflink=1`` it, loop-mount it; clean up after."""
    if os.geteuid() != 0:
        _unavailable("mounting a loop XFS needs root")
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None:
        _unavailable("mkfs.xfs is not installed (apt-get install xfsprogs)")
    assert mkfs is not None
    work = Path(tempfile.mkdtemp(prefix="ptestore-xfs-"))
    image, mnt = work / "fs.img", work / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run([mkfs, "-q", "-m", "reflink=1", str(image)], check=True)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        _unavailable(f"mount -o loop failed: {mounted.stderr.strip()}")
    try:
        yield XfsMount(mnt, image)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def shared_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path`` in extents FIEMAP flags as shared (``filefrag -v``)."""
    out = subprocess.run(
        ["filefrag", "-v", "-b1", os.fspath(path)], capture_output=True, text=True, check=True
    ).stdout
    total = 0
    for line in out.splitlines():
        parts = line.split()
        if not parts or not parts[0].rstrip(":").isdigit() or "shared" not in line:
            continue
        # ext: logical_offset: physical_offset: length: ...
        length = line.split(":")[3].split()[0]
        total += int(length)
    return total
