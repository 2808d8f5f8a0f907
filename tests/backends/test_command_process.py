"""The ``command`` backend's program as a process: its whole process group stopped on a
timeout, Ctrl-C or SIGTERM; a background process holding stdout cannot hold the run up;
only the tail of stderr kept; the SPEC's ``timeout=``; the messages for a program that
cannot start or was killed by a signal.

No test waits on the clock: a program says it is ready through a FIFO, and a
grandchild's end is waited for on a pidfd (a bound there only turns a hang into a
failure)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import load_backend
from ptestore.backends.command import CommandBackend
from ptestore.cli import main
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED
from ptestore.errors import BackendError, ConfigurationError

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
SRC = MLP.pte_path
#: Only a bound turning a hang (the defect) into a failure; never reached when it works.
BOUND = 120.0

#: The program: starts a grandchild (MARKER in its argv) that sleeps, says so on stderr
#: and (when READY_FIFO is set) through the FIFO, then does what MODE says.
PROGRAM = textwrap.dedent(
    """
    import os, subprocess, sys, time
    data = sys.stdin.buffer.read()
    marker, mode = sys.argv[1], sys.argv[2]
    gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", marker])
    sys.stderr.write("compiler: grandchild %d up\\n" % gc.pid)
    sys.stderr.flush()
    if os.environ.get("READY_FIFO"):
        with open(os.environ["READY_FIFO"], "w") as f:
            f.write("%d\\n" % gc.pid)
    if mode == "exit":  # leave the grandchild behind, holding stdout and stderr
        sys.stdout.buffer.write(data + b"X")
        sys.exit(0)
    time.sleep(1000)
    """
)


def marked(marker: str) -> list[int]:
    """Live processes with ``marker`` in their argv (a zombie has an empty one)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv:
                found.append(int(entry))
    return found


