"""Which failures of the runtime's child ``make_cache`` remembers as a refusal
(:mod:`ptestore.xnnpack.refusal`), with a stand-in for the child's interpreter: a shell
script that fails as asked (blocks on a FIFO until stopped by the timeout, kills itself
with a signal, exits 1, or refuses with exit 3 and a reason) and counts its runs. A
failure that may pass (timeout, SIGKILL, SIGTERM, exit 1) is raised ``transient`` and
not remembered: the next call runs the child again; a deterministic one (the child's own
refusal, SIGSEGV) is remembered and raised again without a run until
``retry_refused=True``. A refusal record of an earlier version (no ``"kind"``) of a
failure that may pass, or a damaged one, is no refusal."""

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
MAKING = "while making the packed-weight file"

BEHAVIOUR = {
    "timeout": 'read line < "$FIFO"',  # blocks: no one writes the FIFO
    "SIGKILL": "kill -KILL $$",
    "SIGTERM": "kill -TERM $$",
    "exit1": "echo 'ModuleNotFoundError: no torch' >&2; exit 1",
    "SIGSEGV": "kill -SEGV $$",
    "refuses": 'echo \'{"reason": "probe says no"}\' > "$(dirname "$3")/error.json"; exit 3',
}


@pytest.fixture
def child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``set(kind)``: the child's interpreter now fails as ``kind``; ``runs()``: how many
    times it ran."""
    runs = tmp_path / "runs"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("FIFO", str(fifo))

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


@pytest.mark.parametrize(
    ("old", "read"),
    [
        (f"the runtime did not finish {MAKING} within 0.5 s", False),
        (f"the ExecuTorch runtime crashed (SIGKILL, exit 137) {MAKING}", False),
        (f"the runtime exited with 1 {MAKING}", False),
        (f"the ExecuTorch runtime crashed (SIGSEGV, exit 139) {MAKING}", True),
        (f"{MAKING}: probe says no", True),
    ],
)
def test_an_earlier_versions_refusal_is_read_by_its_kind(
    child, tmp_path: Path, old: str, read: bool
) -> None:  # type: ignore[no-untyped-def]
    child.set("refuses")
    directory = tmp_path / "d"
    directory.mkdir()
    identity = Identity.of(file_sha256(MLP), None, executorch_build())
    _refused_path(directory).write_text(json.dumps({"identity": identity.to_json(), "reason": old}))
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
out = subprocess.run([{python!r}, *sys.argv[1:]], stderr=subprocess.PIPE, text=True)
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
