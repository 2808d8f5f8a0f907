"""What files hold on the file system (``st_blocks * 512``), as the cache reports what
it freed: a sparse file holds less than its size."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["allocated", "allocated_under"]


def allocated(path: str | os.PathLike[str]) -> int:
    """The bytes the file at ``path`` holds on its file system."""
    return os.lstat(path).st_blocks * 512


def allocated_under(directory: str | os.PathLike[str]) -> int:
    """The bytes the regular files under ``directory`` hold, each file once."""
    seen: dict[tuple[int, int], int] = {}
    for p in Path(directory).rglob("*"):
        st = p.lstat()
        if p.is_file() and not p.is_symlink():
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())