def wait_gone(pid: int) -> bool:
    """Whether process ``pid`` ends (waited for on a pidfd, not by polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], BOUND)[0])
    finally:
        os.close(fd)


def kill_marked(marker: str) -> None:
    for pid in marked(marker):  # only after a failure: what the defect left running
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "compiler.py"
    path.write_text(PROGRAM)
    return path


@pytest.fixture
def marker() -> object:
    mark = f"ptestore-test-{uuid.uuid4().hex}"
    yield mark
    kill_marked(mark)


def read_ready(fifo: Path, into: list[int], then: threading.Event) -> None:
    with open(fifo) as f:  # blocks until the program opens it
        into.append(int(f.readline()))
    then.set()


def test_a_timeout_stops_the_program_s_children_and_keeps_its_stderr_tail(
    tmp_path: Path, program: Path, marker: str
) -> None:
    # The clock may fire before the program started its grandchild on a busy machine:
    # then the message has no "up" line, and the run is tried again with a longer one.
    timeout = 0.5
    while True:
        backend = CommandBackend([sys.executable, str(program), marker, "hang"], timeout=timeout)
        with pytest.raises(BackendError) as info:
            ptestore.specialize(SRC, tmp_path / "o.pte", backends=[backend])
        found = re.search(r"compiler: grandchild (\d+) up", str(info.value))
        if found or timeout > BOUND:
            break
        timeout *= 2
    assert found, str(info.value)
    assert re.fullmatch(
        rf"backend 'XnnpackBackend' \(ptestore.backends.command:CommandBackend\), method "
        rf"'forward': command '.*' timed out after {timeout:g} s on a delegate blob \(stopped "
        rf"with its process group\): compiler: grandchild \d+ up",
        str(info.value),
    ), str(info.value)
    assert wait_gone(int(found.group(1)))
    assert marked(marker) == []
    assert not (tmp_path / "o.pte").exists()


def test_ctrl_c_stops_the_program_s_children(
    tmp_path: Path, program: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    monkeypatch.setenv("READY_FIFO", str(fifo))
    pids: list[int] = []
    ready = threading.Event()

    def interrupt_when_ready() -> None:
        read_ready(fifo, pids, ready)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=interrupt_when_ready, daemon=True)
    thread.start()
    backend = CommandBackend([sys.executable, str(program), marker, "hang"], timeout=BOUND)
    with pytest.raises(KeyboardInterrupt):
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=[backend])
    thread.join(BOUND)
    assert ready.is_set() and len(pids) == 1
    assert wait_gone(pids[0])
    assert marked(marker) == []


def test_sigterm_to_ptestore_stops_the_program_s_children(
    tmp_path: Path, program: Path, marker: str
) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    spec = f"command@XnnpackBackend=timeout={BOUND:g} {sys.executable} {program} {marker} hang"
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ptestore",
            "specialize",
            str(SRC),
            str(tmp_path / "o.pte"),
            "--backend",
            spec,
        ],
        env={**os.environ, "READY_FIFO": str(fifo)},
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    read_ready(fifo, pids, threading.Event())
    cli.send_signal(signal.SIGTERM)
    _, err = cli.communicate(timeout=BOUND)
    assert cli.returncode == EXIT_INTERRUPTED, err
    assert "interrupted by SIGTERM" in err
    assert wait_gone(pids[0])
    assert marked(marker) == []


def test_a_background_process_holding_stdout_does_not_hold_the_run_up(
    tmp_path: Path, program: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    monkeypatch.setenv("READY_FIFO", str(fifo))
    pids: list[int] = []
    returned = threading.Event()
    released: list[bool] = []

    def release_after_bound() -> None:
        read_ready(fifo, pids, threading.Event())
        if not returned.wait(BOUND):  # the defect: the run waits for the grandchild
            released.append(True)
            os.kill(pids[0], signal.SIGKILL)

    thread = threading.Thread(target=release_after_bound, daemon=True)
    thread.start()
    backend = CommandBackend([sys.executable, str(program), marker, "exit"], named_data=False)
    report = ptestore.specialize(SRC, tmp_path / "o.pte", backends=[backend])
    returned.set()
    thread.join(BOUND)
    assert not released, "the run waited for the background process to end"
    assert report.backends[0].blobs_replaced == 1
    assert marked(marker) == [pids[0]]  # left alone: the program meant it to run on


def test_only_the_tail_of_stderr_is_kept(tmp_path: Path) -> None:
    """64 MiB of stderr: the error has its last 2000 characters, and the process did
    not hold it (peak RSS measured in a fresh interpreter)."""
    probe = textwrap.dedent(
        f"""
        import resource, sys
        import ptestore
        from ptestore.backends.command import CommandBackend
        prog = ("import sys; sys.stdin.buffer.read(); w = sys.stderr.buffer.write; "
                "w(b'head' + b'x' * (64 << 20)); w(b'the end'); sys.exit(1)")
        backend = CommandBackend([sys.executable, "-c", prog])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            ptestore.specialize({str(SRC)!r}, {str(tmp_path / "o.pte")!r}, backends=[backend])
        except ptestore.errors.BackendError as exc:
            message = str(exc)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grew >> 10, message.endswith("x" * 1993 + "the end"), message.count("x" * 1993))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1:] == ["True", "1"]  # one tail, and only that
    assert int(out[0]) < 32, f"peak RSS grew by {out[0]} MiB for 64 MiB of stderr"


# ------------------------------------------------------------------ timeout= in a SPEC
def test_the_spec_sets_the_timeout() -> None:
    backend = load_backend("command@XnnpackBackend=timeout=2.5 python3 pack.py --level 2")
    assert isinstance(backend, CommandBackend)
    assert backend.timeout == 2.5
    assert backend.argv == ["python3", "pack.py", "--level", "2"]
    assert CommandBackend("cat").timeout is None
    assert CommandBackend("timeout=7 cat").timeout == 7.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "command=timeout=0 cat",
            "the command backend's timeout=0 (in 'timeout=0 cat') must be a number of "
            "seconds > 0 (e.g. command@QnnBackend=timeout=600 qnn-compile ...)",
        ),
        (
            "command=timeout=soon cat",
            "the command backend's timeout=soon (in 'timeout=soon cat') must be a number "
            "of seconds > 0 (e.g. command@QnnBackend=timeout=600 qnn-compile ...)",
        ),
        (
            "command=timeout=inf cat",
            "the command backend's timeout=inf (in 'timeout=inf cat') must be a number of "
            "seconds > 0 (e.g. command@QnnBackend=timeout=600 qnn-compile ...)",
        ),
        (
            "command=timeout=5",
            "the command backend needs a program, got 'timeout=5': use command=PROGRAM "
            "ARGS (e.g. --backend 'command@XnnpackBackend=python3 pack.py')",
        ),
    ],
)
def test_bad_timeouts_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_backend(spec)
    assert str(info.value) == message


