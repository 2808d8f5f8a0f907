"""SIGTERM and SIGHUP handlers that native code installed survive ptestore's scopes
(``ptestore._signals``): an in-place ``ensure`` (which holds the signals from its
journal's commit until its entry is recorded) and ``termination_as_interrupt`` put back
the process's real handlers, not what :func:`signal.getsignal` believes.

- An app hosting Python (a C program: ``sigaction`` for SIGTERM and SIGHUP, then
  ``Py_Initialize``): Python reports None for those handlers. The scopes used to "restore"
  None (a ``TypeError`` out of an ``ensure`` that had rewritten and recorded the file) and
  left the finished hold's ``_catch`` installed, swallowing every later SIGTERM.
- A handler installed after Python started (``ctypes``: ``libc.signal``): Python reports a
  stale ``SIG_DFL``; the scopes "restored" it and the next SIGHUP killed the process.
- A child forked from another thread during a hold: SIGTERM used to be swallowed by the
  parent's hold; the child now gets the previous handlers.

Signals are sent to the process itself (taken before ``kill`` returns); no waits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import copy_pte

import ptestore
from ptestore import _libc, _signals

#: The tree under test and the tests' own directory (``support``) for the children.
TREE = Path(ptestore.__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parents[1]
BACKEND = "support.counting_backend:Counting=1.0"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the native layouts tested are Linux's"
)

HOST_C = r"""
#include <Python.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* The app's own handler: says that it ran (write(2) is async-signal-safe). */
static void on_signal(int signum) {
    char line[] = "native handler: 00\n";
    line[16] = '0' + signum / 10;
    line[17] = '0' + signum % 10;
    write(1, line, sizeof line - 1);
}

/* host PYTHON SCRIPT ARGS...: the handlers first, then Python runs SCRIPT (PYTHON names
   the interpreter whose environment, a venv, it takes); once Python has finished, the
   handlers must still be the app's. */
int main(int argc, char **argv) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGHUP, &action, NULL);

    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, argv[1]);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesArgv(&config, argc - 1, argv + 1);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        Py_ExitStatusException(status);
    int rc = Py_RunMain();

    raise(SIGTERM);
    raise(SIGHUP);
    char done[] = "host: python exited 0\n";
    done[20] = '0' + rc % 10;
    write(1, done, sizeof done - 1);
    return rc;
}
"""

#: What the hosted Python does: either a ``termination_as_interrupt`` scope, or an
#: in-place ``ensure`` (SIGNAL, unless "none", sent to itself while the run holds the
#: signals, between its commit and its apply) and the same ``ensure`` again (a hit: the
#: file was recorded); then SIGTERM and SIGHUP.
SCRIPT = r"""
import os, signal, sys
import ptestore
from ptestore._signals import termination_as_interrupt

src, cache, backend, what, during = sys.argv[1:6]


def shown(handler):
    if isinstance(handler, signal.Handlers) or handler is None:
        return str(getattr(handler, "name", handler))
    return getattr(handler, "__qualname__", repr(handler))


def say(what):
    print(what, *(shown(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGHUP)), flush=True)


def step(name, call):
    try:
        print(name, call(), flush=True)
    except BaseException as exc:
        print(name, "raised", type(exc).__name__, exc, flush=True)


def scope():
    with termination_as_interrupt():
        pass
    return "done"


def ensure():
    made = ptestore.ensure(src, cache_dir=cache, in_place=True, backends=[backend])
    return f"created={made.created} in_place={made.in_place}"


if during != "none":
    from ptestore.coordinator import inplace

    real = inplace.apply_uninterrupted

    def signalled_first(*args):
        os.kill(os.getpid(), getattr(signal, during))
        real(*args)

    inplace.apply_uninterrupted = signalled_first

say("python sees:")
if what == "scope":
    step("termination_as_interrupt:", scope)
else:
    step("ensure:", ensure)
say("python sees:")
if what == "ensure":
    step("ensure again:", ensure)
for s in (signal.SIGTERM, signal.SIGHUP):
    os.kill(os.getpid(), s)
