"""``ptestore gc PATH_OR_S3_PREFIX``: remove ptestore's own leftovers after crashes.

Local: stale ``.<name>.ptestore-<hex>.tmp`` staging files that no live writer holds.
S3: stale multipart uploads that carry ptestore's marker part. Nothing else is touched.
Exit status: 0 when everything found was handled, 1 if a removal failed, 2 on bad input
(see :mod:`ptestore.cli.exits`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..writers.gc import DEFAULT_OLDER_THAN, GcEntry, collect_stale
from .exits import EXIT_FAILURE, EXIT_OK, guarded
from .options import add_storage_options, human_bytes, storage_options

__all__ = ["add_gc_parser", "run_gc"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def add_gc_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``gc`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gc",
        help="remove ptestore's own stale staging files or multipart uploads",
        description="Remove leftovers of crashed ptestore writers under a local directory "
        "(stale hidden staging files no live writer holds) or an s3://bucket/prefix (stale "
        "multipart uploads carrying ptestore's marker). Nothing else is ever touched.",
    )
    p.add_argument("target", metavar="PATH_OR_S3_PREFIX", help="directory, file or s3://b/prefix")
    p.add_argument(
        "--older-than",
        type=_seconds,
        default=DEFAULT_OLDER_THAN,
        metavar="SECONDS",
        help=f"only leftovers at least this old (default {DEFAULT_OLDER_THAN:g}, one day)",
    )
    p.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_storage_options(p)
    p.set_defaults(func=run_gc)
    return p


@guarded("gc")
def run_gc(args: argparse.Namespace) -> int:
    """Run ``ptestore gc`` with parsed arguments; returns the exit status."""
    entries = collect_stale(
        args.target,
        older_than=args.older_than,
        dry_run=args.dry_run,
        **storage_options(args),
    )
    failed = [e for e in entries if e.action.startswith("failed")]
    done = [e for e in entries if e.action in ("removed", "would remove")]
    if args.json:
        report = {
            "target": str(args.target),
            "dry_run": bool(args.dry_run),
            "older_than": args.older_than,
            "entries": [e.as_dict() for e in entries],
            "removed": 0 if args.dry_run else len(done),
            "would_remove": len(done) if args.dry_run else 0,
            "failed": len(failed),
        }
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(entries)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(done)} of {len(entries)} leftover(s); {len(failed)} failed")
    return EXIT_FAILURE if failed else EXIT_OK


def _print_table(entries: list[GcEntry]) -> None:
    for e in entries:
        size = "-" if e.size is None else human_bytes(e.size)
        print(f"{e.action:<34} {e.kind:<17} {e.age:>10.0f}s {size:>10}  {e.location}")
