"""The ``ptestore`` command line: ``inspect``, ``specialize``, ``verify``, ``fleet``, ``gc``.

One module per sub-command (:mod:`.inspect`, :mod:`.specialize`, :mod:`.verify`,
:mod:`.fleet`, :mod:`.gc`), each with an
``add_*_parser`` and a ``run_*``; exit statuses and the mapping of errors onto them live in
:mod:`.exits`, option helpers shared by the sub-commands in :mod:`.options`. A new
sub-command is a new module wired into :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .exits import Parser
from .fleet import add_fleet_parser
from .gc import add_gc_parser
from .inspect import add_inspect_parser
from .specialize import add_specialize_parser
from .verify import add_verify_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``ptestore`` argument parser with every sub-command."""
    from .. import __version__

    parser = Parser(
        prog="ptestore",
        description="Specialize ExecuTorch .pte/.ptd models once per device and publish them "
        "atomically to local files, memory or object storage.",
    )
    parser.add_argument("--version", action="version", version=f"ptestore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_inspect_parser(sub)
    add_specialize_parser(sub)
    add_gc_parser(sub)
    add_verify_parser(sub)
    add_fleet_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ptestore ARGS``; returns the exit status (see :mod:`ptestore.cli.exits`).

    Usage errors, ``--help`` and ``--version`` exit through ``SystemExit`` as with any
    ``argparse`` program."""
    args = build_parser().parse_args(argv)
    # Like `python -m`, let `--backend package.module:attr` find modules in the current
    # directory when run through the console script.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return int(args.func(args))
