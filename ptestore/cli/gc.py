"""``ptestore gc PATH_OR_S3_PREFIX``: remove ptestore's own leftovers after crashes.

Local: stale ``.<name>.ptestore-<hex>.tmp`` staging files that no live writer holds.
S3: stale multipart uploads that carry ptestore's marker part. Nothing else is touched.
Exit status: 0 when everything found was handled, 1 if a removal failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ..errors import ConfigurationError, PteStoreError
from ..writers.gc import DEFAULT_OLDER_THAN, GcEntry, collect_stale

__all__ = ["add_gc_parser", "run_gc"]


def _storage_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
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
    p.add_argument(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        action="append",
        type=_storage_option,
        default=[],
        help="s3fs-style storage option (VALUE parsed as JSON if it can be); repeatable",
    )
    p.set_defaults(func=run_gc)
    return p


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def run_gc(args: argparse.Namespace) -> int:
    """Run ``ptestore gc`` with parsed arguments; returns the exit status."""
    options = dict(getattr(args, "storage_option", []) or [])
    try:
        entries = collect_stale(
            args.target, older_than=args.older_than, dry_run=args.dry_run, **options
        )
    except ConfigurationError as exc:
        print(f"ptestore gc: error: {exc}", file=sys.stderr)
        return 2
    except PteStoreError as exc:
        print(f"ptestore gc: error: {exc}", file=sys.stderr)
        return 1
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
        json.dump(report, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        _print_table(entries)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(done)} of {len(entries)} leftover(s); {len(failed)} failed")
    return 1 if failed else 0


def _print_table(entries: list[GcEntry]) -> None:
    for e in entries:
        print(f"{e.action:<34} {e.kind:<17} {e.age:>10.0f}s {_human(e.size):>10}  {e.location}")
