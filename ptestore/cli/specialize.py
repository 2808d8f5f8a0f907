"""``ptestore specialize SRC DST [--backend SPEC]... [--ptd SRC_PTD DST_PTD] [--create]
[--json] [--quiet]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .exits import EXIT_OK, guarded
from .options import add_storage_options, human_bytes, storage_options

if TYPE_CHECKING:
    from .. import SpecializationReport

__all__ = ["add_specialize_parser", "format_summary", "run_specialize"]


def add_specialize_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``specialize`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "specialize",
        help="run backends once and publish the specialized model atomically",
        description="Hand every backend found in SRC to its implementation once, lay the "
        "container out again with the replacements, and publish it atomically at DST. "
        "DST may equal SRC to replace the original. Exit status: 0 success, 1 backend or "
        "storage failure, 2 bad input (malformed or missing source, bad arguments, existing "
        "DST with --create, access refused).",
    )
    p.add_argument("src", metavar="SRC", help="source .pte (path or URL)")
    p.add_argument("dst", metavar="DST", help="destination .pte (path or URL; may equal SRC)")
    p.add_argument(
        "--backend",
        metavar="SPEC",
        action="append",
        default=None,
        help="backend implementation: a registered name, package.module:attr, optionally "
        "REF@BACKEND_ID and =ARGUMENT (repeatable; default: every registered backend "
        "whose name is a backend id in the program)",
    )
    p.add_argument(
        "--ptd",
        nargs=2,
        metavar=("SRC_PTD", "DST_PTD"),
        help="also rewrite the model's external weights (.ptd)",
    )
    p.add_argument(
        "--create",
        action="store_true",
        help="refuse to replace an existing destination (no-clobber publish)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="where replacement bytes wait until layout (default: the system temp dir)",
    )
    p.add_argument(
        "--device",
        metavar="NAME",
        help="the device profile to specialize for (handed to backends; implies --provenance)",
    )
    p.add_argument(
        "--device-option",
        metavar="K=V",
        action="append",
        default=[],
        help="an option of the device profile (VALUE parsed as JSON if it can be); repeatable",
    )
    p.add_argument(
        "--provenance",
        action="store_true",
        help="end the output with a provenance trailer (see docs/fleet.md)",
    )
    add_storage_options(p)
    p.set_defaults(func=run_specialize)
    return p


def format_summary(report: SpecializationReport) -> str:
    """The summary printed on stdout after a successful run."""
    lines = []
    for f in report.files:
        if f.status == "unchanged":
            lines.append(f"{f.role}: {f.source}: unchanged (nothing replaced, nothing written)")
            continue
        line = (
            f"{f.role}: {f.source} -> {f.destination}: {human_bytes(f.size_before)} -> "
            f"{human_bytes(f.size_after)}; {f.segments_replaced}/{f.segments} segments replaced, "
            f"{f.segments_moved} moved, {f.redirected_tables} tables redirected"
        )
        if f.bytes_cloned:
            line += f", {human_bytes(f.bytes_cloned)} shared with the source (reflink)"
        lines.append(line)
    for b in report.backends:
        if b.status == "specialized":
            lines.append(
                f"backend {b.backend_id}: {b.inputs_seen} inputs, {len(b.keys_replaced)} keys "
                f"and {b.blobs_replaced} blobs replaced, {human_bytes(b.bytes_in)} in, "
                f"{human_bytes(b.bytes_out)} out, {b.seconds:.3f} s"
            )
        elif b.status == "not_supported":
            lines.append(f"backend {b.backend_id}: declined (data kept as is)")
        else:
            lines.append(f"backend {b.backend_id}: no implementation (data kept as is)")
    lines.append(f"published in {report.seconds:.3f} s")
    return "\n".join(lines)


@guarded("specialize", publishes=True)
def run_specialize(args: argparse.Namespace) -> int:
    """Run ``ptestore specialize`` with parsed arguments; returns the exit status."""
    from .. import Event, specialize

    show_progress = not args.quiet and not args.json and sys.stderr.isatty()
    bar: Any = None

    def tracer(event: Event) -> None:
        nonlocal bar
        if event.kind == "write" and show_progress:
            if bar is None:
                from tqdm import tqdm

                bar = tqdm(
                    total=event.total, unit="B", unit_scale=True, desc="writing", file=sys.stderr
                )
            bar.update(event.nbytes)
        elif event.kind == "backend_start" and show_progress:
            print(f"backend {event.backend}: initializing", file=sys.stderr)

    try:
        from ..backends.compat import DeviceProfile, parse_device_options

        options = parse_device_options(args.device_option)
        if options and not args.device:
            raise ConfigurationError("--device-option needs --device NAME")
        device = DeviceProfile(args.device, options) if args.device else None
        report = specialize(
            args.src,
            args.dst,
            ptd=tuple(args.ptd) if args.ptd else None,
            backends=args.backend,
            mode="create" if args.create else "overwrite",
            event_tracer=tracer,
            storage_options=storage_options(args),
            spool_dir=args.spool_dir,
            device=device,
            provenance=bool(args.provenance or device is not None),
        )
    finally:
        if bar is not None:
            bar.close()
    for name in report.unused_backends:
        print(
            f"ptestore specialize: warning: no delegate in {args.src} has backend id {name!r}; "
            "that backend was not used",
            file=sys.stderr,
        )
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not args.quiet:
        print(format_summary(report))
    return EXIT_OK
