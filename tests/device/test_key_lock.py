"""The locks released after an exception (issue 29 item 11): a cache key's lock
(``ptestore/device/lock.py``) and an in-place run's lock on the file itself, each
acquired afterwards by another process (a lock kept would show up as a hang)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendInterface
from ptestore.device.layout import CacheLayout
from ptestore.device.lock import KeyLock

FX = get_fixture("mlp_xnnpack")

#: Another process tries each lock without waiting: prints True (got it) or False.
_TRY_KEY_LOCK = """
import sys
from ptestore.device.lock import KeyLock
lock = KeyLock(sys.argv[1], blocking=False)
print(lock.acquire())
"""
_TRY_FLOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print(True)
except BlockingIOError:
    print(False)
"""


def other_process_gets(code: str, path: Path | str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {"True": True, "False": False}[out.stdout.strip()]


class Failure(RuntimeError):
    pass


def _fail_inside(path: Path) -> None:
    with KeyLock(str(path)):
        assert not other_process_gets(_TRY_KEY_LOCK, path)  # held: the check can fail
        raise Failure("inside the locked region")


def check_key_lock_released_after_an_exception(path: Path) -> None:
    with pytest.raises(Failure, match="inside the locked region"):
        _fail_inside(path)
    assert other_process_gets(_TRY_KEY_LOCK, path)


def test_an_exception_inside_a_key_lock_releases_it_for_another_process(tmp_path: Path) -> None:
    check_key_lock_released_after_an_exception(tmp_path / "key.lock")


def test_a_key_lock_kept_after_an_exception_fails_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted bug: ``__exit__`` that keeps the lock; the test above then fails."""
    kept: list[KeyLock] = []
    monkeypatch.setattr(KeyLock, "__exit__", lambda self, *exc: kept.append(self))
    with pytest.raises(AssertionError):
        check_key_lock_released_after_an_exception(tmp_path / "key.lock")
    for lock in kept:
        lock.release()


def test_a_failing_make_releases_the_key_for_the_next_ensure(tmp_path: Path) -> None:
    """``ensure`` whose backend raises: the entry's exclusive lock is released, so
    another process takes it at once (and ``ensure`` again makes the entry)."""
    src, cache = tmp_path / "model.pte", tmp_path / "cache"
    assert FX.pte_path is not None
    shutil.copyfile(FX.pte_path, src)
    with pytest.raises(ptestore.BackendError, match="the device ran out of patience"):
        ptestore.ensure(src, cache_dir=cache, backends=[Boom()])
    layout = CacheLayout(cache)
    locks = sorted(Path(layout.root).rglob("*.lock"))
    assert locks, list(Path(cache).rglob("*"))
    for lock in locks:
        assert other_process_gets(_TRY_KEY_LOCK, lock), lock


def test_a_failing_in_place_run_releases_the_file_for_another_process(tmp_path: Path) -> None:
    src = tmp_path / "model.pte"
    assert FX.pte_path is not None
    shutil.copyfile(FX.pte_path, src)
    with pytest.raises(ptestore.BackendError, match="the device ran out of patience"):
        ptestore.specialize(src, src, backends=[Boom()], in_place=True)
    assert other_process_gets(_TRY_FLOCK, src)


class Boom(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise RuntimeError("the device ran out of patience")
