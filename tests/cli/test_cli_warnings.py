"""The library's warnings while a command runs (``ptestore._log``): a ``ptestore.*``
record no handler takes is a line in the command line's own form,
``ptestore COMMAND: warning: MESSAGE``, for every command (it reached stderr bare,
through :mod:`logging`'s last resort, for every command but ``ensure``'s two
served-unchanged warnings); a record a handler takes (an application's, pytest's, the
one ``-v`` installs) goes there alone; outside a command nothing changes."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ptestore
from ptestore._log import get_logger
from ptestore.cli.exits import guarded
from ptestore.errors import StorageError

#: The tree of the ptestore under test (a fresh interpreter imports it).
TREE = Path(ptestore.__file__).resolve().parents[1]

#: A version 3 index of m/a and m/b, then a version 2 index of m/a written over its root
#: (an older ptestore's copy): a device's look-up answers from it with a warning
#: (tests/fleet/test_index_guards.py); then two commands and a library call, in one
#: process.
PROBE = """\
import json, sys
from ptestore.fleet.index import create_index, publish_entries
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.writers import open_writer

url = sys.argv[1]
create_index(url)
old = [synthetic_entry("m", "a")]
publish_entries(url, [*old, synthetic_entry("m", "b")], {})
w = open_writer(url, auto_mkdir=True)
w.write(json.dumps({"format": "ptestore.index", "version": 2, "entries": old}).encode(), 0)
w.publish("overwrite")
print("--- made", file=sys.stderr, flush=True)

from ptestore.cli import main
from ptestore.fleet.select import select

for argv in (sys.argv[2:], ["inspect", sys.argv[1] + ".missing"]):
    main(argv)
    print("--- command", file=sys.stderr, flush=True)
