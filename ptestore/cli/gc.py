"""``ptestore gc PATH_OR_S3_PREFIX``: remove ptestore's own leftovers after crashes, and
the fleet artifacts no index references.

Local: stale ``.<name>.ptestore-<hex>.tmp`` staging files that no live writer holds.
S3: stale multipart uploads that carry ptestore's marker part. Under a fleet index
(``gc --job JOB``, or a prefix holding or below a ``ptestore-index.json``): shared
objects and per-device files no live index entry names, older than ``--grace``
(:mod:`ptestore.fleet.orphans`). Nothing else is touched.
Exit status: 0 when everything found was handled, 1 if a removal failed, 2 on bad input
(a path that does not exist, a bad duration; see :mod:`ptestore.cli.exits`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import TYPE_CHECKING, Any

from .exits import EXIT_FAILURE, EXIT_OK, guarded
from .options import add_storage_options, human_bytes, storage_options
from .output import out, out_json
from .parser import add_common_flags

if TYPE_CHECKING:
    from ..gc import GcEntry

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_OLDER_THAN",
    "add_gc_parser",
    "human_duration",
    "parse_duration",
    "run_gc",
]

#: The default of ``--older-than`` (one day); equal to ``ptestore.writers.gc``'s, kept
#: here so that ``ptestore --help`` does not import the storage layer.
DEFAULT_OLDER_THAN = 86400.0
#: The default of ``--grace`` (seven days); equal to ``ptestore.fleet.orphans``'s.
DEFAULT_GRACE = 7 * 86400.0

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(
    r"\s*(?P<number>[+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[a-z]*)\s*"
)

_EPILOG = """\
examples:
  ptestore gc /models --dry-run
  ptestore gc /models/model.pte --older-than 30m
  ptestore gc s3://bucket/models/ --older-than 7d --json
  ptestore gc --job job.toml --dry-run
  ptestore gc s3://bucket/models/ --grace 2d

Under a fleet index (--job JOB, or a prefix holding or below a ptestore-index.json),
gc also removes the job's artifacts no index entry names any more (shared
_shared/sha256-tree/<hex>.ptd objects, per-device .pte/.ptd files of retired or replaced
pairs) once older than --grace (default 7d: a run may be about to name a younger one;
one a running job reuses is kept while its hold, <object>.ptestore-hold, is younger,
and a hold older than the grace is removed). An object an index under the prefix (or
in a directory above it) names is never removed; indexes elsewhere are not read.

DURATION is a number with an optional unit: s (the default), m, h, d or w
(90s, 30m, 12h, 7d, 1.5h).

Exit status: 0 when everything found was handled, 1 if a removal failed, 2 bad input
(a path that does not exist, a target that is neither local nor s3://, a bad duration,
refused access)."""


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` or a plain number of seconds
    -> seconds. Raises ``argparse.ArgumentTypeError`` for anything else, a negative or a
    non-finite value."""
    m = _DURATION.fullmatch(text.lower())
    if m is None or m["unit"] not in ("", *_UNITS):
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90s, 30m, 12h or 7d (a number with an optional "
            f"unit s, m, h, d or w), got {text!r}"
        )
    value = float(m["number"]) * _UNITS[m["unit"] or "s"]
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite duration, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a duration >= 0, got {text!r}")
    return value


def human_duration(seconds: float) -> str:
    """``45`` -> ``"45s"``, ``750`` -> ``"12m 30s"``, ``93600`` -> ``"1d 2h"``: the
    largest unit and the next one (left out when zero), rounded down."""
    s = max(0, int(seconds)) if math.isfinite(seconds) else 0
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (unit, size) in enumerate(units):
        if s >= size or unit == "s":
            text = f"{s // size}{unit}"
            if i + 1 < len(units):
                sub, sub_size = units[i + 1]
                rest = (s % size) // sub_size
                if rest:
                    text += f" {rest}{sub}"
            return text
    raise AssertionError("unreachable")


