"""Kill points from observed progress, not from wall-clock guesses.

A forked child runs with probes installed at the moments that matter (a staging file
exists, a write or part upload finished, the commit point, the rename/link happened,
CompleteMultipartUpload returned, publish returned). At each probe the child reports
the event on a pipe and waits for the parent's go-ahead, so the parent can deliver a
signal while the child stands exactly at that point. A calibration run records the
sequence of events; the test then picks kill points by phase and asserts how many
kills landed in each.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptestore.writers import DataWriter, LocalFileWriter

DEADLINE = 120.0


class Probe:
    """The child's side: ``point(name)`` reports and waits for the parent."""

    def __init__(self, events: int, go: int) -> None:
        self.events = events
        self.go = go

    def point(self, name: str) -> None:
        os.write(self.events, name.encode() + b"\n")
        os.read(self.go, 1)


def _role(w: DataWriter) -> str:
    return "ptd" if w.url.endswith(".ptd") else "pte"


def install(probe: Probe) -> None:
    """Wrap the writers' steps (in the child only: it exits when done)."""
    from ptestore.writers.s3 import publish as s3_publish
    from ptestore.writers.s3 import transfer as s3_transfer
    from ptestore.writers.s3 import writer as s3_writer

    def after(owner: Any, name: str, event: Callable[..., str | None]) -> None:
        real = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            label = event(*args)
            if label is not None:
                probe.point(label)
            return result

        setattr(owner, name, wrapped)

    real_commit = DataWriter._commit_point

    def commit_point(self: DataWriter) -> None:
        probe.point(f"commit:{_role(self)}")
        real_commit(self)

    DataWriter._commit_point = commit_point  # type: ignore[method-assign]
    after(LocalFileWriter, "__init__", lambda w, *a: f"staged:{_role(w)}")
    after(DataWriter, "write", lambda w, *a: f"write:{_role(w)}")
    after(DataWriter, "copy_from", lambda w, *a: f"write:{_role(w)}")
    after(DataWriter, "publish", lambda w, *a: f"published:{_role(w)}")
    after(os, "replace", lambda *a: "renamed")
    after(os, "link", lambda *a: "renamed")
    after(s3_transfer.PartTransfer, "store", lambda *a: "part")  # a part uploaded or copied
    after(s3_writer.S3Writer, "_ensure_upload", lambda w, *a: "upload")
    after(s3_publish.S3Publisher, "complete", lambda *a: "completed")
    after(s3_publish.S3Publisher, "put", lambda *a: "completed")


@dataclass
class Outcome:
    events: list[str]
    #: Exit code, or ``-signal`` when killed by a signal.
    status: int
    stderr: str


def run_child(
    body: Callable[[], int],
    kill_at: int | None = None,
    sig: int = signal.SIGKILL,
) -> Outcome:
    """Fork, run ``body`` with probes; deliver ``sig`` at event number ``kill_at``
    (0-based, None: never). The child's stderr is captured."""
    ev_r, ev_w = os.pipe()
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            os.close(ev_r)
            os.close(go_w)
            os.close(err_r)
            os.dup2(err_w, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
            install(Probe(ev_w, go_r))
            code = body()
        except BaseException as exc:  # report, never fall back into pytest
            try:
                print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                code = 98
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(ev_w)
    os.close(go_r)
    os.close(err_w)

    def wait() -> int:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    return _drive(pid, wait, ev_r, go_w, err_r, kill_at, sig)


def _drive(
    pid: int,
    wait: Callable[[], int],
    ev_r: int,
    go_w: int,
    err_r: int,
    kill_at: int | None,
    sig: int,
) -> Outcome:
    """The parent's side: read the child's events, let it go on after each one, and
    deliver ``sig`` at event number ``kill_at``."""
    events: list[str] = []
    buf = b""
    err = b""
    signalled = False
    start = time.monotonic()
    open_fds = {ev_r, err_r}
    while open_fds:
        if time.monotonic() - start > DEADLINE:
            os.kill(pid, signal.SIGKILL)
            wait()
            raise AssertionError(f"child hung; events so far: {events[-10:]}")
        ready, _, _ = select.select(list(open_fds), [], [], 1.0)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            if fd == err_r:
                err += chunk
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                events.append(line.decode())
                if not signalled and kill_at is not None and len(events) - 1 == kill_at:
                    signalled = True
                    os.kill(pid, sig)
                    if sig == signal.SIGKILL:
                        continue
                try:
                    os.write(go_w, b"g")  # free-run after a SIGINT, to let it unwind
                except BrokenPipeError:
                    pass
    os.close(ev_r)
    os.close(err_r)
    os.close(go_w)
    code = wait()
    return Outcome(events, code, err.decode(errors="replace"))


#: How a spawned child finds its probe: ``"<events fd>,<go fd>"``.
PROBE_ENV = "PTESTORE_TEST_PROBE"


def probe_from_env() -> Probe:
    """The probe of a child started by :func:`run_spawned`."""
    events, go = (int(x) for x in os.environ[PROBE_ENV].split(","))
    return Probe(events, go)


def run_spawned(
    argv: list[str],
    kill_at: int | None = None,
    sig: int = signal.SIGKILL,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Start ``argv`` (a fresh interpreter: nothing of this process is inherited, unlike
    :func:`run_child`'s fork), which reports its events with :func:`probe_from_env`;
    deliver ``sig`` at event number ``kill_at``. Its stderr is captured."""
    import subprocess

    ev_r, ev_w = os.pipe()
    go_r, go_w = os.pipe()
    proc = subprocess.Popen(
        argv,
        pass_fds=(ev_w, go_r),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**(os.environ if env is None else env), PROBE_ENV: f"{ev_w},{go_r}"},
    )
    os.close(ev_w)
    os.close(go_r)
    assert proc.stderr is not None
    err_r = os.dup(proc.stderr.fileno())
    proc.stderr.close()
    return _drive(proc.pid, proc.wait, ev_r, go_w, err_r, kill_at, sig)