def test_bad_timeouts_are_refused_in_python() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ConfigurationError) as info:
            CommandBackend("cat", timeout=bad)  # type: ignore[arg-type]
        assert str(info.value) == (
            f"the command backend's timeout must be a number of seconds > 0, got {bad!r}"
        )
    with pytest.raises(ConfigurationError) as info:
        CommandBackend("timeout=5 cat", timeout=6)
    assert str(info.value) == (
        "the command backend got two timeouts: 'timeout=5' in its command line "
        "'timeout=5 cat' and timeout=6"
    )


def test_the_cli_s_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The program never ends by itself: the timeout fires whenever the machine runs it.
    spec = f"command@XnnpackBackend=timeout=0.5 {sys.executable} -c 'while True: pass'"
    dst = tmp_path / "o.pte"
    assert main(["specialize", str(SRC), str(dst), "--backend", spec]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "timed out after 0.5 s on a delegate blob (stopped with its process group)" in err
    assert not dst.exists()
    bad = "command@XnnpackBackend=timeout=-1 cat"
    assert main(["specialize", str(SRC), str(dst), "--backend", bad]) == EXIT_BAD_INPUT
    assert "the command backend's timeout=-1" in capsys.readouterr().err


# ------------------------------------------------------------------ messages
def test_a_script_whose_interpreter_is_missing_is_not_called_missing(tmp_path: Path) -> None:
    script = tmp_path / "pack.py"
    script.write_text("#!/usr/bin/python9.99 -u\nprint(1)\n")
    script.chmod(0o755)
    with pytest.raises(BackendError) as info:
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=[CommandBackend([str(script)])])
    assert str(info.value) == (
        "backend 'XnnpackBackend' (ptestore.backends.command:CommandBackend), method "
        f"'forward': command '{script}' exists but cannot be executed: the interpreter its "
        "#! line names, '/usr/bin/python9.99', is missing"
    )


def test_a_program_not_found_or_not_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BackendError) as info:
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=["command=no-such-program-pt"])
    assert str(info.value).endswith(": command 'no-such-program-pt' not found")
    plain = tmp_path / "bin" / "plain"
    plain.parent.mkdir()
    plain.write_text("echo hi\n")  # not executable
    with pytest.raises(BackendError) as info:
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=[CommandBackend([str(plain)])])
    assert str(info.value).endswith(
        f": command '{plain}' cannot be executed: Permission denied (is it executable?)"
    )
    on_path = tmp_path / "bin" / "packer"
    on_path.write_text("#!/nonexistent/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(BackendError) as info:
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=["command=packer"])
    assert str(info.value).endswith(
        f": command 'packer' ({on_path}) exists but cannot be executed: the interpreter its "
        "#! line names, '/nonexistent/sh', is missing"
    )


def test_a_program_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    backend = CommandBackend(["sh", "-c", "cat >/dev/null; echo dying >&2; kill -9 $$"])
    with pytest.raises(BackendError) as info:
        ptestore.specialize(SRC, tmp_path / "o.pte", backends=[backend])
    assert str(info.value) == (
        "backend 'XnnpackBackend' (ptestore.backends.command:CommandBackend), method "
        "'forward': command \"sh -c 'cat >/dev/null; echo dying >&2; kill -9 $$'\" was "
        "killed by SIGKILL on a delegate blob: dying"
    )
