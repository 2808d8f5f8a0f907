"""An entry's last use (its manifest's modification time, :func:`ptestore.device.layout.touch`)
is never set to a time :func:`ptestore.gc.implausible` refuses against the clock: a hit
while the clock was far ahead stamped that time, and every later hit carried it on a
nanosecond (``max(now, last use + 1 ns)``), so it stayed ahead, more than a day after
now; under a clock that reads before 2000 the time is left as it is, too."""

from __future__ import annotations

import os
import time
import types
from pathlib import Path

import pytest
from support.fixtures import copy_pte

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.device import layout, list_entries
from ptestore.gc import FUTURE_SLACK, PLAUSIBLE_SINCE

SPEC = "support.fleet_backend:Scaler=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})
DAY = 86400 * 10**9


def _hit_at(monkeypatch: pytest.MonkeyPatch, src: Path, cache: Path, clock: int) -> int:
    """A hit on ``src``'s entry while the clock reads ``clock`` (ns): its last use after."""
    monkeypatch.setattr(layout, "time", types.SimpleNamespace(time_ns=lambda: clock))
    hit = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert not hit.created
    return (cache / "entries" / hit.key / "manifest.json").stat().st_mtime_ns


def test_a_last_use_far_ahead_of_the_clock_is_not_carried_further(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    made = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    manifest = cache / "entries" / made.key / "manifest.json"
    now = time.time_ns()
    ahead = now + 30 * DAY  # stamped while the clock was a month ahead
    os.utime(manifest, ns=(ahead, ahead))
    assert _hit_at(monkeypatch, src, cache, now) == ahead  # was ahead + 1 ns
    [entry] = list_entries(cache)
    assert entry.last_used == manifest.stat().st_mtime > (now + 29 * DAY) / 1e9
    # Within a day ahead (a clock a little behind): the last use and a nanosecond.
    near = now + DAY // 2
    os.utime(manifest, ns=(near, near))
    assert _hit_at(monkeypatch, src, cache, now) == near + 1
    assert _hit_at(monkeypatch, src, cache, now + DAY) == now + DAY  # a right clock: now


def test_a_clock_before_2000_leaves_the_last_use_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that booted with 1970, its entry last used under that clock as well:
    the hit wrote 1970 again (now, then 1970 and a nanosecond)."""
    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    made = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    manifest = cache / "entries" / made.key / "manifest.json"
    os.utime(manifest, ns=(5 * 10**9, 5 * 10**9))
    assert _hit_at(monkeypatch, src, cache, 60 * 10**9) == 5 * 10**9


def test_the_hit_s_bound_is_gc_s() -> None:
    """touch tells a clock before 2000 without importing gc (a hit stays light)."""
    assert layout._PLAUSIBLE_SINCE_NS == PLAUSIBLE_SINCE * 10**9
    assert DAY == FUTURE_SLACK * 10**9
