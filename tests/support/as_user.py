"""Run a piece of a test as another user (the tests run as root): in a forked child that
drops to that uid and gid, its outcome reported back through a pipe."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["NOBODY", "ROOT_ONLY", "as_user", "give_tree", "owner_and_mode", "reachable_dir"]

#: The uid (and gid) of ``nobody`` on Linux.
NOBODY = 65534

#: A test that acts as other users (CI runs as root).
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


@contextmanager
def reachable_dir(prefix: str) -> Iterator[Path]:
    """A new directory another user can reach (pytest's are 0700, root's), removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    """``(uid, gid, permission bits)`` of ``path``."""
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def as_user(uid: int, work: Callable[[], object], *, groups: Sequence[int] = ()) -> str:
    """``work()`` in a forked child running as ``uid`` (and gid), in the supplementary
    ``groups``: ``"ok: <result>"`` or ``"<exception class>: <message>"``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        out = "child did not report"
        try:
            os.setgroups(list(groups))
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            out = f"ok: {work()}"
        except BaseException as exc:
            out = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(w, out.encode())
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got = b""
    while chunk := os.read(r, 1 << 16):
        got += chunk
    os.close(r)
    return got.decode()


def give_tree(root: str | os.PathLike[str], uid: int) -> None:
    """Make ``uid`` (and the group of that number) the owner of ``root`` and of
    everything under it (as root: what a test run as another user then acts on)."""
    for d, dirs, files in os.walk(root):
        for name in [d, *(os.path.join(d, n) for n in dirs + files)]:
            os.chown(name, uid, uid)
