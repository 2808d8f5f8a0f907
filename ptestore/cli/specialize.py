"""``ptestore specialize SRC DST [--backend SPEC]... [--ptd SRC_PTD DST_PTD] [--create]
[--json] [--quiet]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import (
    BackendError,
    ConfigurationError,
    FormatError,
    ObjectNotFound,
    PartialPublish,
    PteStoreError,
    PublishUncertain,
)

__all__ = ["add_specialize_parser", "format_summary", "run_specialize"]


def add_specialize_parser(sub: Any) -> None:
    from . import _add_storage_options

    p = sub.add_parser(
        "specialize",
        help="run backends once and publish the specialized model atomically",
        description="Hand every backend found in SRC to its implementation once, lay the "
        "container out again with the replacements, and publish it atomically at DST. "
        "DST may equal SRC to replace the original. Exit status: 0 success, 1 backend or "
        "storage failure, 2 bad input.",
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
    _add_storage_options(p)
    p.set_defaults(func=run_specialize)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_summary(report: Any) -> str:
    lines = []
    for f in report.files:
        lines.append(
            f"{f.role}: {f.source} -> {f.destination}: {_human(f.size_before)} -> "
            f"{_human(f.size_after)}; {f.segments_replaced}/{f.segments} segments replaced, "
            f"{f.segments_moved} moved, {f.redirected_tables} tables redirected"
        )
    for b in report.backends:
        if b.status == "specialized":
            lines.append(
                f"backend {b.backend_id}: {b.inputs_seen} inputs, {len(b.keys_replaced)} keys "
                f"and {b.blobs_replaced} blobs replaced, {_human(b.bytes_in)} in, "
                f"{_human(b.bytes_out)} out, {b.seconds:.3f} s"
            )
        elif b.status == "not_supported":
            lines.append(f"backend {b.backend_id}: declined (data kept as is)")
        else:
            lines.append(f"backend {b.backend_id}: no implementation (data kept as is)")
    lines.append(f"published in {report.seconds:.3f} s")
    return "\n".join(lines)


def run_specialize(args: argparse.Namespace) -> int:
    from ..coordinator import Event, specialize

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
        report = specialize(
            args.src,
            args.dst,
            ptd=tuple(args.ptd) if args.ptd else None,
            backends=args.backend,
            mode="create" if args.create else "overwrite",
            event_tracer=tracer,
            storage_options=dict(args.storage_option),
            spool_dir=args.spool_dir,
        )
    except (FormatError, ConfigurationError, ObjectNotFound) as exc:
        if bar is not None:
            bar.close()
        print(f"ptestore specialize: error: {exc}", file=sys.stderr)
        return 2
    except PartialPublish as exc:
        if bar is not None:
            bar.close()
        print(f"ptestore specialize: failed after a partial publish: {exc}", file=sys.stderr)
        return 1
    except PublishUncertain as exc:
        if bar is not None:
            bar.close()
        print(f"ptestore specialize: publish uncertain: {exc}", file=sys.stderr)
        return 1
    except (BackendError, PteStoreError, OSError) as exc:
        if bar is not None:
            bar.close()
        print(f"ptestore specialize: failed, nothing published: {exc}", file=sys.stderr)
        return 1
    args.published = " and ".join(
        f.destination for f in sorted(report.files, key=lambda f: f.role != "ptd")
    ) or str(args.dst)
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
    return 0
