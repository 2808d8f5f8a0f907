"""Work directories of makers that are gone, collected by the next one.

A maker of a packed-weight file works in ``.xnnpack-<id>.<random>/`` beside it (the
runtime's file, the reference outputs: model-sized) while it holds the identity's lock
(``xnnpack-<id>.xpwc.lock``), and removes it when it ends. A maker that is killed
leaves it; :func:`remove_abandoned` (called by the next
:func:`~ptestore.xnnpack.make_cache` in that directory) removes those of every identity
whose lock no one holds, so they go even after the artifact changed and no maker of
their identity comes again.

The fleet's workers make the file in a scratch directory of their own
(:func:`held_work_dir`): ``<tmp>/ptestore-xnnpack-<uid>/<random>/``, beside a lock file
``<random>.lock`` the run holds while it works there and removes after it. Each new one
first removes the siblings whose lock is free (a worker killed while it worked), so
they never accumulate in ``/tmp``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..storage.flock import still_at, try_lock

__all__ = ["held_work_dir", "remove_abandoned"]

_WORK = re.compile(r"\.(xnnpack-[0-9a-f]{32})\.")


def remove_abandoned(directory: Path, own: str) -> list[str]:
    """Remove from ``directory`` the work directories (``.xnnpack-<id>.*``) of every
    identity but ``own`` (whose lock the caller holds) whose lock is free: a live
    maker holds its lock while its work directory exists. One whose lock file is
    missing is kept (nothing tells it from a live one). The names removed."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        works = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    for name in sorted(works):
        m = _WORK.match(name)
        if m is None or m.group(1) == own:
            continue
        fd = try_lock(directory / f"{m.group(1)}.xpwc.lock")
        if fd is None:
            continue
        try:
            shutil.rmtree(directory / name, ignore_errors=True)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _scratch_base() -> Path | None:
    """``<tmp>/ptestore-xnnpack-<uid>``: made 0700, this user's own directory (not a
    link); None when it cannot be."""
    base = Path(tempfile.gettempdir()) / f"ptestore-xnnpack-{os.geteuid()}"
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
        st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return base


def _collect(base: Path) -> None:
    """Remove the work directories under ``base`` whose lock is free (their run is
    gone), and those with no lock file (a run removes its lock only after its
    directory, and makes it before)."""
    with os.scandir(base) as it:
        names = {e.name for e in it}
    for name in sorted(names):
        if name.endswith(".lock"):
            fd = try_lock(base / name)
            if fd is None:
                continue
            try:
                shutil.rmtree(base / name[: -len(".lock")], ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(base / name)
            finally:
                os.close(fd)
        elif name + ".lock" not in names:
            shutil.rmtree(base / name, ignore_errors=True)


@contextlib.contextmanager
def held_work_dir(prefix: str = "ptestore-xnnpack-") -> Iterator[str]:
    """A scratch directory for one run, removed when it ends, and collected by a later
    one if the run is killed (see the module). Falls back to a plain temporary
    directory (removed when the run ends) when the shared base is not this user's."""
    base = _scratch_base()
    if base is None:
        work = tempfile.mkdtemp(prefix=prefix)
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    _collect(base)
    while True:
        name = secrets.token_hex(8)
        lock = base / f"{name}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if still_at(fd, lock):
            break
        os.close(fd)  # collected before it was locked: another name
    scratch = base / name
    try:
        os.mkdir(scratch, 0o700)
        yield str(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
