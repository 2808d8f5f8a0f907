"""``ensure``'s lock-wait limit and progress (issue 29 item 20): ``lock_timeout=`` /
``--lock-timeout`` fail with the lock file and its holder's pid instead of waiting
forever, ``None`` (the default) still waits; a miss reports the specialization's
events, a hit none; ``--progress`` draws them on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.fixtures import copy_pte

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.coordinator.report import Event
from ptestore.device.layout import CacheLayout
from ptestore.device.lock import holder_pid
from ptestore.errors import ConfigurationError, LockTimeout

SPEC = "support.counting_backend:Counting=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0, "soc": "sm8650"})
TESTS = Path(__file__).resolve().parents[1]

#: Holds every lock file named on the command line exclusively until stdin closes.
_HOLD = """
import sys
from ptestore.device.lock import KeyLock
locks = [KeyLock(p) for p in sys.argv[1:]]
for lock in locks:
    assert lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture(autouse=True)
def _counting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)


def _model(tmp_path: Path) -> Path:
    return copy_pte(tmp_path / "model.pte")


def _holder(locks: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), str(TESTS)]))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, *locks],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0


def _entry_locks(cache: Path) -> list[str]:
    locks = sorted(str(p) for p in Path(CacheLayout(cache).locks).glob("*.lock"))
    assert locks
    return locks


def test_a_held_entry_times_out_naming_the_lock_and_its_holder(tmp_path: Path) -> None:
    src, cache = _model(tmp_path), tmp_path / "cache"
    made = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    locks = _entry_locks(cache)
    holder = _holder(locks)
    try:
        assert holder_pid(locks[0]) == holder.pid
        with pytest.raises(LockTimeout) as caught:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, lock_timeout=0.2)
        err = caught.value
        assert err.holder == holder.pid and err.path in locks
        assert str(err) == (
            f"{err.path}: the cache lock was not free after 0.2 s (lock_timeout, "
            f"--lock-timeout): held by process {holder.pid}"
        )
        assert isinstance(err, TimeoutError) and isinstance(err, OSError)
        # the CLI: the same message, exit 1
        argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", SPEC]
        argv += ["--device", "phone", "--device-option", "scale=2.0"]
        argv += ["--device-option", "soc=sm8650", "--lock-timeout", "0"]
        run = subprocess.run(
            [sys.executable, "-m", "ptestore", *argv],
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), str(TESTS)])),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 1, run.stderr
        assert "the cache lock was not free after 0 s" in run.stderr
        assert f"held by process {holder.pid}" in run.stderr

        # No limit (the default): the call waits until the holder lets go.
        got: list[object] = []
        waiting = threading.Thread(
            target=lambda: got.append(
                ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
            )
        )
        waiting.start()
    finally:
        _release(holder)
    waiting.join(timeout=120)
    assert not waiting.is_alive()
    assert [a.pte for a in got] == [made.pte]  # type: ignore[attr-defined]
    assert holder_pid(locks[0]) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "lock_timeout must be >= 0 seconds (or None), got -1"),
        (float("nan"), "lock_timeout must be >= 0 seconds (or None), got nan"),
        ("5", "lock_timeout must be a number of seconds or None, got '5'"),
        (True, "lock_timeout must be a number of seconds or None, got True"),
    ],
)
def test_a_bad_lock_timeout_is_refused(tmp_path: Path, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ptestore.ensure(
            _model(tmp_path),
            cache_dir=tmp_path / "cache",
            backends=[SPEC],
            lock_timeout=value,  # type: ignore[arg-type]
        )
    assert str(caught.value) == message
    assert not (tmp_path / "cache").exists()


def test_a_bad_lock_timeout_flag_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ensure", str(_model(tmp_path)), "--cache-dir", str(tmp_path / "c")]
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--lock-timeout", "soon"])
    assert caught.value.code == 2
    assert (
        "--lock-timeout: expected a number of seconds >= 0, got 'soon'" in capsys.readouterr().err
    )


def test_progress_reports_a_miss_and_nothing_for_a_hit(tmp_path: Path) -> None:
    src, cache = _model(tmp_path), tmp_path / "cache"
    events: list[Event] = []
    ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, progress=events.append)
    kinds = [e.kind for e in events]
    assert kinds[0] == "parsed" and "backend_start" in kinds and "write" in kinds
    assert kinds[-1] == "publish"
    writes = [e for e in events if e.kind == "write"]
    assert writes[-1].done == writes[-1].total > 0
    hit: list[Event] = []
    ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, progress=hit.append)
    assert hit == []


