"""The command's streams as scripts and pipelines leave them: a page written through a
link to a device or a pipe, stdout full, closed or with its reader gone, stderr closed
or broken, SIGTERM while stdout blocks, usage errors with ``--json``, paths with a line
break. Each runs ``python -m ptestore`` in a process of its own, as a pipeline would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.locks import wait_until

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
PROGRAM = [sys.executable, "-m", "ptestore"]
HAVE_FULL = os.path.exists("/dev/full")


def _src() -> str:
    assert MLP.pte_path is not None
    return str(MLP.pte_path)


def _run(*argv: str, shell: str = "", **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``ptestore ARGV``, its redirections ``shell`` (``>/dev/full``, ``>&-``) made by
    ``sh``; stdout and stderr captured unless redirected."""
    if shell:
        command = ["sh", "-c", f'exec "$@" {shell}', "sh", *PROGRAM, *argv]
    else:
        command = [*PROGRAM, *argv]
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(command, text=True, timeout=300, **kwargs)  # type: ignore[call-overload,no-any-return]


def _no_reader() -> int:
    """The write end of a pipe whose reader is closed: the first write fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    return write


# -- 1. --html FILE and --report FILE: stdout, devices, pipes, links -----------------------


def test_html_through_a_link_to_a_pipe_keeps_the_link(tmp_path: Path) -> None:
    """A link to ``/proc/self/fd/N`` (a pipe): the page goes down the pipe and the link
    stays a link (it was replaced by a regular file holding the page, "wrote so")."""
    read, write = os.pipe()
    link = tmp_path / "so"
    link.symlink_to(f"/proc/self/fd/{write}")
    child = subprocess.Popen(
        [*PROGRAM, "inspect", _src(), "--html", str(link)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write,),
        text=True,
    )
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        page = pipe.read()
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    assert page.startswith(b"<!DOCTYPE html>") and page.endswith(b"</html>\n")
    assert out == f"wrote {link}\n"
    assert link.is_symlink() and os.readlink(link) == f"/proc/self/fd/{write}"


def test_html_to_a_link_to_a_character_device_writes_through(tmp_path: Path) -> None:
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    done = _run("inspect", _src(), "--html", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_html_dash_and_dev_stdout_write_the_page_on_stdout(tmp_path: Path) -> None:
    """``-`` is stdout (it made a file named "-"); so is ``/dev/stdout`` when stdout is a
    regular file: the page is written through stdout, not over it, and no "wrote" line
    follows it."""
    done = _run("inspect", _src(), "--html", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and done.stdout.endswith("</html>\n")
    assert not (tmp_path / "-").exists()
    page = tmp_path / "page.html"
    with open(page, "w") as f:
        done = _run("inspect", _src(), "--html", "/dev/stdout", stdout=f)
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
    assert "wrote" not in text


def test_html_on_stdout_with_json_is_refused(tmp_path: Path) -> None:
    done = _run("inspect", _src(), "--html", "-", "--json")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ptestore inspect: error: --html - writes the page on stdout, where --json writes "
        "its object: give --html a FILE, or leave out --json"
    )
    assert json.loads(done.stdout)["error"]["type"] == "ConfigurationError"


def test_html_to_a_socket_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    where = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(where))
        done = _run("inspect", str(tmp_path / "missing.pte"), "--html", str(where))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"ptestore inspect: error: --html {where}: is a socket: a page is written to a "
        "regular file (replaced atomically), a character device or a FIFO (written "
        "through), or - for stdout"
    )


def test_report_dash_is_the_plans_output(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["passthrough"]\n[[models]]\nname = "m"\nsource = "{_src()}"\n'
        "[devices.a]\n"
    )
    done = _run("fleet", "plan", str(job), "--report", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and not (tmp_path / "-").exists()
    refused = _run("fleet", "plan", str(job), "--report", "-", "--json")
    assert refused.returncode == 2
    assert "--report - writes the report on stdout, where --json" in refused.stderr


# -- 2. a failure while reporting what was published -----------------------------------


@pytest.mark.skipif(not HAVE_FULL, reason="no /dev/full")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_specialize_to_a_full_stdout_says_what_was_published(
    tmp_path: Path, json_flag: list[str]
) -> None:
    out = tmp_path / "o.pte"
    argv = ["specialize", _src(), str(out), "--backend", "passthrough", *json_flag]
    done = _run(*argv, shell=">/dev/full")
    assert done.returncode == 1
    assert done.stderr == (
        f"ptestore specialize: failed after publishing {out}: cannot write the output on "
        "stdout: No space left on device\n"
    )
    assert out.exists()


@pytest.mark.skipif(not HAVE_FULL, reason="no /dev/full")
def test_ensure_to_a_full_stdout_says_what_was_published(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = ["ensure", _src(), "--cache-dir", str(cache), "--backend", "passthrough", "--json"]
    done = _run(*argv, shell=">/dev/full")
    assert done.returncode == 1
    (pte,) = cache.glob("entries/*/model.pte")
    assert done.stderr == (
        f"ptestore ensure: failed after publishing {pte}: cannot write the output on "
        "stdout: No space left on device\n"
    )


def test_sigterm_while_stdout_blocks_says_what_was_published(tmp_path: Path) -> None:
    """stdout a pipe nobody drains (64 KiB in it already): ``ensure --json`` blocks
    writing its document; SIGTERM then says the entry is there (it said "nothing was
    published"), and no error object follows what reached stdout (it wrote the
    document's first ``{`` and then ``{"error": ...``)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    filled = 0
    try:
        while True:
            filled += os.write(write, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)
    cache = tmp_path / "cache"
    argv = ["ensure", _src(), "--cache-dir", str(cache), "--backend", "passthrough", "--json"]
    child = subprocess.Popen([*PROGRAM, *argv], stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)

    def writing_stdout() -> bool:  # blocked in write(1, ...)
        try:
            with open(f"/proc/{child.pid}/syscall") as f:
                return f.read().startswith("1 0x1 ")
        except OSError:
            return child.poll() is not None

    wait_until(writing_stdout, "ensure to block writing its stdout")
    assert child.poll() is None, child.communicate()
    child.send_signal(signal.SIGTERM)
    with os.fdopen(read, "rb") as pipe:
        written = pipe.read()
    _, err = child.communicate(timeout=300)
    assert child.returncode == 130, err
    (pte,) = cache.glob("entries/*/model.pte")
    assert err == f"ptestore ensure: interrupted by SIGTERM after {pte} was published\n"
    assert written[:filled] == b"x" * filled
    assert b'"error"' not in written[filled:]


# -- 3. a failed command piped away keeps its status ------------------------------------


def _failing_job(tmp_path: Path) -> Path:
    """A job of two pairs, the first failing (its destination is a directory)."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["passthrough"]\n[[models]]\nname = "m"\nsource = "{_src()}"\n'
        "[devices.a]\n[devices.b]\n"
    )
    (tmp_path / "out" / "a" / "m.pte").mkdir(parents=True)
    return job


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_failed_fleet_run_piped_away_exits_1(tmp_path: Path, json_flag: list[str]) -> None:
    job = _failing_job(tmp_path)
    write = _no_reader()
    try:
        done = _run("fleet", "run", str(job), "--workers", "1", *json_flag, stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_backends_with_a_broken_one_piped_away_exits_1(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "npu_vendor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npu-vendor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ptestore.backends]\nnpu = npu_missing:Npu\n")
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]  # (CI: none set)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    assert _run("backends", env=env).returncode == 1
    for json_flag in ([], ["--json"]):
        write = _no_reader()
        try:
            done = _run("backends", *json_flag, stdout=write, env=env)
        finally:
            os.close(write)
        assert done.returncode == 1, done.stderr
        assert done.stderr == ""


# -- 4. stdout closed or full: one line, never a traceback ------------------------------


@pytest.mark.skipif(not HAVE_FULL, reason="no /dev/full")
def test_json_to_a_full_stdout_is_one_line(tmp_path: Path) -> None:
    done = _run("inspect", _src(), "--json", shell=">/dev/full")
    assert done.returncode == 1
    assert done.stderr == (
        "ptestore inspect: error: cannot write the output on stdout: No space left on device\n"
    )


def test_closed_stdout_is_one_line(tmp_path: Path) -> None:
    done = _run("inspect", _src(), "--json", shell=">&-")
    assert done.returncode == 1
    assert (
        done.stderr
        == "ptestore inspect: error: cannot write the output on stdout: stdout is closed\n"
    )
    # a verdict's status stays the verdict's
    out = tmp_path / "a" / "m.pte"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/{{device}}/{{model}}.pte"\nbackends = ["passthrough"]\n'
        f'[[models]]\nname = "m"\nsource = "{_src()}"\n[devices.a]\n'
    )
    done = _run("verify", "--job", str(job), shell=">&-")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"{out}: ")


# -- 5. stderr closed or broken -------------------------------------------------------


def test_closed_stderr_leaves_stdout_the_json_alone(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pte"
    done = _run("inspect", str(missing), "--json", shell="2>&-")
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["type"] == "ObjectNotFound"


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["inspect", "missing.pte", "--json"], 2),
        (["select", "IDX", "--model", "nope", "--device", "d"], 2),
    ],
)
def test_broken_stderr_keeps_the_errors_status(
    tmp_path: Path, argv: list[str], status: int
) -> None:
    write = _no_reader()
    try:
        done = _run(*argv, stderr=write, cwd=tmp_path)
    finally:
        os.close(write)
    assert done.returncode == status


# -- 6. usage errors with --json -----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command", "message"),
    [
        (["select", "IDX", "--json"], "select", "the following arguments are required: "),
        (["gc", "d", "--older-than", "xyz", "--json"], "gc", "argument --older-than: "),
        (["inspcet", "--json"], None, "argument COMMAND: invalid choice: 'inspcet'"),
    ],
)
def test_a_usage_error_with_json_prints_the_error_object(
    argv: list[str], command: str | None, message: str
) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    err = json.loads(done.stdout)["error"]
    assert (err["type"], err["exit_code"], err["command"]) == ("UsageError", 2, command)
    assert err["message"].startswith(message)
    assert f"error: {err['message']}" in done.stderr


def test_a_usage_error_without_json_prints_nothing_on_stdout() -> None:
    done = _run("gc", "d", "--older-than", "xyz", "--", "--json")
    assert (done.returncode, done.stdout) == (2, "")


# -- 7. ensure's paths, one line each ---------------------------------------------------


def test_ensure_escapes_a_line_break_in_a_path(tmp_path: Path) -> None:
    cache = tmp_path / "c\nforged"
    done = _run("ensure", _src(), "--cache-dir", str(cache), "--backend", "passthrough")
    assert done.returncode == 0, done.stderr
    (pte,) = cache.glob("entries/*/model.pte")
    assert done.stdout == str(pte).replace("\n", "\\n") + "\n"
