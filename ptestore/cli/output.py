"""What a command writes on stdout and stderr, and what a write that fails means.

Every command of :mod:`ptestore.cli` writes its output through :func:`out` and
:func:`out_json` (a JSON document made whole before any of it is written) and its
warnings through :func:`say`, while :func:`~ptestore.cli.exits.guarded` holds the
command's :class:`Output` (:func:`command_output`). A write to stdout that fails never
stops the command half-way, nor turns its status into another:

- the reader went away (``EPIPE``: ``| head``, ``| true``): the rest of the output is
  dropped and the command ends with its own status (a failure piped away is not a
  success);
- stdout cannot be written (``ENOSPC`` of ``/dev/full``, ``EIO``, closed by ``>&-``):
  the rest is dropped too, and the command ends with one error line (what it published
  first, for one that publishes) and status 1, or its own when that is not 0;
- an error or Ctrl-C once the output began: no ``--json`` error object follows (stdout
  would hold a part of a document and then another one).

:func:`say` writes a line on stderr, never on stdout (``print(file=None)`` falls back to
stdout when ``sys.stderr`` is None), and a stderr that cannot be written (closed, a
broken pipe) is left alone. :func:`standard_streams` (the ``ptestore`` program only)
opens ``/dev/null`` on a standard descriptor that was closed when the process started,
so that no file the command opens takes its number (a backend's child writing on its
stderr into a staging file), and stands a stream in for a closed stdout that refuses
every write.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from contextvars import ContextVar, Token
from typing import Any, TextIO

__all__ = [
    "Output",
    "command_output",
    "out",
    "out_json",
    "published",
    "say",
    "standard_streams",
]


class Output:
    """What became of one command's output so far."""

    def __init__(self) -> None:
        #: The reader of stdout went away (EPIPE): the rest is dropped, quietly.
        self.gone = False
        #: Why stdout could not be written (anything but EPIPE): the rest is dropped.
        self.failed: OSError | None = None
        #: A write of the command's output began (no ``--json`` error object after it).
        self.written = False
        #: A write is under way (an exception now may leave bytes in stdout's buffer).
        self.writing = False
        #: What the command published before it reports (None: nothing yet).
        self.published: str | None = None

    @property
    def dropped(self) -> bool:
        """Whether stdout takes nothing more (its reader gone, or a write failed)."""
        return self.gone or self.failed is not None


_OUTPUT: ContextVar[Output | None] = ContextVar("ptestore_cli_output", default=None)


def command_output() -> tuple[Output, Token[Output | None]]:
    """A new :class:`Output` for the command starting in this context; the token puts
    back the previous one (``_OUTPUT.reset``, in :func:`end_output`)."""
    state = Output()
    return state, _OUTPUT.set(state)


def end_output(token: Token[Output | None]) -> None:
    """The command ended: the :class:`Output` before it is the current one again."""
    _OUTPUT.reset(token)


def published(what: str) -> None:
    """The command published ``what`` (``"out.pte"``, ``"out.ptd and out.pte"``): an
    error or interrupt from now on says so, never "nothing published"."""
    state = _OUTPUT.get()
    if state is not None:
        state.published = what


def out(text: str = "") -> None:
    """``text`` and a line break on stdout, as ``print(text)`` (see the module)."""
    write_stdout(text + "\n")


def out_json(value: Any, *, strict: bool = False) -> None:
    """``value`` as one indented JSON document on stdout, the whole text made before any
    of it is written: an error while making it leaves stdout empty for the error's own
    object. ``strict``: a NaN or infinity is refused (``ValueError``), not written."""
    write_stdout(json.dumps(value, indent=2, allow_nan=not strict) + "\n")


def write_stdout(text: str) -> None:
    """``text`` on stdout, flushed (see the module for a write that fails)."""
    state = _OUTPUT.get()
    stream = sys.stdout
    if state is None:  # outside a command: as print() would
        if stream is not None:
            stream.write(text)
            stream.flush()
        return
    if state.dropped:
        return
    state.written = state.writing = True
    try:
        if stream is None:  # closed when the process started (in-process: no stdout)
            raise OSError(errno.EBADF, "stdout is closed")
        stream.write(text)
        stream.flush()
    except OSError as exc:
        _write_failed(state, stream, exc)
    finally:
        state.writing = False


def flush_stdout(state: Output) -> None:
    """Flush what a command wrote on stdout without :func:`out` (a failure recorded in
    ``state`` as :func:`write_stdout` records it)."""
    stream = sys.stdout
    if stream is None or state.dropped:
        return
    try:
        stream.flush()
    except OSError as exc:
        _write_failed(state, stream, exc)


def _write_failed(state: Output, stream: TextIO | Any, exc: OSError) -> None:
    """A write or flush of stdout failed: its reader gone (a broken pipe: the rest
    dropped quietly) or the failure recorded; stdout silenced either way."""
    if isinstance(exc, BrokenPipeError):
        state.gone = True
    else:
        state.failed = exc
    silence(stream, 1)


def say(line: str) -> None:
    """``line`` on stderr, never on stdout; nothing when stderr cannot be written."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(line + "\n")
        stream.flush()
    except OSError:  # closed, a broken pipe, a full disk: nowhere left to say it
        silence(stream, 2)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (a ``BrokenPipeError``
    raised by a write to stdout that did not go through :func:`out`)."""
    import select  # an error path only

    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def silence(stream: TextIO | Any, fd: int) -> None:
    """Point the process's descriptor ``fd`` at ``/dev/null`` when ``stream`` is the
    process's own stdout or stderr, so that what its buffer still holds is dropped at
    exit (a failed final flush makes the interpreter exit 120, a blocked one never
    exit); a stream of a caller of :func:`~ptestore.cli.main` is left as it is."""
    if stream is not (sys.__stdout__ if fd == 1 else sys.__stderr__):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


class ClosedStream:
    """Stands in for a stdout closed when the process started (``>&-``): every write
    fails with ``EBADF``, so the command says it could not write its output instead of
    dropping it (``print`` to a None ``sys.stdout`` drops it) or failing with an
    ``AttributeError``."""

    closed = False
    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


class NoStream(ClosedStream):
    """Stands in for a stderr closed when the process started (``2>&-``): what is
    written there goes nowhere (never to stdout, where ``print(file=None)`` sends it)."""

    def write(self, text: str) -> int:
        return len(text)


def standard_streams() -> None:
    """For the ``ptestore`` program, before a command runs: each of the descriptors 0, 1
    and 2 that is closed gets ``/dev/null`` (so no file the command opens takes its
    number), and a closed stdout or stderr its stand-in (:class:`ClosedStream`,
    :class:`NoStream`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            opened = os.open(os.devnull, os.O_RDWR)
        except OSError:
            continue
        if opened != fd:  # a lower descriptor was closed too and took it: put it right
            os.dup2(opened, fd)
            os.close(opened)
    if sys.stdout is None:
        sys.stdout = ClosedStream()
    if sys.stderr is None:
        sys.stderr = NoStream()
