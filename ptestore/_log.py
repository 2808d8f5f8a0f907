"""Loggers that cost nothing until :mod:`logging` is in use, and the command line's form
of the records nobody else takes.

Importing :mod:`logging` costs a few milliseconds (it brings ``traceback``, ``string``,
``textwrap`` and ``threading`` locks), paid by every run that merely *might* log. A
:class:`Logger` here is a stand-in for ``logging.getLogger(name)`` that imports nothing
until it must:

- ``debug`` and ``info`` records are dropped while :mod:`logging` was never imported by
  anyone: then nothing can have configured a handler or a level, and an unconfigured
  :mod:`logging` drops them too (the root logger's level is ``WARNING``). Once any code
  imports :mod:`logging` (the command line's ``-v``/``--debug``, an application, pytest),
  every call goes to the real logger, levels and handlers as configured;
- ``warning`` and above always reach the real logger (unconfigured, its last-resort
  handler prints them on stderr), so nothing a user should see is lost.

A record's message and its string and exception arguments show every URL redacted
(:func:`ptestore._redact.redact_urls`: no password nor presigned signature), whoever
handles it.

Records name the caller's line, as with a plain logger (``stacklevel``).

While the command line runs a command (:func:`command_started` ...
:func:`command_ended`, called by :func:`ptestore.cli.exits.guarded`; :data:`COMMAND`
names it), two things change:

- a record's string and exception arguments are made one line for a terminal
  (:func:`ptestore._text.one_line`): a path or a name from a file cannot drive the
  terminal, nor start a line, from a warning either;
- a ``ptestore.*`` record that no handler takes, the one :mod:`logging` gives its last
  resort (``logging.lastResort``: unconfigured, it prints the bare message), is printed
  as the command line prints its own lines: ``ptestore COMMAND: warning: MESSAGE``, one
  line. Records that reach a handler (an application's, pytest's, the one ``-v`` or
  ``--debug`` installs) go there as before, and only there; other loggers' records go to
  the last resort as before. The last resort is replaced for the command only when
  :mod:`logging` is in use (imported before the command, or for its first record): a
  command that logs nothing imports nothing for it.

The command is the process's, not a thread's: the command's own threads (a fleet's
pools, an S3 writer's uploads, :mod:`ptestore._background`) log for it, and none of them
would see a :mod:`contextvars` value set by the thread that runs it. A library caller in
another thread of that process meanwhile sees the same form for a record no handler of
its own takes; one whose logging is configured sees no difference.
"""

from __future__ import annotations

import _thread
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

__all__ = ["COMMAND", "Logger", "command_ended", "command_started", "get_logger"]

#: The command the command line runs (``"ensure"``, ``"fleet"``, ...), None outside one:
#: set by :func:`command_started` (:func:`ptestore.cli.exits.guarded`), never by the
#: library itself.
COMMAND: str | None = None

#: The class of the last resort a command puts in place, once made
#: (:func:`_command_line_class`).
_CLASS: Any = None
#: The commands running (a token each, the last started last): nested ones, or the
#: command lines of several threads of one process, which may end in any order.
_RUNNING: list[tuple[object, str]] = []
#: Held while the commands running, :data:`COMMAND` and the last resort change together
#: (a lock of the interpreter's own module: ``threading`` is not imported for it).
_LOCK = _thread.allocate_lock()


def _lock_anew() -> None:
    """A forked child's lock: one another thread of the parent held at the fork (a
    command starting or ending) would never be released there."""
    global _LOCK
    _LOCK = _thread.allocate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_lock_anew)


def command_started(command: str) -> object:
    """``ptestore COMMAND`` runs from now on: its records are escaped, and those no
    handler takes printed in its form (see the module's docstring). Returns the token
    :func:`command_ended` takes."""
    global COMMAND
    token = object()
    with _LOCK:
        _RUNNING.append((token, command))
        COMMAND = command
        if "logging" in sys.modules:  # in use already (-v, an application, pytest)
            _take_last_resort()
    return token


def command_ended(token: object) -> None:
    """The command of :func:`command_started` (its ``token``) ended: the last one
    started of those still running is the current one; with none, :mod:`logging`'s
    last resort is the one it was before (commands of several threads may end in any
    order: each takes out its own)."""
    global COMMAND
    with _LOCK:
        _RUNNING[:] = [r for r in _RUNNING if r[0] is not token]
        COMMAND = _RUNNING[-1][1] if _RUNNING else None
        if COMMAND is None and _CLASS is not None:  # (made: logging is imported)
            import logging

            ours = logging.lastResort
            if isinstance(ours, _CLASS):
                logging.lastResort = ours.previous


