"""Exit statuses of the ``ptestore`` command and the one place that maps errors onto them.

=====  ================================================================================
0      success
1      failure at run time: a backend failed, storage I/O failed (after retries), a publish
       was uncertain or partial, a published object failed its integrity check. Rerunning
       may succeed.
2      bad input or usage: a malformed container (:class:`FormatError`), bad arguments or
       options (:class:`ConfigurationError`, argparse usage errors), a missing source
       (:class:`ObjectNotFound`), an existing destination under ``--create``
       (:class:`AlreadyExists`), refused credentials or access (:class:`PermissionDenied`).
       Rerunning the same command gives the same answer: fix the input first.
130    interrupted (Ctrl-C)
=====  ================================================================================
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from ..errors import (
    AlreadyExists,
    ConfigurationError,
    FormatError,
    IntegrityError,
    ObjectNotFound,
    PartialPublish,
    PermissionDenied,
    PteStoreError,
    PublishUncertain,
)

__all__ = [
    "BAD_INPUT_ERRORS",
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "Command",
    "Parser",
    "error_message",
    "exit_code",
    "guarded",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

#: Errors that mean "the command as given cannot succeed": exit :data:`EXIT_BAD_INPUT`.
BAD_INPUT_ERRORS: tuple[type[PteStoreError], ...] = (
    FormatError,
    ConfigurationError,
    ObjectNotFound,
    AlreadyExists,
    PermissionDenied,
)

Command = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """``argparse`` parser whose usage errors exit with :data:`EXIT_BAD_INPUT`.

    Sub-parsers made through ``add_subparsers`` are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def exit_code(exc: BaseException) -> int | None:
    """The exit status for an error, or None for one that is not ours to map (a bug:
    let it propagate with its traceback)."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        return EXIT_OK
    if isinstance(exc, PartialPublish):
        return EXIT_FAILURE
    if isinstance(exc, BAD_INPUT_ERRORS):
        return EXIT_BAD_INPUT
    if isinstance(exc, (PteStoreError, OSError)):
        return EXIT_FAILURE
    return None


def error_message(command: str, exc: BaseException, *, publishes: bool = False) -> str:
    """The one line printed on stderr for an error of ``ptestore COMMAND``.

    ``publishes``: the command publishes objects, so a failure says what was published."""
    prog = f"ptestore {command}"
    if isinstance(exc, KeyboardInterrupt):
        return f"{prog}: interrupted" + ("; nothing was published" if publishes else "")
    if isinstance(exc, PartialPublish):
        return f"{prog}: failed after a partial publish: {exc}"
    if not publishes or isinstance(exc, BAD_INPUT_ERRORS):
        return f"{prog}: error: {exc}"
    if isinstance(exc, PublishUncertain):
        return f"{prog}: failed, the publish may or may not have taken effect: {exc}"
    if isinstance(exc, IntegrityError):
        return f"{prog}: failed after publishing: {exc}"
    return f"{prog}: failed, nothing published: {exc}"


def guarded(command: str, *, publishes: bool = False) -> Callable[[Command], Command]:
    """Decorate a sub-command's ``run`` function: errors become a message on stderr and
    the exit status of :func:`exit_code`; anything else propagates."""

    def wrap(run: Command) -> Command:
        @functools.wraps(run)
        def guarded_run(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except (KeyboardInterrupt, PteStoreError, OSError) as exc:
                code = exit_code(exc)
                assert code is not None  # every type caught here is mapped
                if isinstance(exc, BrokenPipeError):
                    # Output piped into `head` and the like: not an error of ours. Point
                    # stdout at /dev/null so that the interpreter's final flush is quiet.
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                    os.close(devnull)
                else:
                    print(error_message(command, exc, publishes=publishes), file=sys.stderr)
                return code

        return guarded_run

    return wrap
