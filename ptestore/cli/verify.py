"""``ptestore verify URL [--source SRC] [--backend SPEC]... [--device NAME --job JOB]
[--json]``.

Exit status: 0 current, 1 stale or mismatched (the message names the field), 2 bad
input or a corrupt artifact.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigurationError
from .exits import guarded
from .options import add_storage_options, storage_options
from .parser import add_common_flags

__all__ = ["add_verify_parser", "run_verify"]

_EPILOG = """\
examples:
  ptestore verify out.pte
  ptestore verify out.pte --source model.pte --backend my_pkg.backend:MyBackend
  ptestore verify s3://bucket/dev-a/model.pte --job job.toml --json"""


def add_verify_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ptestore verify`` to ``subparsers``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "verify",
        help="check an artifact's integrity and whether it is current",
        description="Check the container's structure and provenance trailer; given "
        "--source, that the artifact was made from exactly it; given --backend, that the "
        "backends and their versions match and rate it optimal; given --device, that it "
        "was made for that profile. Exit status: 0 current, 1 stale, 2 bad input or corrupt.",
        epilog=_EPILOG,
    )
    p.add_argument("url", metavar="URL", help="the artifact (.pte or .ptd; path or URL)")
    p.add_argument("--source", metavar="SRC", help="the source it should have been made from")
    p.add_argument(
        "--backend",
        metavar="SPEC",
        action="append",
        default=None,
        help="a backend it should have been made with (repeatable, in order)",
    )
    p.add_argument(
        "--device",
        metavar="NAME",
        help="the device profile it should have been made for (options from --job)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="a fleet job file: device options, storage options, and (for a "
        "destination of the job) the source and backends",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_storage_options(p)
    add_common_flags(p)
    p.set_defaults(func=run_verify)
    return p


@guarded("verify")
def run_verify(args: argparse.Namespace) -> int:
    """Run ``ptestore verify``: exit 0 current, 1 stale or mismatched, 2 bad input or a
    corrupt artifact."""
    from ..verification import VerifyReport, verify

    try:
        source, backends, device, options = _inputs(args)
    except ConfigurationError as exc:
        report = VerifyReport(args.url, status="invalid", error=str(exc))
    else:
        report = verify(
            args.url, source=source, backends=backends, device=device, storage_options=options
        )
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out = sys.stdout if report.exit_code == 0 else sys.stderr
        print(report.message(), file=out)
    return report.exit_code


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any]]:
    options: dict[str, Any] = storage_options(args)
    source = args.source
    backends = args.backend
    device: Any = None
    if args.job is None:
        # Without a job the options are unknown: only the name is compared.
        return source, backends, args.device, options
    from ..fleet import load_job

    job = load_job(args.job)
    # The job's options, as the fleet used them: verify routes them to each side.
    options = {**job.storage_options, **options}
    from ..coordinator.targets import same_target

    # Any spelling of a destination (relative or absolute, repeated slashes, file://,
    # a link to it) is that destination: compared as the store will address it.
    for pair in job.pairs():
        is_ptd = pair.ptd_destination is not None and same_target(args.url, pair.ptd_destination)
        if is_ptd or same_target(args.url, pair.destination):
            if source is None:
                source = pair.model.ptd if is_ptd else pair.model.source
            if args.device is None:
                device = pair.device
            break
    if args.device is not None:
        device = job.device(args.device)
    if backends is None:
        backends = list(job.backends)
    return source, backends, device, options