print("python done", flush=True)
"""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TREE), str(TESTS)])
    env.pop("PTESTORE_TEST_CALLS", None)
    return env


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C host, built against this interpreter's libpython."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    include = sysconfig.get_paths()["include"]
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION")
    if compiler is None or not (Path(include) / "Python.h").is_file():
        pytest.skip("no C compiler or no Python.h: the embedding host cannot be built")
    work = tmp_path_factory.mktemp("host")
    (work / "host.c").write_text(HOST_C)
    argv = [compiler, "-o", str(work / "host"), str(work / "host.c"), f"-I{include}"]
    argv += [f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{libdir}"]
    built = subprocess.run(argv, capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"the embedding host does not build here (no libpython?): {built.stderr}")
    return work / "host"


def _hosted(host: Path, tmp_path: Path, what: str, during: str) -> tuple[str, int, str]:
    src, cache = copy_pte(tmp_path / "model.pte"), tmp_path / "cache"
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    argv = [str(host), sys.executable, str(script), str(src), str(cache), BACKEND, what, during]
    done = subprocess.run(
        argv, env=_child_env(), capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    return done.stdout, done.returncode, done.stderr


#: What the app's handlers say when SIGTERM and SIGHUP are sent, from Python and then
#: from the host once Python has finished, and how the host ends.
AFTERWARDS = (
    "native handler: 15\n"
    "native handler: 01\n"
    "python done\n"
    "native handler: 15\n"
    "native handler: 01\n"
    "host: python exited 0\n"
)


@pytest.mark.parametrize("during", ["none", "SIGTERM", "SIGHUP"])
def test_an_app_hosting_python_keeps_its_handlers_through_an_in_place_ensure(
    host: Path, tmp_path: Path, during: str
) -> None:
    out, status, err = _hosted(host, tmp_path, "ensure", during)
    held = {"none": "", "SIGTERM": "native handler: 15\n", "SIGHUP": "native handler: 01\n"}
    assert (out, status) == (
        "python sees: None None\n"
        # a signal held by the run goes to the app's handler once the file is recorded,
        # and the call goes on, as the handler lets it
        f"{held[during]}"
        "ensure: created=True in_place=True\n"
        # Python's table takes no None: it says SIG_DFL, as it does for a handler native
        # code installed after Python started
        "python sees: SIG_DFL SIG_DFL\n"
        "ensure again: created=False in_place=True\n" + AFTERWARDS,
        0,
    ), err


def test_an_app_hosting_python_keeps_its_handlers_through_termination_as_interrupt(
    host: Path, tmp_path: Path
) -> None:
    out, status, err = _hosted(host, tmp_path, "scope", "none")
    assert (out, status) == (
        "python sees: None None\n"
        "termination_as_interrupt: done\n"
        "python sees: SIG_DFL SIG_DFL\n" + AFTERWARDS,
        0,
    ), err


LATER = r"""
import ctypes, os, signal, sys
import ptestore
from ptestore._signals import termination_as_interrupt

src, cache, backend = sys.argv[1:4]
if sys.argv[4:] == ["unreadable"]:  # a platform whose struct sigaction is not read
    import ptestore._libc
    ptestore._libc._sigaction_known = lambda: False
for s in (signal.SIGHUP, signal.SIGTERM):  # as a shell starts it (not nohup's SIG_IGN)
    signal.signal(s, signal.SIG_DFL)
fired = []
HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
native = HANDLER(fired.append)
libc = ctypes.CDLL(None)
libc.signal.argtypes = [ctypes.c_int, HANDLER]
libc.signal.restype = ctypes.c_void_p
for s in (signal.SIGHUP, signal.SIGTERM):
    libc.signal(s, native)
seen = lambda: [signal.getsignal(s).name for s in (signal.SIGHUP, signal.SIGTERM)]
print("python sees:", *seen(), flush=True)
with termination_as_interrupt():
    pass
made = ptestore.ensure(src, cache_dir=cache, in_place=True, backends=[backend])
print("ensure: created", made.created, "in place", made.in_place, flush=True)
print("python sees:", *seen(), flush=True)
for s in (signal.SIGHUP, signal.SIGTERM):
    os.kill(os.getpid(), s)
