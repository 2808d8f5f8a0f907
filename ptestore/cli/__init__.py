"""The ``ptestore`` command line: ``inspect``, ``specialize``, ``verify``, ``fleet``,
``gc`` and ``backends``.

One module per sub-command (:mod:`.inspect`, :mod:`.specialize`, :mod:`.verify`,
:mod:`.fleet`, :mod:`.gc`, :mod:`.backends`), each with an ``add_*_parser`` and a
``run_*``; exit statuses and the mapping of errors onto them live in :mod:`.exits`, the
parser class (usage errors exit 2, typos get a suggestion) in :mod:`.parser`, option
helpers shared by the sub-commands in :mod:`.options`. A new sub-command is a new module
registered in :data:`COMMANDS`; only the parser of the sub-command being run is built
(and its module imported).

Nothing heavy is imported here: ``ptestore --help`` loads neither fsspec nor numpy,
tenacity, s3fs or tqdm; each ``run_*`` imports what it needs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from collections.abc import Sequence

from .parser import Parser, VersionAction

__all__ = ["COMMANDS", "build_parser", "main", "program"]

_EPILOG = """\
examples:
  ptestore inspect model.pte
  ptestore specialize model.pte model.device.pte --backend my_pkg.backend:MyBackend
  ptestore backends
  ptestore gc /models --older-than 7d --dry-run

Run `ptestore COMMAND --help` for the options of each command."""


#: Sub-command -> (module of this package, the function adding its parser), in the
#: order ``ptestore --help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("inspect", "add_inspect_parser"),
    "specialize": ("specialize", "add_specialize_parser"),
    "gc": ("gc", "add_gc_parser"),
    "verify": ("verify", "add_verify_parser"),
    "fleet": ("fleet", "add_fleet_parser"),
    "select": ("select", "add_select_parser"),
    "fetch": ("select", "add_fetch_parser"),
    "backends": ("backends", "add_backends_parser"),
    "ensure": ("ensure", "add_ensure_parser"),
    "cache": ("cache", "add_cache_parser"),
}


def build_parser(only: str | None = None) -> Parser:
    """The ``ptestore`` argument parser with every sub-command, or with sub-command
    ``only`` alone (what :func:`main` builds when the first argument names one: the
    same parser for that command, without importing and building the others)."""
    parser = Parser(
        prog="ptestore",
        description="Specialize ExecuTorch .pte/.ptd models once per device and publish them "
        "atomically to local files, memory or object storage.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, adder) in COMMANDS.items():
        if only is None or name == only:
            getattr(importlib.import_module(f"{__name__}.{module}"), adder)(sub)
    parser.commands.update(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ptestore ARGS``; returns the exit status (see :mod:`ptestore.cli.exits`).

    Usage errors, ``--help`` and ``--version`` exit through ``SystemExit`` as with any
    ``argparse`` program."""
    given = sys.argv[1:] if argv is None else list(argv)
    only = given[0] if given and given[0] in COMMANDS else None
    args: argparse.Namespace = build_parser(only).parse_args(given)
    # Like `python -m`, let `--backend package.module:attr` find modules in the current
    # directory when run through the console script; while a command runs only (a
    # caller of main() in a process that goes on does not keep it first on its path).
    here = _path_taken(os.getcwd())
    from .._signals import termination_as_interrupt

    try:
        # SIGTERM and SIGHUP are handled as Ctrl-C (cleanup, message, exit 130).
        with termination_as_interrupt():
            return int(args.func(args))
    finally:
        _path_given_back(here)


#: The directories main() put first on ``sys.path``, and how many of the commands
#: running (several threads of one process may each run one) need each there.
_ON_PATH: dict[str, int] = {}
_PATH_LOCK = threading.Lock()


def _path_lock_anew() -> None:
    """A forked child's lock (another thread of the parent may have held it at the fork)."""
    global _PATH_LOCK
    _PATH_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_path_lock_anew)


def _path_taken(here: str) -> str | None:
    """``here`` first on ``sys.path`` for a command (unless the path has it, or ``""``,
    already); what :func:`_path_given_back` takes."""
    with _PATH_LOCK:
        if here in _ON_PATH:
            _ON_PATH[here] += 1
            return here
        if "" in sys.path or here in sys.path:
            return None
        sys.path.insert(0, here)
        _ON_PATH[here] = 1
        return here


def _path_given_back(here: str | None) -> None:
    """The command that took ``here`` ended: off ``sys.path`` once no running command
    needs it."""
    if here is None:
        return
    with _PATH_LOCK:
        _ON_PATH[here] -= 1
        if _ON_PATH[here] == 0:
            del _ON_PATH[here]
            if here in sys.path:
                sys.path.remove(here)


def program() -> int:
    """The ``ptestore`` program (the console script and ``python -m ptestore``):
    :func:`main`, then the process ends without a final garbage collection.

    At exit CPython collects every object of every module in a last pass (about 10 ms
    for a run's modules here, a fifth of a local run's fixed cost); the process is
    ending, so :func:`gc.freeze` tells the collector to leave them. Exit handlers still
    run (:mod:`atexit`, :func:`weakref.finalize`: a writer's staging file is removed as
    before), and nothing else changes: only a program that is about to exit calls this,
    never :func:`main` called from Python.

    The collector is imported here, under another name: a module-level ``import gc``
    is replaced by the ``gc`` sub-command (:mod:`ptestore.cli.gc`) once that is
    imported (importing a sub-module sets the package's attribute of that name).

    A standard descriptor closed when the process started (``>&-``, ``2>&-``) gets
    ``/dev/null`` first, so that no file the command opens takes its number; a closed
    stdout refuses the command's output (an error line), a closed stderr takes the
    error lines and warnings without a word, never sending them to stdout
    (:func:`ptestore.cli.output.standard_streams`)."""
    from .output import standard_streams

    standard_streams()
    status = main()
    import gc as collector  # the standard library's: imports are absolute

    collector.freeze()
    return status
