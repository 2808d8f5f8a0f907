"""Loggers that cost nothing until :mod:`logging` is in use.

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

Records name the caller's line, as with a plain logger (``stacklevel``). While the
command line runs a command (:data:`TERMINAL`), a record's string and exception
arguments are made one line for a terminal (:func:`ptestore._text.one_line`): a path or a
name from a file cannot drive the terminal, nor start a line, from a warning either.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

__all__ = ["TERMINAL", "Logger", "get_logger"]

#: Whether records reach a terminal: set by the command line while a command runs
#: (:func:`ptestore.cli.exits.guarded`), never by the library itself.
TERMINAL = False


def _shown(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` as a record on a terminal takes them (:data:`TERMINAL`): strings and
    exceptions (``%s``) as one line, a long name cut and what would act on the terminal
    escaped, line breaks too (:func:`ptestore._text.one_line`): the names a record
    embeds cannot start a line of their own."""
    if not TERMINAL:
        return args
    from ._text import one_line

    def one(a: Any) -> Any:
        if isinstance(a, (str, BaseException)):
            return one_line(str(a))
        return a

    return tuple(one(a) for a in args)


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
        # the arguments are escaped (a str() each) only for a record the logger keeps
        logger = self.logger
        if logger.isEnabledFor(level):
            logger.log(level, msg, *_shown(args), stacklevel=3)


def get_logger(name: str) -> Logger:
    """The :class:`Logger` for ``name`` (a ``ptestore.*`` logger name)."""
    return Logger(name)
