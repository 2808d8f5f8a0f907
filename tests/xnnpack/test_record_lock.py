"""The maker's and installer's ``flock`` (``ptestore.storage.flock.locked``): whoever
holds it may remove the lock file, and a process that waited on the removed file never
holds a lock alongside one on the file now at the path."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest
from support.locks import blocked_on, wait_until

from ptestore.storage.flock import locked


def test_a_waiter_on_a_removed_lock_file_locks_the_one_at_the_path(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    entered = threading.Event()
    leave = threading.Event()

    def waiter() -> None:
        with locked(lock):
            entered.set()
            leave.wait()

    thread = threading.Thread(target=waiter, daemon=True)
    with locked(lock, remove=True):
        thread.start()
        wait_until(lambda: blocked_on(lock), "the waiter to block on the lock")
        assert not entered.is_set()
    # the holder removed the file on its way out: the waiter woke up holding a lock on
    # an inode no longer at the path, so it locked the new file there instead
    wait_until(entered.is_set, "the waiter to take the lock")
    fd = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # a newcomer cannot take it alongside
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        leave.set()
        thread.join()
    assert lock.is_file()  # this holder did not ask to remove it
