"""The ``argparse`` parser class of the ``ptestore`` command.

Usage errors exit with status 2 (:data:`~ptestore.cli.exits.EXIT_BAD_INPUT`), and a
misspelt flag or sub-command gets the nearest valid one as a suggestion (``difflib``;
the ``suggest_on_error`` of Python 3.14's argparse is not available on 3.10-3.13).
Every sub-command also gets the shared ``-v/--verbose`` and ``--debug`` flags.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any, NoReturn

__all__ = [
    "EXIT_USAGE",
    "HelpFormatter",
    "Parser",
    "VersionAction",
    "add_common_flags",
    "nearest",
]

#: The exit status of a usage error (the same number as ``EXIT_BAD_INPUT``).
EXIT_USAGE = 2

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)'")


def nearest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (``difflib``, cutoff 0.6), or None."""
    import difflib  # only for a usage error: not every run's start-up

    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``-v/--verbose`` and ``--debug``, which every sub-command takes."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what ptestore decides and how long each step takes (stderr); "
        "twice for debug logs",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="debug logs, and on failure the full traceback, with the backend's own",
    )


def _terminal_columns() -> int:
    """What ``shutil.get_terminal_size().columns`` says: ``COLUMNS`` when set to a
    positive number, else the width of the terminal on standard output, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns if columns > 0 else 80


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions and epilogs paragraph by paragraph, but keeps a paragraph whose
    lines are indented or whose first line ends with ``:`` (``examples:`` and the
    commands under it) as written."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        # argparse makes a formatter for every add_argument and asks shutil for the
        # terminal's width (importing shutil, bz2 and lzma: about 1.5 ms of every run's
        # start-up); the same answer, from os.
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap  # only for help text

        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if lines and (lines[0].endswith(":") or any(ln.startswith(" ") for ln in lines)):
                out.append("\n".join(indent + ln for ln in lines))
            else:
                out.append(
                    textwrap.fill(
                        " ".join(lines), width, initial_indent=indent, subsequent_indent=indent
                    )
                )
        return "\n\n".join(out)


class VersionAction(argparse.Action):
    """``--version``: print ``ptestore VERSION`` and exit 0. The version is read from the
    package metadata only when asked (``importlib.metadata`` costs start-up time)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from .._version import __version__

        sys.stdout.write(f"ptestore {__version__}\n")
        sys.stdout.flush()
        parser.exit()


class Parser(argparse.ArgumentParser):
    """``argparse`` parser whose usage errors exit 2 and suggest the nearest flag or
    sub-command.

    Sub-parsers made through ``add_subparsers`` are of the same class; the flags each
    parser defines are recorded as they are added (:attr:`flags`), and the sub-command
    parsers in :attr:`commands`, so an unrecognized argument is matched against the
    flags of the sub-command it was given to (and of its own sub-commands, as for
    ``fleet run``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        #: Every option string added to this parser (``--help`` included).
        self.flags: list[str] = []
        self._subparsers_actions: list[Any] = []
        super().__init__(*args, **kwargs)
        #: Sub-command name -> its parser (every ``add_subparsers`` of this parser).
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.extend(action.option_strings)
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self._subparsers_actions.append(action)
        return action

    def all_flags(self) -> list[str]:
        """:attr:`flags` and those of every sub-command, recursively."""
        out = list(self.flags)
        for action in self._subparsers_actions:
            for sub in action.choices.values():
                out += sub.all_flags() if isinstance(sub, Parser) else []
        return out

    def _command_parsers(self) -> dict[str, argparse.ArgumentParser]:
        found = dict(self.commands)
        for action in self._subparsers_actions:
            found.update(action.choices)
        return found

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        given = _GIVEN.set(list(sys.argv[1:] if args is None else args))
        try:
            return self._parse_args(args, namespace)
        finally:
            _GIVEN.reset(given)

    def _parse_args(
        self, args: Sequence[str] | None, namespace: argparse.Namespace | None
    ) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None)
            commands = self._command_parsers()
            target = commands.get(command, self) if isinstance(command, str) else self
            chosen = _chosen(target, ns)  # ``fleet plan``: plan's flags, not run's
            flags = chosen.all_flags() if isinstance(chosen, Parser) else self.flags
            message = "unrecognized arguments: " + " ".join(extras)
            for extra in extras:
                if extra.startswith("-"):
                    given = extra.split("=", 1)[0]
                    guess = nearest(given, flags)
                    if guess is not None and guess != given:
                        message += f" (did you mean {guess}?)"
                        break
            target.error(message)
        return ns

    def error(self, message: str) -> NoReturn:
        m = _INVALID_CHOICE.search(message)
        if m is not None and "did you mean" not in message:
            choices = list(self._command_parsers()) or re.findall(r"'([^']*)'", message[m.end() :])
            guess = nearest(m["given"], choices)
            if guess is not None:
                message += f" (did you mean {guess!r}?)"
        self.print_usage(sys.stderr)
        if _json_wanted(_GIVEN.get()):
            _usage_error_json(self.prog, message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


#: The arguments the command line being parsed was given (for a usage error's
#: ``--json`` object).
_GIVEN: ContextVar[list[str] | None] = ContextVar("ptestore_cli_argv", default=None)


def _json_wanted(given: list[str] | None) -> bool:
    """Whether ``--json`` is among the flags ``given`` (before a ``--``)."""
    for arg in given or ():
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _usage_error_json(prog: str, message: str) -> None:
    """A usage error's object on stdout, as a failing command's with ``--json``:
    ``{"error": {"type": "UsageError", "message", "exit_code": 2, "command"}}``
    (``command`` the sub-command, null for an error before one was named)."""
    import json

    words = prog.split()
    command = words[1] if len(words) > 1 else None
    error = {"type": "UsageError", "message": message, "exit_code": EXIT_USAGE}
    text = json.dumps({"error": {**error, "command": command}}, indent=2) + "\n"
    stream = sys.stdout
    if stream is None:
        return
    try:
        stream.write(text)
        stream.flush()
    except OSError:  # the reader gone, a full disk: the status says it
        from .output import silence

        silence(stream, 1)


def _chosen(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest sub-command parser ``ns`` went through from ``parser`` (``fleet`` ->
    ``fleet plan``): a typo is matched against that one's flags, not its siblings'."""
    while isinstance(parser, Parser):
        for action in parser._subparsers_actions:
            chosen = getattr(ns, action.dest, None) if action.dest else None
            if isinstance(chosen, str) and chosen in action.choices:
                parser = action.choices[chosen]
                break
        else:
            return parser
    return parser
