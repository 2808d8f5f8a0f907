"""``ptestore cache ls|prune|clear --cache-dir DIR``: show and manage the cache that
``ptestore ensure`` fills (see docs/device.md)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from typing import Any

from ..errors import ObjectNotFound
from .ensure import parse_size
from .exits import EXIT_OK, guarded
from .options import human_bytes
from .parser import add_common_flags

__all__ = ["add_cache_parser", "run_cache"]

_EPILOG = """\
examples:
  ptestore cache ls --cache-dir ~/.cache/models
  ptestore cache prune --cache-dir ~/.cache/models --max-bytes 2G
  ptestore cache clear --cache-dir ~/.cache/models --json

ls lists the entries, most recently used first. prune removes broken and incomplete
entries (what an interrupted run leaves) and, with --max-bytes, least-recently-used
entries until the cache fits. clear removes every entry. An entry another process is
using right now is never removed (it is reported as busy).

Exit status: 0 success; 1 storage failure; 2 bad input (no such cache directory)."""


def add_cache_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``cache`` sub-command (``ls``, ``prune``, ``clear``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "cache",
        help="show and manage the cache of `ptestore ensure`",
        description="Show and manage the cache directory that `ptestore ensure` fills.",
        epilog=_EPILOG,
    )
    p.add_argument("action", choices=("ls", "prune", "clear"), help="what to do")
    p.add_argument("--cache-dir", metavar="DIR", required=True, help="the cache directory")
    p.add_argument(
        "--max-bytes",
        metavar="N",
        type=parse_size,
        help="prune: also evict least-recently-used entries until the cache holds at most N",
    )
    p.add_argument("--json", action="store_true", help="print the result (or error) as JSON")
    add_common_flags(p)
    p.set_defaults(func=run_cache)
    return p


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@guarded("cache")
def run_cache(args: argparse.Namespace) -> int:
    """Run ``ptestore cache ACTION``; returns the exit status."""
    from ..device import cache

    if not os.path.isdir(args.cache_dir):
        raise ObjectNotFound(f"{args.cache_dir}: no such cache directory")
    if args.action == "ls":
        entries = cache.list_entries(args.cache_dir)
        if args.json:
            out: Any = {
                "entries": [e.to_dict() for e in entries],
                "bytes": sum(e.bytes for e in entries),
            }
            json.dump(out, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return EXIT_OK
        for e in entries:
            where = " (in place)" if e.in_place else ""
            print(
                f"{e.key}  {e.state:<10} {human_bytes(e.bytes):>10}  {_when(e.last_used)}  "
                f"{e.source or '-'}{where}"
            )
        total = sum(e.bytes for e in entries)
        print(f"{len(entries)} entries, {human_bytes(total)}")
        return EXIT_OK
    if args.action == "prune":
        done = cache.prune(args.cache_dir, args.max_bytes)
    else:
        done = cache.clear(args.cache_dir)
    if args.json:
        json.dump(done.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(
            f"removed {len(done.removed)} entries ({human_bytes(done.freed)}); "
            f"{human_bytes(done.remaining)} left"
            + (f"; {len(done.busy)} busy (in use): {', '.join(done.busy)}" if done.busy else "")
        )
    return EXIT_OK
