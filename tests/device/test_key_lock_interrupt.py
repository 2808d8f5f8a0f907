"""A cache key's lock (:class:`ptestore.device.lock.KeyLock`) interrupted (Ctrl-C) while
it waits or right after it got the lock keeps no descriptor open, so nothing holds the
key afterwards, in this process or another; a lock timeout on a key this very process
holds (another thread, another call) names this process, not "another process"."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import pytest

from ptestore.device import lock as lock_module
from ptestore.device.lock import KeyLock, wait_limit
from ptestore.errors import LockTimeout


def _open_on(path: Path) -> int:
    """How many descriptors of this process are open on ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                n += 1
        except OSError:
            continue
    return n


def _free(path: Path) -> bool:
    """Whether an exclusive lock on ``path`` is free (a fresh descriptor)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_an_interrupt_once_the_lock_is_got_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "k.lock"

    def interrupted(fd: int, lock_path: str) -> bool:
        raise KeyboardInterrupt  # Ctrl-C between the flock and the lock kept

    monkeypatch.setattr(lock_module, "still_at", interrupted)
    key = KeyLock(str(path))
    with pytest.raises(KeyboardInterrupt):
        key.acquire()
    assert not key.held and _open_on(path) == 0 and _free(path)


class _Alarm(Exception):
    pass


def test_an_interrupt_while_waiting_keeps_no_descriptor(tmp_path: Path) -> None:
    """Interrupted while ``flock`` waits for a holder (another open file of this
    process: flock locks belong to the open file), 20 times: no descriptor left."""
    path = tmp_path / "k.lock"
    holder = KeyLock(str(path))
    assert holder.acquire()

    def alarm(signum: int, frame: object) -> None:
        raise _Alarm

    def waits() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        KeyLock(str(path)).acquire()  # blocks until the alarm interrupts it

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        for _ in range(20):
            with pytest.raises(_Alarm):
                waits()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _open_on(path) == 1  # the holder's only
    holder.release()
    assert _open_on(path) == 0 and _free(path)


def test_a_timeout_on_a_key_this_process_holds_names_this_process(tmp_path: Path) -> None:
    path = tmp_path / "k.lock"
    holder = KeyLock(str(path))
    assert holder.acquire()
    try:
        with wait_limit(0), pytest.raises(LockTimeout) as info:
            KeyLock(str(path)).acquire()
    finally:
        holder.release()
    assert str(info.value) == (
        f"{path}: the cache lock was not free after 0 s (lock_timeout, --lock-timeout): held "
        f"by this process ({os.getpid()}: another of its threads, or a call of it that holds "
        "the key)"
    )
    assert info.value.holder == os.getpid()
