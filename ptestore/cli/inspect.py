"""``ptestore inspect URL [--json]``: the structure of a .pte or .ptd, from its metadata."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .exits import EXIT_OK, guarded
from .options import add_storage_options, storage_options

__all__ = ["add_inspect_parser", "run_inspect"]


def add_inspect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="show the structure of a .pte or .ptd",
        description="Show header, methods, delegates (with compile specs), segments, named "
        "data and wasted bytes of a .pte or .ptd. Reads only the metadata.",
    )
    p.add_argument(
        "url", metavar="URL", help="local path or fsspec URL (file://, memory://, s3://)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_storage_options(p)
    p.set_defaults(func=run_inspect)
    return p


@guarded("inspect")
def run_inspect(args: argparse.Namespace) -> int:
    """Run ``ptestore inspect`` with parsed arguments; returns the exit status."""
    from ..format.reader import read_container
    from ..inspection import describe, render_table
    from ..loaders import open_loader

    loader = open_loader(args.url, **storage_options(args))
    try:
        container = read_container(loader).container
    finally:
        loader.close()
    if args.json:
        json.dump(describe(container), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(container))
    return EXIT_OK
