"""Which failures of the runtime's child ``make_cache`` remembers as a refusal
(:mod:`ptestore.xnnpack.refusal`), with a stand-in for the child's interpreter: a shell
script that fails as asked (blocks on a FIFO until stopped by the timeout, kills itself
with a signal, exits 1, or refuses with exit 3 and a reason) and counts its runs. A
failure that may pass (timeout, SIGKILL, SIGTERM, exit 1) is raised ``transient`` and
not remembered: the next call runs the child again; a deterministic one (the child's own
refusal, SIGSEGV) is remembered and raised again without a run until
``retry_refused=True``. A real Python child that aborts (SIGABRT): after the message of
a ``std::bad_alloc`` it may pass, else it is run once more and only a second abort is
remembered. The real runtime on a full tmpfs dies of SIGBUS under its mapping of the
file: that may pass. A refusal record of an earlier version (no ``"kind"``, or a SIGBUS
recorded as deterministic) of a failure that may pass, or a damaged one, is no refusal.
The child imports the maker's ``ptestore``."""

from __future__ import annotations

import json
import os
import pickle
import stat
import sys
from pathlib import Path

import pytest

from ptestore.errors import PackedWeightsRefused
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import make_cache
from ptestore.xnnpack.identity import Identity, file_sha256
from ptestore.xnnpack.native import executorch_build

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

MLP = Path(__file__).parents[1] / "fixtures" / "mlp_xnnpack.pte"
CONV = Path(__file__).parents[1] / "fixtures" / "conv_xnnpack.pte"
MAKING = "while making the packed-weight file"
#: What a crash by SIGBUS adds to its reason (a failure that may pass).
MAPPED = (
    "SIGBUS: a page of a file the runtime mapped could not be read or written, "
    "e.g. a full disk or quota, an I/O error"
)

BEHAVIOUR = {
    "timeout": 'read line < "$FIFO"',  # blocks: no one writes the FIFO
    "SIGKILL": "kill -KILL $$",
    "SIGTERM": "kill -TERM $$",
    "exit1": "echo 'ModuleNotFoundError: no torch' >&2; exit 1",
    "SIGSEGV": "kill -SEGV $$",
    "refuses": 'echo \'{"reason": "probe says no"}\' > "$(dirname "$3")/error.json"; exit 3',
    # the runtime's own refusals of an allocation: XNNPACK's status in the delegate's log
    # (ExecuTorch returns Internal, 0x1), and the bindings' MemoryAllocationFailed (0x21)
    "refuses_xnn_oom": (
        "echo 'E 00:00:00.100 executorch:XNNCompiler.cpp:1 XNN Runtime creation failed with "
        'code: xnn_status_out_of_memory\' >&2; echo \'{"reason": "the runtime failed: '
        'Failed to load method forward, error: 0x:1"}\' > "$(dirname "$3")/error.json"; exit 3'
    ),
    "refuses_0x21": (
        'echo \'{"reason": "the runtime failed: Failed to load method forward, error: 0x:21"}\' '
        '> "$(dirname "$3")/error.json"; exit 3'
    ),
    # a real Python child that prints what it is told and calls os.abort()
    "SIGABRT": 'exec "$PY" "$ABORTS" "ptestore xnnpack shim: an ExecuTorch runtime check failed"',
    "bad_alloc": (
        'exec "$PY" "$ABORTS" "terminate called after throwing an instance of '
        '\'std::bad_alloc\'" "  what():  std::bad_alloc"'
    ),
}
#: The first run half-makes the file and aborts; the next ones fail (exit 9) if they find
#: that file, else refuse (exit 3 with a reason).
BEHAVIOUR["abort_once"] = (
    f'[ "$(wc -l < "$RUNS")" -gt 1 ] || {{ : > "$(dirname "$3")/packed.xpwc"; '
    f'{BEHAVIOUR["SIGABRT"]}; }}\n[ -e "$(dirname "$3")/packed.xpwc" ] && exit 9\n'
    f"{BEHAVIOUR['refuses']}"
)
#: The child of the aborting runs: its arguments to stderr, then os.abort() (SIGABRT).
ABORTS = "import os, sys\nfor line in sys.argv[1:]:\n    print(line, file=sys.stderr)\nos.abort()\n"