def _take_last_resort() -> None:
    """Put the command line's handler in place of :mod:`logging`'s last resort (once;
    never where an application removed it, ``logging.lastResort = None``: it asked for
    silence)."""
    import logging

    cls = _command_line_class()
    if logging.lastResort is not None and not isinstance(logging.lastResort, cls):
        logging.lastResort = cls(logging.lastResort)


def _command_line_class() -> Any:
    """The class of the last resort a command puts in place (made on first use: it
    subclasses ``logging.Handler``, and :mod:`logging` is imported only when in use)."""
    global _CLASS
    if _CLASS is None:
        import logging

        class CommandLine(logging.Handler):
            """``logging.lastResort`` while a command runs: a ``ptestore.*`` record as
            ``ptestore COMMAND: warning: MESSAGE`` on stderr, any other as the last
            resort it replaced took it."""

            def __init__(self, previous: logging.Handler) -> None:
                super().__init__(previous.level)
                self.previous = previous

            def handle(self, record: logging.LogRecord) -> bool:
                ours = record.name == "ptestore" or record.name.startswith("ptestore.")
                if COMMAND is not None and ours:
                    return bool(super().handle(record))
                return bool(self.previous.handle(record))

            def emit(self, record: logging.LogRecord) -> None:
                try:
                    text = _one_line(record.getMessage())
                    sys.stderr.write(f"ptestore {COMMAND}: warning: {text}\n")
                    sys.stderr.flush()
                except Exception:
                    self.handleError(record)

        _CLASS = CommandLine
    return _CLASS


def _one_line(message: str) -> str:
    """A record's message as one line: every character that is not printable escaped as
    ``repr`` writes it (a line break too), the whole cut to the CLI's line bound. Its
    arguments were cut already (:func:`_shown`): not cut again."""
    from ._text import LINE_CHARS, clipped

    if not message.isprintable():
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return clipped(message, LINE_CHARS)


def _shown(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` as a record during a command takes them (:data:`COMMAND`): strings and
    exceptions (``%s``) as one line, a long name cut and what would act on the terminal
    escaped, line breaks too (:func:`ptestore._text.one_line`): the names a record
    embeds cannot start a line of their own."""
    if COMMAND is None:
        return args
    from ._text import one_line

    def one(a: Any) -> Any:
        if isinstance(a, (str, BaseException)):
            return one_line(str(a))
        return a

    return tuple(one(a) for a in args)


def _redacted(msg: str, args: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """``msg`` and ``args`` with every URL in a string, or in an exception's message,
    shown as :func:`ptestore._redact.redact_urls` shows it (a user's password, a
    presigned query's signature ``REDACTED``): for every handler, the command line's,
    ``-v``'s and an application's alike. An exception whose message holds none is
    passed on as it is."""
    from ._redact import redact_urls

    def one(a: Any) -> Any:
        if isinstance(a, str):
            return redact_urls(a)
        if isinstance(a, BaseException):
            text = str(a)
            shown = redact_urls(text)
            return a if shown == text else shown
        return a

    return redact_urls(msg), tuple(one(a) for a in args)


class Logger:
    """A lazily created ``logging.Logger`` (see the module's docstring)."""

    __slots__ = ("_logger", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    @property
    def logger(self) -> logging.Logger:
        """The real logger (imports :mod:`logging` on first use)."""
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self.name)
        return self._logger

    def debug(self, msg: str, *args: Any) -> None:
        if "logging" in sys.modules:
            self._emit(10, msg, args)

    def info(self, msg: str, *args: Any) -> None:
        if "logging" in sys.modules:
            self._emit(20, msg, args)

    def warning(self, msg: str, *args: Any) -> None:
        self._emit(30, msg, args)

    def error(self, msg: str, *args: Any) -> None:
        self._emit(40, msg, args)

    def log(self, level: int, msg: str, *args: Any) -> None:
        """A record at ``level`` (a :mod:`logging` level number): as :meth:`warning` for
        ``WARNING`` (30) and above, as :meth:`debug` below."""
        if level >= 30 or "logging" in sys.modules:
            self._emit(level, msg, args)

    def _emit(self, level: int, msg: str, args: tuple[Any, ...]) -> None:
        # the arguments are redacted and escaped (a str() each) only for a record the
        # logger keeps
        logger = self.logger
        if logger.isEnabledFor(level):
            if COMMAND is not None:  # logging is in use now: the command's last resort
                _take_last_resort()
            msg, args = _redacted(msg, args)
            logger.log(level, msg, *_shown(args), stacklevel=3)


def get_logger(name: str) -> Logger:
    """The :class:`Logger` for ``name`` (a ``ptestore.*`` logger name)."""
    return Logger(name)