select(url, "m", "a")  # a library call, no command: logging's own form
"""


def _run(tmp_path: Path, *flags: str) -> tuple[list[str], str]:
    """PROBE in a fresh interpreter (logging unconfigured, as the console script has
    it): the lines on stderr after the index is made, and the index's warning."""
    url = str(tmp_path / "fleet" / "ptestore-index.json")
    argv = ["select", url, "--model", "m", "--device", "a", *flags]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url, *argv],
        env=dict(os.environ, PYTHONPATH=str(TREE)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    shards = next(p.name for p in (tmp_path / "fleet").iterdir() if p.is_dir())
    message = (
        f"{url}: index version = 2: must be 3 (beside it, {shards} holds root.json, the copy "
        "of the version 3 root that named it: an older ptestore wrote this version 2 index "
        "over the migrated one, and what was published into version 3 since is only there; "
        "see docs/fleet.md, Versions 1 and 2)"
    )
    return lines[lines.index("--- made") + 1 :], message


def test_a_warning_of_a_command_other_than_ensure_is_a_line_in_its_form(
    tmp_path: Path,
) -> None:
    """``select``'s warning (fleet/index.py) was printed bare by logging's last resort;
    now in ``select``'s form. The next command (its own failure line), and then a
    library call in the same process, outside any command: logging's form again."""
    lines, message = _run(tmp_path)
    missing = f"{tmp_path}/fleet/ptestore-index.json.missing"
    assert lines == [
        f"ptestore select: warning: {message}",
        "--- command",
        f"ptestore inspect: error: {missing}: no such file",
        "ptestore inspect: (--debug prints the full traceback, FileNotFoundError included)",
        "--- command",
        message,  # the library's record, bare, as before
    ]


def test_with_v_a_warning_is_the_handler_s_record_alone(tmp_path: Path) -> None:
    """``-v`` installs the CLI's handler: the warning is its record, printed once (not
    also as a ``warning:`` line); the handler is gone after the command."""
    lines, message = _run(tmp_path, "-v")
    mine = [line for line in lines if message in line]
    assert mine == [f"ptestore.fleet.index: WARNING: {message}", message], lines
    assert not [line for line in lines if line.startswith("ptestore select: warning:")]


@contextlib.contextmanager
def _unconfigured() -> Iterator[None]:
    """Logging as a fresh ``ptestore`` process has it: no handler anywhere (pytest's own
    on the root logger set aside), its records reaching the last resort, which every
    command puts back."""
    handlers, last = logging.root.handlers, logging.lastResort
    logging.root.handlers = []
    try:
        yield
    finally:
        logging.root.handlers = handlers
    assert logging.lastResort is last


def _warns(text: str) -> None:
    get_logger("ptestore.test").warning("%s: %s", text, "said")


def test_sequential_and_nested_commands_restore_the_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each command's lines name it, an inner one's its own; each puts the state back
    when it ends, failing or not (tests call ``main`` many times in one process)."""

    def inner(args: argparse.Namespace) -> int:
        _warns("s3://b/k\nforged")
        raise StorageError("failed")

    def outer(args: argparse.Namespace) -> int:
        _warns("before")
        assert guarded("gc")(inner)(argparse.Namespace()) == 1
        _warns("after")
        return 0

    with _unconfigured():
        assert guarded("fleet")(outer)(argparse.Namespace()) == 0
        get_logger("ptestore.test").warning("%s", "outside\nas it is")
        logging.getLogger("other").warning("another library's")
    assert capsys.readouterr().err.splitlines() == [
        "ptestore fleet: warning: before: said",
        "ptestore gc: warning: s3://b/k\\nforged: said",
        "ptestore gc: error: failed",
        "ptestore fleet: warning: after: said",
        "outside",
        "as it is",
        "another library's",
    ]


def test_in_a_command_other_loggers_keep_the_last_resort_and_handlers_their_records(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Only ``ptestore.*`` records take the command's form; a logger with a handler of
    its own (an application's) gets the record, and nothing is printed twice."""

    def run(args: argparse.Namespace) -> int:
        logging.getLogger("another.library").warning("not ours")
        get_logger("ptestore.test").warning("no handler")
        logging.getLogger("ptestore").addHandler(caplog.handler)  # an app's, say
        try:
            get_logger("ptestore.test").warning("the app's")
        finally:
            logging.getLogger("ptestore").removeHandler(caplog.handler)
        return 0

    with _unconfigured():
        assert guarded("cache")(run)(argparse.Namespace()) == 0
    assert capsys.readouterr().err.splitlines() == [
        "not ours",
        "ptestore cache: warning: no handler",
    ]
    assert [r.getMessage() for r in caplog.records] == ["the app's"]


def test_a_last_resort_an_application_removed_stays_removed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``logging.lastResort = None`` asks for silence: a command prints no line either
    (logging's own one-off notice that no handler was found, as without a command)."""
    monkeypatch.setattr(logging, "lastResort", None)

    def run(args: argparse.Namespace) -> int:
        get_logger("ptestore.test").warning("%s", "silenced")
        return 0

    with _unconfigured():
        assert guarded("gc")(run)(argparse.Namespace()) == 0
    err = capsys.readouterr().err
    assert "silenced" not in err and "ptestore gc" not in err, err


def test_a_command_under_configured_logging_prints_no_line(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """pytest's handlers are configured logging: the record goes to them, as before."""

    def run(args: argparse.Namespace) -> int:
        get_logger("ptestore.test").warning("%s", "to the handler")
        return 0

    with caplog.at_level(logging.WARNING, logger="ptestore"):
        assert guarded("gc")(run)(argparse.Namespace()) == 0
    assert capsys.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records] == ["to the handler"]


def test_a_command_that_logs_nothing_imports_no_logging(tmp_path: Path) -> None:
    """The command's form costs nothing until there is a record: ``logging`` is not
    imported for a command that logs none (the last resort is replaced only then)."""
    probe = (
        "import json, sys\n"
        "from ptestore.cli import main\n"
        "status = main(sys.argv[1:])\n"
        "print(json.dumps([status, 'logging' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "backends", "--json"],
        env=dict(os.environ, PYTHONPATH=str(TREE)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [0, False], done.stderr


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("can't start new thread"),
        ImportError(
            "/usr/lib/python3.11/lib-dynload/_ssl.so: failed to map segment from shared object"
        ),
    ],
    ids=["thread", "shared-object"],
)
def test_running_out_of_memory_outside_an_allocation_is_one_line(
    exc: BaseException, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool's thread that cannot start, a lazy import whose shared object cannot be
    mapped (both under ``ulimit -v``): the out-of-memory line and exit 1, as a
    ``MemoryError`` (they were tracebacks); another ``RuntimeError`` or ``ImportError``
    is a bug and keeps its traceback."""
    from ptestore.cli.exits import guarded

    def run(args: argparse.Namespace) -> int:
        raise exc

    assert guarded("fetch", publishes=True)(run)(argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert err == (
        f"ptestore fetch: failed, nothing published: out of memory ({exc}): an allocation "
        "failed (the process's address-space limit, ulimit -v, or the machine's memory); "
        "rerun with more memory\n"
    )

    def bug(args: argparse.Namespace) -> int:
        raise type(exc)("a bug")

    with pytest.raises(type(exc), match="a bug"):
        guarded("fetch")(bug)(argparse.Namespace())
