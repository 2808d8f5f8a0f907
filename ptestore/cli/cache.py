"""``ptestore cache ls|prune|clear --cache-dir DIR``: show and manage the cache that
``ptestore ensure`` fills (see docs/device.md)."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
from typing import Any

from .._text import for_terminal, printable
from ..errors import ConfigurationError, ObjectNotFound
from ..storage.types import file_path, redact_urls, redacted_url
from .ensure import parse_size
from .exits import EXIT_OK, guarded
from .options import add_storage_options, human_bytes, storage_options
from .output import out, out_json
from .parser import add_common_flags

__all__ = ["add_cache_parser", "run_cache"]

_EPILOG = """\
examples:
  ptestore cache ls --cache-dir ~/.cache/models
  ptestore cache prune --cache-dir ~/.cache/models --max-bytes 2G
  ptestore cache prune --cache-dir ~/.cache/models --stale --dry-run
  ptestore cache clear --cache-dir ~/.cache/models --json

ls lists the entries, most recently used first. prune removes broken and incomplete
entries (what an interrupted run leaves) and, with --max-bytes, least-recently-used
entries until the cache fits; with --stale, first the entries whose source is gone or
changed (a copy's source or .ptd, an in-place file, or the job index an entry was
fetched from no longer naming it; --dry-run lists them and removes nothing). A source
that cannot be reached is kept and reported. clear removes every entry. An entry another process is
using right now is never removed (it is reported as busy).

Exit status: 0 success; 1 storage failure; 2 bad input (no such cache directory, an -o
option that applies to none of the entries' remote indexes, nor to the portable sources
they named)."""


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
    p.add_argument(
        "--stale",
        action="store_true",
        help="prune: also remove entries whose source is gone or changed",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="prune --stale: list the stale entries, remove nothing",
    )
    p.add_argument("--json", action="store_true", help="print the result (or error) as JSON")
    add_storage_options(p)
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
    from ..device.layout import list_entries

    local = file_path(args.cache_dir)  # file:///x is /x; a remote URL is no directory
    if local is None or not os.path.isdir(local):
        raise ObjectNotFound(f"{args.cache_dir}: no such cache directory")
    args.cache_dir = local
    if args.action != "prune" and (args.stale or args.dry_run):
        flag = "--stale" if args.stale else "--dry-run"
        raise ConfigurationError(f"{flag} applies to `cache prune`, not `cache {args.action}`")
    if args.action != "prune" and args.max_bytes is not None:
        raise ConfigurationError(
            f"--max-bytes applies to `cache prune`, not `cache {args.action}`"
            + (" (clear removes every entry)" if args.action == "clear" else "")
        )
    if args.dry_run and not args.stale:
        raise ConfigurationError("--dry-run lists what --stale would remove: add --stale")
    if args.action == "prune" and args.stale:
        return _prune_stale(args)
    if storage_options(args):
        raise ConfigurationError(
            "--storage-option reaches the job indexes of `cache prune --stale` only"
        )
    if args.action == "ls":
        entries = list_entries(args.cache_dir)
        if args.json:
            shown: Any = {
                "entries": [_shown(e.to_dict()) for e in entries],
                "bytes": sum(e.bytes for e in entries),
            }
            out_json(shown)
            return EXIT_OK
        lines = []
        for e in entries:
            where = " (in place)" if e.in_place else ""
            if e.xnnpack_cache is not None:
                where += f" + {os.path.basename(e.xnnpack_cache)}"
            lines.append(
                f"{e.key}  {e.state:<10} {human_bytes(e.bytes):>10}  {_when(e.last_used)}  "
                f"{printable(redacted_url(e.source or '-'))}{printable(where)}"
            )
        total = sum(e.bytes for e in entries)
        out("\n".join([*lines, f"{len(entries)} entries, {human_bytes(total)}"]))
        return EXIT_OK
    if args.action == "prune":
        done = cache.prune(args.cache_dir, args.max_bytes)
    else:
        done = cache.clear(args.cache_dir)
    if args.json:
        out_json(done.to_dict())
    else:
        out(
            f"removed {len(done.removed)} entries ({human_bytes(done.freed)}); "
            f"{human_bytes(done.remaining)} left"
            + (f"; {len(done.busy)} busy (in use): {', '.join(done.busy)}" if done.busy else "")
        )
    return EXIT_OK


def _prune_stale(args: argparse.Namespace) -> int:
    """``cache prune --stale [--dry-run]``: the stale entries, then (not in a dry run)
    what ``cache prune`` removes."""
    from ..device import cache
    from ..device.stale import prune_stale

    if args.dry_run and args.max_bytes is not None:
        raise ConfigurationError(
            "--dry-run lists stale entries; it does not plan --max-bytes eviction: "
            "leave out one of them"
        )
    stale = prune_stale(args.cache_dir, dry_run=args.dry_run, storage_options=storage_options(args))
    rest = None if args.dry_run else cache.prune(args.cache_dir, args.max_bytes)
    if args.json:
        shown = stale.to_dict()
        shown["entries"] = [_shown(e) for e in shown["entries"]]
        doc: dict[str, Any] = {"stale": shown}
        if rest is not None:
            doc.update(rest.to_dict())
            doc["removed"] = stale.removed + rest.removed
            doc["freed"] = stale.freed + rest.freed
            doc["busy"] = stale.busy + [k for k in rest.busy if k not in stale.busy]
        out_json(doc)
        return EXIT_OK
    lines = [
        for_terminal(redact_urls(f"{e.action:<18} {e.key}  {human_bytes(e.bytes):>10}  {e.reason}"))
        for e in stale.entries
    ]
    if rest is None:
        n = sum(e.action == "would remove" for e in stale.entries)
        out("\n".join([*lines, f"would remove {n} stale entries; {stale.current} current"]))
        return EXIT_OK
    removed = len(stale.removed) + len(rest.removed)
    busy = stale.busy + [k for k in rest.busy if k not in stale.busy]
    summary = (
        f"removed {removed} entries ({len(stale.removed)} stale, "
        f"{human_bytes(stale.freed + rest.freed)}); {human_bytes(rest.remaining)} left"
        + (f"; {len(busy)} busy (in use): {', '.join(busy)}" if busy else "")
    )
    out("\n".join([*lines, summary]))
    return EXIT_OK


def _shown(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry's ``--json`` object with its source (and the reason naming it) as
    :func:`~ptestore.storage.types.redacted_url` shows it: a manifest an earlier
    ptestore wrote may record a URL with its password or signature."""
    out = dict(entry)
    if isinstance(out.get("source"), str):
        out["source"] = redacted_url(out["source"])
    if isinstance(out.get("reason"), str):
        out["reason"] = redact_urls(out["reason"])
    return out