@pytest.fixture
def child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``set(kind)``: the child's interpreter now fails as ``kind``; ``runs()``: how many
    times it ran."""
    runs = tmp_path / "runs"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    aborts = tmp_path / "aborts.py"
    aborts.write_text(ABORTS)
    monkeypatch.setenv("FIFO", str(fifo))
    monkeypatch.setenv("RUNS", str(runs))
    monkeypatch.setenv("PY", sys.executable)
    monkeypatch.setenv("ABORTS", str(aborts))

    class Child:
        @staticmethod
        def set(kind: str) -> None:
            script = tmp_path / f"python-{kind}"
            script.write_text(f'#!/bin/sh\necho run >> "{runs}"\n{BEHAVIOUR[kind]}\n')
            script.chmod(0o755)
            monkeypatch.setattr(sys, "executable", str(script))

        @staticmethod
        def runs() -> int:
            return len(runs.read_text().splitlines()) if runs.exists() else 0

    return Child


def _make(directory: Path, **kwargs: object) -> PackedWeightsRefused:
    with pytest.raises(PackedWeightsRefused) as info:
        make_cache(MLP, directory=directory, **kwargs)  # type: ignore[arg-type]
    return info.value


def _refused_path(directory: Path) -> Path:
    identity = Identity.of(file_sha256(MLP), None, executorch_build())
    return directory / f"{identity.name}.refused.json"


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("timeout", f"the runtime did not finish {MAKING} within 0.2 s"),
        ("SIGKILL", f"the ExecuTorch runtime crashed (SIGKILL, exit 137) {MAKING}"),
        ("SIGTERM", f"the ExecuTorch runtime crashed (SIGTERM, exit 143) {MAKING}"),
        (
            "exit1",
            f"the runtime exited with 1 {MAKING}; its last messages: ModuleNotFoundError: no torch",
        ),
    ],
)
def test_a_failure_that_may_pass_is_not_remembered(
    child, tmp_path: Path, kind: str, reason: str
) -> None:  # type: ignore[no-untyped-def]
    child.set(kind)
    first = _make(tmp_path / "d", timeout=0.2)
    assert first.transient and first.reason == reason
    assert not _refused_path(tmp_path / "d").exists()
    assert not list((tmp_path / "d").glob(".xnnpack-*"))  # its work directory went
    again = _make(tmp_path / "d", timeout=0.2)  # runs again: nothing remembered
    assert again.reason == reason and child.runs() == 2
    restored = pickle.loads(pickle.dumps(again))  # crosses a process pool as it is
    assert restored.transient and restored.reason == reason


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("SIGSEGV", f"the ExecuTorch runtime crashed (SIGSEGV, exit 139) {MAKING}"),
        ("refuses", f"{MAKING}: probe says no"),
    ],
)
def test_a_deterministic_refusal_is_remembered_until_retried(
    child, tmp_path: Path, kind: str, reason: str
) -> None:  # type: ignore[no-untyped-def]
    child.set(kind)
    first = _make(tmp_path / "d")
    assert not first.transient and first.reason == reason and child.runs() == 1
    record = json.loads(_refused_path(tmp_path / "d").read_text())
    assert record["reason"] == reason and record["kind"] == "deterministic"
    assert _make(tmp_path / "d").reason == f"{reason} (refused before)"
    assert child.runs() == 1  # nothing ran
    assert _make(tmp_path / "d", retry_refused=True).reason == reason
    assert child.runs() == 2


@pytest.mark.skipif(
    os.sysconf("SC_PAGE_SIZE") != 4096, reason="the space left is counted in 4 KiB pages"
)
def test_a_full_disk_under_the_runtimes_mapping_may_pass(tmp_path: Path) -> None:
    """The real runtime writes the packed file through a shared mapping of a sparse
    file: on a file system with room for the reference run (about 16 KiB here) but not
    for the file (20,956 bytes, 6 pages) the page it touches cannot be allocated and the
    child dies of SIGBUS. That is the disk's state, not the program's: transient, not
    remembered, and the same call makes the file once space is freed."""
    from support.smallfs import tmpfs

    with tmpfs(tmp_path / "S", "1m") as small:
        filler = small / "filler"
        st = os.statvfs(small)
        filler.write_bytes(bytes(st.f_bavail * st.f_frsize - 24 * 1024))
        directory = small / "c"
        with pytest.raises(PackedWeightsRefused) as info:
            make_cache(CONV, directory=directory)
        got = info.value
        assert got.transient and got.reason.startswith(
            f"the ExecuTorch runtime crashed (SIGBUS, exit 135) {MAKING} ({MAPPED}); its "
            "last messages: "
        ), got.reason
        identity = Identity.of(file_sha256(CONV), None, executorch_build())
        # no refusal, no work directory left
        assert [p.name for p in directory.iterdir()] == [f"{identity.name}.xpwc.lock"]
        filler.unlink()
        made = make_cache(CONV, directory=directory)
        assert made.made and made.size == 20956


def test_an_abort_that_names_an_allocation_failure_may_pass(child, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real child that aborts (SIGABRT) after the C++ runtime's message of an uncaught
    ``std::bad_alloc``: out of memory, which may pass; not remembered, not run again."""
    child.set("bad_alloc")
    first = _make(tmp_path / "d")
    assert first.transient and first.reason == (
        f"the runtime ran out of memory (SIGABRT, exit 134) {MAKING}; its last messages: "
        "terminate called after throwing an instance of 'std::bad_alloc' |   what():  "
        "std::bad_alloc"
    )
    assert child.runs() == 1 and not _refused_path(tmp_path / "d").exists()
    assert _make(tmp_path / "d").reason == first.reason and child.runs() == 2


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (
            "refuses_xnn_oom",
            f"the runtime ran out of memory (exit 3) {MAKING}: the runtime failed: Failed to "
            "load method forward, error: 0x:1; its last messages: E 00:00:00.100 "
            "executorch:XNNCompiler.cpp:1 XNN Runtime creation failed with code: "
            "xnn_status_out_of_memory",
        ),
        (
            "refuses_0x21",
            f"the runtime ran out of memory (exit 3) {MAKING}: the runtime failed: Failed to "
            "load method forward, error: 0x:21",
        ),
    ],
)
def test_the_runtimes_own_refusal_of_an_allocation_may_pass(
    child, tmp_path: Path, kind: str, reason: str
) -> None:  # type: ignore[no-untyped-def]
    """The child's own refusal (exit 3) whose reason or messages name a failed
    allocation (the bindings' 0x21, XNNPACK's ``xnn_status_out_of_memory``) is the
    memory of the moment, not the program: raised ``transient``, not remembered."""
    child.set(kind)
    first = _make(tmp_path / "d")
    assert first.transient and first.reason == reason and child.runs() == 1
    assert not _refused_path(tmp_path / "d").exists()
    assert _make(tmp_path / "d").reason == reason and child.runs() == 2