def add_gc_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``gc`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gc",
        help="remove ptestore's own stale staging files or multipart uploads",
        description="Remove leftovers of crashed ptestore writers under a local directory "
        "(stale hidden staging files no live writer holds) or an s3://bucket/prefix (stale "
        "multipart uploads carrying ptestore's marker), and under a fleet index the "
        "artifacts and shared objects no index names. Nothing else is ever touched.",
        epilog=_EPILOG,
    )
    p.add_argument(
        "target",
        metavar="PATH_OR_S3_PREFIX",
        nargs="?",
        default=None,
        help="directory, file or s3://b/prefix (or --job)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="clean what a fleet job's destination prefix holds (its storage options too)",
    )
    p.add_argument(
        "--older-than",
        type=parse_duration,
        default=DEFAULT_OLDER_THAN,
        metavar="DURATION",
        help="only leftovers at least this old: 90s, 30m, 12h, 7d, or seconds "
        f"(default {human_duration(DEFAULT_OLDER_THAN)})",
    )
    p.add_argument(
        "--grace",
        type=parse_duration,
        default=DEFAULT_GRACE,
        metavar="DURATION",
        help="only fleet artifacts no index names for at least this long "
        f"(default {human_duration(DEFAULT_GRACE)})",
    )
    p.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_storage_options(p)
    add_common_flags(p)
    p.set_defaults(func=run_gc)
    return p


@guarded("gc")
def run_gc(args: argparse.Namespace) -> int:
    """Run ``ptestore gc`` with parsed arguments; returns the exit status."""
    from ..errors import ConfigurationError, ObjectNotFound
    from ..gc import collect_stale
    from ..storage.types import StorageURL

    options = storage_options(args)
    pairs = None
    if args.job is not None:
        from ..fleet import load_job
        from ..fleet.preflight import check_job_options, destination_prefix
        from ..storage.routing import options_for_loader

        if args.target is not None:
            raise ConfigurationError("gc takes PATH_OR_S3_PREFIX or --job JOB, not both")
        job = load_job(args.job)
        args.target = destination_prefix(job) or "."
        # Checked as fleet run, plan, retire and verify --job check them: an option that
        # applies to no URL of the job is refused, never dropped (a misspelt endpoint_url
        # sent gc's requests to AWS).
        check_job_options(job, args.target)
        pairs = {(p.model.name, p.device.name): p.destination for p in job.pairs()}
        options = {**options_for_loader(args.target, job.storage_options), **options}
    elif args.target is None:
        raise ConfigurationError("gc needs PATH_OR_S3_PREFIX, or --job JOB")
    entries = collect_stale(
        args.target,
        older_than=args.older_than,
        dry_run=args.dry_run,
        **options,
    )
    from ..fleet.orphans import collect_orphans

    orphans = collect_orphans(
        args.target, grace=args.grace, dry_run=args.dry_run, pairs=pairs, **options
    )
    entries += orphans
    url = StorageURL.of(args.target)
    path = url.path
    if url.local and not entries and not os.path.lexists(path):
        # Staging files of a destination that was never published are found beside
        # it; with none of those either, the path is a typo.
        raise ObjectNotFound(f"{path}: no such file or directory")
    failed = [e for e in entries if e.action.startswith("failed")]
    done = [e for e in entries if e.action in ("removed", "would remove")]
    if args.json:
        report = {
            "target": str(args.target),
            "dry_run": bool(args.dry_run),
            "older_than": args.older_than,
            "grace": args.grace,
            "entries": [{**e.as_dict(), "age_human": human_duration(e.age)} for e in entries],
            "removed": 0 if args.dry_run else len(done),
            "would_remove": len(done) if args.dry_run else 0,
            "failed": len(failed),
        }
        out_json(report)
    else:
        verb = "would remove" if args.dry_run else "removed"
        line = (
            f"{verb} {len(done)} of {len(entries)} leftover(s) older than "
            f"{human_duration(args.older_than)}"
        )
        if orphans:
            line += f" (orphans: older than {human_duration(args.grace)})"
        # the listing whole, then the status: its reader gone (| head), still 1 for a failure
        out("\n".join([*_table(entries), f"{line}; {len(failed)} failed"]))
    return EXIT_FAILURE if failed else EXIT_OK


def _table(entries: list[GcEntry]) -> list[str]:
    from .._text import printable

    lines = []
    for e in entries:
        size = "-" if e.size is None else human_bytes(e.size)
        # names from the store or the disk (and errors quoting them): escaped
        action, where = printable(e.action), printable(e.location)
        lines.append(f"{action:<34} {e.kind:<17} {human_duration(e.age):>8} {size:>10}  {where}")
    return lines
