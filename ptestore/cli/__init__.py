"""The ``ptestore`` command line: ``inspect``, ``specialize`` and ``gc``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from ..errors import ConfigurationError, FormatError, ObjectNotFound, PteStoreError

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


def _parse_storage_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parsed: object
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def _add_storage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        action="append",
        type=_parse_storage_option,
        default=[],
        help="fsspec/s3fs storage option for remote URLs (VALUE parsed as JSON if it can be); "
        "repeatable",
    )


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..format.reader import read_container
    from ..inspect import describe, render_table
    from ..loaders import open_loader

    options = dict(args.storage_option)
    try:
        loader = open_loader(args.url, **options)
        try:
            parsed = read_container(loader)
        finally:
            loader.close()
    except (FormatError, ObjectNotFound, ConfigurationError) as exc:
        print(f"ptestore inspect: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PteStoreError as exc:
        print(f"ptestore inspect: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        json.dump(describe(parsed.container), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(parsed.container))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptestore",
        description="Specialize ExecuTorch .pte/.ptd models once per device and publish them "
        "atomically to local files, memory or object storage.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"ptestore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "inspect",
        help="show the structure of a .pte or .ptd",
        description="Show header, methods, delegates (with compile specs), segments, named "
        "data and wasted bytes of a .pte or .ptd. Reads only the metadata.",
    )
    p.add_argument(
        "url", metavar="URL", help="local path or fsspec URL (file://, memory://, s3://)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_storage_options(p)
    p.set_defaults(func=_cmd_inspect)

    from .gc import add_gc_parser
    from .specialize import add_specialize_parser

    add_specialize_parser(sub)
    add_gc_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Like `python -m`, let `--backend package.module:attr` find modules in the current
    # directory when run through the console script.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return int(args.func(args))
    except KeyboardInterrupt as exc:
        # The coordinator says what was published before the interrupt (its message);
        # a run interrupted after `specialize` returned has published everything.
        if exc.args:
            detail = f" {exc.args[0]}"
        elif getattr(args, "published", None):
            detail = f" after {args.published} was published"
        else:
            detail = "; nothing was published"
        print(f"ptestore: interrupted{detail}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except PteStoreError as exc:
        print(f"ptestore {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(f"ptestore {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