def test_an_abort_is_remembered_only_when_it_happens_twice_in_a_row(child, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real child that aborts without naming an allocation failure is run once more at
    once; the second abort is remembered as the refusal."""
    child.set("SIGABRT")
    first = _make(tmp_path / "d")
    reason = (
        f"the ExecuTorch runtime crashed (SIGABRT, exit 134) {MAKING} (twice in a row); its "
        "last messages: ptestore xnnpack shim: an ExecuTorch runtime check failed"
    )
    assert not first.transient and first.reason == reason and child.runs() == 2
    record = json.loads(_refused_path(tmp_path / "d").read_text())
    assert record["reason"] == reason and record["kind"] == "deterministic"
    assert _make(tmp_path / "d").reason == f"{reason} (refused before)" and child.runs() == 2


def test_an_abort_that_does_not_happen_again_is_not_the_refusal(child, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The first run half-makes the file and aborts; the second, which finds no file
    (removed before it ran), ends its own way, and that is what counts."""
    child.set("abort_once")
    got = _make(tmp_path / "d")
    assert got.reason == f"{MAKING}: probe says no" and child.runs() == 2


def test_the_child_imports_the_makers_ptestore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another ``ptestore`` first on the child's ``PYTHONPATH`` (as a maker that imported
    its own through ``sys.path`` leaves it) is not the one the child runs: the real child
    of this tree ends on the request it lacks (exit 1), the other's would refuse."""
    from ptestore.xnnpack.runs import ChildRun

    decoy = tmp_path / "decoy" / "ptestore"
    (decoy / "xnnpack").mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "xnnpack" / "__init__.py").write_text("")
    (decoy / "xnnpack" / "child.py").write_text(
        "import json, sys\nfrom pathlib import Path\n"
        "def main(argv):\n"
        "    out = Path(argv[0]).parent / 'error.json'\n"
        "    out.write_text(json.dumps({'reason': 'the decoy ran'}))\n"
        "    return 3\n"
        "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(decoy.parent))
    monkeypatch.chdir(decoy)  # not the working directory's either
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PackedWeightsRefused) as info:
        ChildRun(work, "t").run({}, "a.pte", "while testing", None)
    assert info.value.transient and info.value.reason.startswith(
        "the runtime exited with 1 while testing; its last messages: "
    )
    assert info.value.reason.endswith("KeyError: 'out'")