def test_progress_flag_draws_on_stderr(tmp_path: Path) -> None:
    argv = ["ensure", str(_model(tmp_path)), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--backend", SPEC, "--device", "phone", "--device-option", "scale=2.0"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), str(TESTS)]))
    env.pop("TQDM_DISABLE", None)
    shown = subprocess.run(
        [sys.executable, "-m", "ptestore", *argv, "--progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "writing" in shown.stderr and "model.pte" in shown.stdout
    # not a terminal and no --progress: nothing on stderr (a second run is a hit anyway,
    # so use a fresh cache)
    argv[3] = str(tmp_path / "cache2")
    quiet = subprocess.run(
        [sys.executable, "-m", "ptestore", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert quiet.returncode == 0 and "writing" not in quiet.stderr


def test_progress_reports_an_in_place_run(tmp_path: Path) -> None:
    """``ensure(in_place=True)`` reports the in-place run's events too (the journal's
    writes included), and nothing for the hit after it."""
    src, cache = _model(tmp_path), tmp_path / "cache"
    events: list[Event] = []
    ptestore.ensure(
        src, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True,
        progress=events.append,
    )  # fmt: skip
    kinds = [e.kind for e in events]
    assert kinds[0] == "parsed" and "backend_start" in kinds and "backend_end" in kinds
    hit: list[Event] = []
    ptestore.ensure(
        src, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True, progress=hit.append
    )
    assert hit == []


def test_progress_reports_an_index_download(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ensure`` of a job index reports its downloads as ``fetch`` events (the bytes of
    each file, up to its size), and ``--progress`` draws them."""
    from support.fleetrun import fleet_run

    from device.test_ensure_index import A, _job

    out = tmp_path / "out"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    events: list[Event] = []
    made = ptestore.ensure(
        index, cache_dir=tmp_path / "cache", model="m", device=A, progress=events.append
    )
    fetched = [e for e in events if e.kind == "fetch"]
    sizes = {e.url: e.total for e in fetched}
    assert sum(e.nbytes for e in fetched) == sum(sizes.values())
    assert sizes[next(u for u in sizes if str(u).endswith(".pte"))] == os.path.getsize(made.pte)
    assert all(e.done <= e.total for e in fetched)


class _Stop(Exception):
    """What an app's progress callback raises (to cancel, or by a bug of its own)."""


@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "in place"])
@pytest.mark.parametrize("kind", ["parsed", "write", "publish", "replacement"])
def test_a_progress_callback_that_raises(tmp_path: Path, kind: str, in_place: bool) -> None:
    """The callback's exception propagates. Before the change is made it stops the run:
    nothing recorded, the source as it was, no journal left. Once it is made (``publish``;
    in place also ``write``, reported once the file is rewritten: it used to come between
    the journal's commit and its apply, and left the file unchanged with a committed
    journal) the entry is recorded first: the next call is a hit, the backend ran once.
    Raised while a backend runs (``replacement``), it is that backend's BackendError,
    the callback's exception its cause."""
    from ptestore.device import list_entries
    from ptestore.errors import BackendError
    from ptestore.journal import journal_path

    src, cache = _model(tmp_path), tmp_path / "cache"
    calls = tmp_path / "calls"
    before = src.read_bytes()

    def progress(event: Event) -> None:
        if event.kind == kind:
            raise _Stop(kind)

    kw = {"cache_dir": cache, "backends": [SPEC], "device": DEVICE, "in_place": in_place}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTESTORE_TEST_CALLS", str(calls))
        mp.delenv("PTESTORE_TEST_HOLD", raising=False)
        with pytest.raises((_Stop, BackendError)) as err:
            ptestore.ensure(src, progress=progress, **kw)  # type: ignore[arg-type]
        again = ptestore.ensure(src, **kw)  # type: ignore[arg-type]
    assert not Path(journal_path(str(src))).exists()
    if kind == "replacement":
        assert isinstance(err.value, BackendError)
        assert isinstance(err.value.__cause__, _Stop)
    else:
        assert type(err.value) is _Stop
    made_first = kind == "publish" or (in_place and kind == "write")
    if made_first:  # recorded before the exception: a hit
        assert not again.created and calls.read_text().count("\n") == 1
    else:  # stopped: the source as it was, nothing recorded, made by the next call
        assert again.created and calls.read_text().count("\n") == (kind != "parsed") + 1
        assert [e.state for e in list_entries(cache)] == ["ready"]
    if in_place:
        assert src.read_bytes() != before and ptestore.verify(src).status == "intact"


def test_specialize_in_place_with_a_tracer_that_raises_at_write_completes(
    tmp_path: Path,
) -> None:
    """``specialize(in_place=True)``: the tracer's exception at ``write`` propagates once
    the file is rewritten, never between the journal's commit and its apply."""
    from ptestore.journal import journal_path

    src = _model(tmp_path)

    def tracer(event: Event) -> None:
        if event.kind == "write":
            raise _Stop("write")

    with pytest.raises(_Stop):
        ptestore.specialize(
            src, src, backends=[SPEC], device=DEVICE, in_place=True, event_tracer=tracer
        )
    assert not Path(journal_path(str(src))).exists()
    assert ptestore.verify(src).status == "intact" and ptestore.recover(src) is None
