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

Records name the caller's line, as with a plain logger (``stacklevel``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

__all__ = ["Logger", "get_logger"]


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
            self.logger.debug(msg, *args, stacklevel=2)

    def info(self, msg: str, *args: Any) -> None:
        if "logging" in sys.modules:
            self.logger.info(msg, *args, stacklevel=2)

    def warning(self, msg: str, *args: Any) -> None:
        self.logger.warning(msg, *args, stacklevel=2)

    def error(self, msg: str, *args: Any) -> None:
        self.logger.error(msg, *args, stacklevel=2)


def get_logger(name: str) -> Logger:
    """The :class:`Logger` for ``name`` (a ``ptestore.*`` logger name)."""
    return Logger(name)