@pytest.mark.parametrize(
    ("old", "read"),
    [
        (f"the runtime did not finish {MAKING} within 0.5 s", False),
        (f"the ExecuTorch runtime crashed (SIGKILL, exit 137) {MAKING}", False),
        (f"the runtime exited with 1 {MAKING}", False),
        (f"the ExecuTorch runtime crashed (SIGSEGV, exit 139) {MAKING}", True),
        (f"{MAKING}: probe says no", True),
        # remembered as deterministic before a SIGBUS was known to be the disk's
        (f"the ExecuTorch runtime crashed (SIGBUS, exit 135) {MAKING}", False),
    ],
)
@pytest.mark.parametrize("kind", [None, "deterministic"])
def test_an_earlier_versions_refusal_is_read_by_its_kind(
    child, tmp_path: Path, old: str, read: bool, kind: str | None
) -> None:  # type: ignore[no-untyped-def]
    """A record without a ``"kind"`` (before kinds were recorded), or one an earlier
    version recorded as deterministic, is a refusal only when its reason is not of a
    failure that may pass by today's rules."""
    child.set("refuses")
    directory = tmp_path / "d"
    directory.mkdir()
    identity = Identity.of(file_sha256(MLP), None, executorch_build())
    record = {"identity": identity.to_json(), "reason": old}
    if kind is not None:
        record["kind"] = kind
    _refused_path(directory).write_text(json.dumps(record))
    got = _make(directory)
    if read:
        assert got.reason == f"{old} (refused before)" and child.runs() == 0
    else:  # made again, and the new (deterministic) refusal replaces the old one
        assert got.reason == f"{MAKING}: probe says no" and child.runs() == 1
        assert json.loads(_refused_path(directory).read_text())["kind"] == "deterministic"


@pytest.mark.parametrize("damage", ["list", "no reason", "deep", "fifo", "huge"])
def test_a_damaged_refusal_record_is_no_refusal(child, tmp_path: Path, damage: str) -> None:  # type: ignore[no-untyped-def]
    child.set("refuses")
    directory = tmp_path / "d"
    directory.mkdir()
    path = _refused_path(directory)
    if damage == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(
            {
                "list": "[]",
                "no reason": '{"reason": 3}',
                "deep": "[" * 200_000,
                "huge": json.dumps({"reason": "x" * (1 << 17)}),
            }[damage]
        )
    assert _make(directory).reason == f"{MAKING}: probe says no" and child.runs() == 1
    assert stat.S_ISREG(path.lstat().st_mode)  # replaced by the new refusal


def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition()`` until true; fail after a generous ceiling."""
    import time

    deadline = time.monotonic() + 120
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_the_child_dies_with_a_killed_maker(tmp_path: Path) -> None:
    """The maker (a process of its own) is SIGKILLed while its child runs: the child
    (a stand-in that asks :func:`~ptestore.xnnpack.child.die_with` what the real one
    asks, then blocks on a FIFO no one writes) is killed with it instead of running on."""
    import subprocess
    import textwrap

    pid_file, hold = tmp_path / "child.pid", tmp_path / "hold"
    os.mkfifo(hold)
    stand_in = tmp_path / "python"
    code = (
        "import json, os, sys; from ptestore.xnnpack.child import die_with; "
        "die_with(json.load(open(sys.argv[-1]))['parent']); "
        f"open('{pid_file}', 'w').write(str(os.getpid())); open('{hold}').read()"
    )
    stand_in.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{code}" "$@"\n')
    stand_in.chmod(0o755)
    maker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys
                sys.executable = {str(stand_in)!r}
                from ptestore.xnnpack import make_cache
                make_cache({str(MLP)!r}, directory={str(tmp_path / "d")!r})
            """),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        _until(lambda: pid_file.exists() or maker.poll() is not None, "the child to start")
        assert pid_file.exists(), "the maker ended before its child blocked"
        _until(lambda: pid_file.read_text() != "", "the child's pid")
        child_pid = int(pid_file.read_text())
    finally:
        maker.kill()
        maker.wait()

    def gone() -> bool:
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state == "Z"

    _until(gone, "the child to end with its maker")


SILENT_RELOAD = """#!{python}
# The real child, except that the reload does not load the finished file and the runtime
# logs nothing about its cache (as a build without its Info log would): the reload must
# still be proven by the child's own report, never taken for one on silence.
import json, os, subprocess, sys
req_path = sys.argv[-1]
req = json.loads(open(req_path).read())
req["parent"] = os.getpid()  # the real child dies with this stand-in
if [s["name"] for s in req["steps"]] == ["reloaded"]:
    req["steps"][0]["cache"] = None
open(req_path, "w").write(json.dumps(req))
out = subprocess.run(  # the artifact's descriptors passed on (its /proc/self/fd/N)
    [{python!r}, *sys.argv[1:]], stderr=subprocess.PIPE, text=True, close_fds=False
)
sys.stderr.write("".join(l for l in out.stderr.splitlines(True) if "packed weight" not in l))
sys.exit(out.returncode)
"""


def test_a_reload_that_did_not_load_the_file_is_refused_without_its_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "python-silent"
    script.write_text(SILENT_RELOAD.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    refused = _make(tmp_path / "d")
    assert refused.reason == "the runtime did not load the finished file on reload (not mapped)"
    assert not refused.transient
    assert not list((tmp_path / "d").glob("*.xpwc"))  # nothing published
