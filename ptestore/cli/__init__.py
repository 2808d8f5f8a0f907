"""The ``ptestore`` command line: ``inspect``, ``specialize``, ``verify``, ``fleet``,
``gc`` and ``backends``.

One module per sub-command (:mod:`.inspect`, :mod:`.specialize`, :mod:`.verify`,
:mod:`.fleet`, :mod:`.gc`, :mod:`.backends`), each with an ``add_*_parser`` and a
``run_*``; exit statuses and the mapping of errors onto them live in :mod:`.exits`, the
parser class (usage errors exit 2, typos get a suggestion) in :mod:`.parser`, option
helpers shared by the sub-commands in :mod:`.options`. A new sub-command is a new module
wired into :func:`build_parser`.

Nothing heavy is imported here: ``ptestore --help`` loads neither fsspec nor numpy,
tenacity, s3fs or tqdm; each ``run_*`` imports what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .backends import add_backends_parser
from .cache import add_cache_parser
from .ensure import add_ensure_parser
from .fleet import add_fleet_parser
from .gc import add_gc_parser
from .inspect import add_inspect_parser
from .parser import Parser, VersionAction
from .select import add_fetch_parser, add_select_parser
from .specialize import add_specialize_parser
from .verify import add_verify_parser

__all__ = ["build_parser", "main"]

_EPILOG = """\
examples:
  ptestore inspect model.pte
  ptestore specialize model.pte model.device.pte --backend my_pkg.backend:MyBackend
  ptestore backends
  ptestore gc /models --older-than 7d --dry-run

Run `ptestore COMMAND --help` for the options of each command."""


def build_parser() -> Parser:
    """The ``ptestore`` argument parser with every sub-command."""
    parser = Parser(
        prog="ptestore",
        description="Specialize ExecuTorch .pte/.ptd models once per device and publish them "
        "atomically to local files, memory or object storage.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_inspect_parser(sub)
    add_specialize_parser(sub)
    add_gc_parser(sub)
    add_verify_parser(sub)
    add_fleet_parser(sub)
    add_select_parser(sub)
    add_fetch_parser(sub)
    add_backends_parser(sub)
    add_ensure_parser(sub)
    add_cache_parser(sub)
    parser.commands.update(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ptestore ARGS``; returns the exit status (see :mod:`ptestore.cli.exits`).

    Usage errors, ``--help`` and ``--version`` exit through ``SystemExit`` as with any
    ``argparse`` program."""
    args: argparse.Namespace = build_parser().parse_args(argv)
    # Like `python -m`, let `--backend package.module:attr` find modules in the current
    # directory when run through the console script.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from .._signals import termination_as_interrupt

    # SIGTERM and SIGHUP are handled as Ctrl-C (cleanup, message, exit 130).
    with termination_as_interrupt():
        return int(args.func(args))