print("the native handler took", fired, flush=True)
"""


@pytest.mark.parametrize("platform", ["readable", "unreadable"])
def test_a_handler_installed_after_python_started_is_kept(tmp_path: Path, platform: str) -> None:
    """``libc.signal(SIGHUP, handler)`` through ctypes: Python still says SIG_DFL; the
    next SIGHUP used to kill the process (exit 129). Where ``struct sigaction`` cannot
    be read, the signal ``/proc`` says is caught is left alone (it was taken over and
    put back as SIG_DFL: the next SIGTERM killed the process, exit 143)."""
    src, cache = copy_pte(tmp_path / "model.pte"), tmp_path / "cache"
    argv = [sys.executable, "-c", LATER, str(src), str(cache), BACKEND, platform]
    done = subprocess.run(
        argv, env=_child_env(), capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert (done.stdout, done.returncode) == (
        "python sees: SIG_DFL SIG_DFL\n"
        "ensure: created True in place True\n"
        "python sees: SIG_DFL SIG_DFL\n"
        "the native handler took [1, 15]\n",
        0,
    ), done.stderr


def test_a_child_forked_from_another_thread_during_a_hold_is_not_deaf() -> None:
    """The hold's handler in a child forked (from another thread) while the main thread
    holds the signals: SIGTERM takes the child's previous handler (here the default
    action) instead of being kept for a delivery that never comes."""
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    statuses: list[int] = []

    def fork_and_terminate() -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let a Python handler run
            os._exit(0)
        statuses.append(os.waitpid(pid, 0)[1])

    with _signals.signals_held("while testing"):
        thread = threading.Thread(target=fork_and_terminate)
        thread.start()
        thread.join()
    assert len(statuses) == 1
    assert os.WIFSIGNALED(statuses[0]) and os.WTERMSIG(statuses[0]) == signal.SIGTERM, statuses
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_arriving_while_the_handlers_are_put_back_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C sent while the hold puts the handlers back (the signals blocked then) is
    held and delivered with the message, as one a moment earlier."""
    real = _signals._Before.put_back
    sent: list[int] = []

    def interrupted_first(self: Any, signum: int) -> None:
        if not sent:
            sent.append(signum)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        real(self, signum)

    monkeypatch.setattr(_signals._Before, "put_back", interrupted_first)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as info, _signals.signals_held("while testing"):
        pass
    assert sent and info.value.args == ("while testing",)
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.SIGINT not in signal.sigpending()


def test_the_command_line_scope_imports_no_ctypes(tmp_path: Path) -> None:
    """Where ``/proc/self/status`` confirms what Python says (SIGTERM and SIGHUP at their
    default, as in the ``ptestore`` command), no ``sigaction`` is needed: ctypes stays
    out of a cache hit's imports."""
    code = (
        "import sys\nfrom ptestore._signals import termination_as_interrupt\n"
        "with termination_as_interrupt():\n    pass\nprint('ctypes' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert (done.stdout, done.returncode) == ("False\n", 0), done.stderr


def test_sigaction_errors_name_the_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    action = _libc.get_sigaction(signal.SIGTERM)
    assert action is not None and _libc.action_handler(action) == 0  # SIG_DFL
    with pytest.raises(OSError) as info:
        _libc.set_sigaction(signal.SIGKILL, action)
    assert str(info.value) == "[Errno 22] sigaction of signal 9: Invalid argument"
    monkeypatch.setattr(_libc, "_sigaction_known", lambda: False)
    assert _libc.get_sigaction(signal.SIGTERM) is None
    with pytest.raises(OSError) as info:
        _libc.set_sigaction(signal.SIGTERM, action)
    assert str(info.value) == "[Errno 38] sigaction of signal 15: not available here"


def test_a_signal_while_the_scope_takes_over_puts_back_what_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM arriving just after the scope installed its handler, before it recorded
    what it replaced: the previous handler is put back all the same (the scope's stayed
    installed for good, raising Terminated outside any scope)."""
    from ptestore._signals import Terminated, termination_as_interrupt

    def before(signum: int, frame: object) -> None:
        raise AssertionError("not the scope's time")

    real = signal.signal
    previous = real(signal.SIGTERM, before)

    def installing(signum: int, handler: object) -> object:
        old = real(signum, handler)  # type: ignore[arg-type]
        if signum == signal.SIGTERM and handler not in (before, signal.SIG_DFL):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        return old

    monkeypatch.setattr(signal, "signal", installing)
    try:
        with pytest.raises(Terminated), termination_as_interrupt():
            pass
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        monkeypatch.undo()
        real(signal.SIGTERM, previous)


OVER_PYTHON = r"""
import ctypes, os, signal
from ptestore._signals import termination_as_interrupt

fired = []
signal.signal(signal.SIGTERM, lambda s, f: fired.append("python handler"))
HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
native = HANDLER(lambda s: fired.append("native handler"))
libc = ctypes.CDLL(None)
libc.signal.argtypes = [ctypes.c_int, HANDLER]
libc.signal.restype = ctypes.c_void_p
libc.signal(signal.SIGTERM, native)  # over Python's: its table still names the lambda
with termination_as_interrupt():
    pass
os.kill(os.getpid(), signal.SIGTERM)
print(fired, flush=True)
"""


def test_a_native_handler_installed_over_a_python_one_is_put_back() -> None:
    """Python's table names a Python handler, native code installed its own since: the
    scope tells the native one from Python's own C handler (once that is installed) and
    puts it back (taken for Python's, the signal went to the Python handler)."""
    done = subprocess.run(
        [sys.executable, "-c", OVER_PYTHON],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.stdout, done.returncode) == ("['native handler']\n", 0), done.stderr
