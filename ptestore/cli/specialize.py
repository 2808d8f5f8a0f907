"""``ptestore specialize SRC DST [--backend SPEC]... [--ptd SRC_PTD DST_PTD] [--create]
[--allow-unchanged] [--json] [--quiet] [--no-progress]``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .._text import printable
from ..storage.types import redacted_url
from .exits import EXIT_OK, guarded, redacted
from .options import (
    add_backend_flag,
    add_device_flags,
    add_ptd_flag,
    add_storage_options,
    device_profile,
    human_bytes,
    ptd_pair,
    side_storage_options,
    storage_options,
)
from .output import out, out_json, published, say
from .parser import add_common_flags
from .progress import Progress, progress_wanted

if TYPE_CHECKING:
    from ..coordinator import FileReport, SpecializationReport
    from ..errors import AlreadySpecialized

__all__ = ["add_specialize_parser", "format_summary", "run_specialize"]

_EPILOG = """\
examples:
  ptestore specialize model.pte model.device.pte
  ptestore specialize model.pte out.pte --backend my_pkg.backend:MyBackend@XnnpackBackend
  ptestore specialize model.pte out.pte --ptd model.ptd out.ptd --backend my-npu
  ptestore specialize model.pte s3://bucket/out.pte --dst-option endpoint_url=http://h:9000
  ptestore specialize model.pte copy.pte --backend passthrough

Exit status: 0 success; 1 backend or storage failure (the message says what was
published); 2 bad input: malformed or missing source, unknown backend, bad arguments or
options, an existing DST with --create, refused access, or nothing specialized (no
backend serves an id of the program, every backend declined) without --allow-unchanged.
With --in-place, a SRC that is already specialized is refused (exit 2), unless its own
provenance trailer records exactly this request (the same backends and versions, the
same device, made in place from SRC: a rerun after a crash that recovery rolled
forward): then there is nothing to do (exit 0)."""


def add_specialize_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``specialize`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "specialize",
        help="run backends once and publish the specialized model atomically",
        description="Hand every backend found in SRC to its implementation once, lay the "
        "container out again with the replacements, and publish it atomically at DST. "
        "DST may equal SRC to replace the original. A run that specializes nothing fails "
        "(exit 2, saying why) unless --allow-unchanged is given or passthrough is named.",
        epilog=_EPILOG,
    )
    p.add_argument("src", metavar="SRC", help="source .pte (path or URL)")
    p.add_argument("dst", metavar="DST", help="destination .pte (path or URL; may equal SRC)")
    add_backend_flag(p)
    add_ptd_flag(p, pair=True, help="also rewrite the model's external weights (.ptd)")
    p.add_argument(
        "--create",
        action="store_true",
        help="refuse to replace an existing destination (no-clobber publish)",
    )
    p.add_argument(
        "--allow-unchanged",
        action="store_true",
        help="publish an unchanged copy when nothing was specialized instead of failing",
    )
    p.add_argument("--json", action="store_true", help="print the report (or the error) as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (also: TQDM_DISABLE=1, or stderr not a terminal)",
    )
    p.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="where replacement bytes wait until layout (default: the local destination's "
        "directory, else the system temp dir)",
    )
    add_device_flags(
        p, help="the device profile to specialize for (handed to backends, kept in the provenance)"
    )
    p.add_argument(
        "--provenance",
        dest="provenance",
        action="store_true",
        default=True,
        help="end each output with a provenance trailer (the default; see docs/fleet.md)",
    )
    p.add_argument(
        "--no-provenance",
        dest="provenance",
        action="store_false",
        help="write no provenance trailer (the artifact then cannot be told current or stale)",
    )
    p.add_argument(
        "--in-place",
        action="store_true",
        help="rewrite SRC itself (DST must be SRC) through a journal: crash-safe, about 1x "
        "disk, local files only (see docs/device.md)",
    )
    add_storage_options(p, sides=True)
    add_common_flags(p)
    p.set_defaults(func=run_specialize)
    return p


def _published(f: FileReport) -> str:
    parts = []
    if f.published_size is not None:
        parts.append(human_bytes(f.published_size))
    if f.etag is not None:
        parts.append(f"etag {printable(f.etag)}")  # the storage's words: escaped too
    if f.version_id is not None:
        parts.append(f"version {printable(f.version_id)}")
    if f.checksum is not None:
        parts.append(f"checksum {printable(f.checksum)}")
    return ", ".join(parts) or "nothing reported by the storage"


def format_summary(report: SpecializationReport) -> str:
    """The summary printed on stdout after a successful run: one line per file, the
    paths, and what a backend or the storage said, escaped (:func:`printable`: an escape
    sequence or a carriage return in a name cannot drive the terminal, a line break
    cannot forge a line)."""
    lines = []
    for f in report.files:
        # a destination URL is shown as a source is: its credentials redacted
        source, destination = printable(f.source), printable(redacted_url(f.destination))
        if f.status == "unchanged":
            lines.append(f"{f.role}: {source}: unchanged (nothing replaced, nothing written)")
            continue
        line = (
            f"{f.role}: {source} -> {destination}: {human_bytes(f.size_before)} -> "
            f"{human_bytes(f.size_after)}; {f.segments_replaced}/{f.segments} segments replaced, "
            f"{f.segments_moved} moved, {f.redirected_tables} tables redirected"
        )
        if f.bytes_cloned:
            line += f", {human_bytes(f.bytes_cloned)} shared with the source (reflink)"
        lines.append(line)
        lines.append(f"  published: {_published(f)}")
    for b in report.backends:
        impl = f" ({printable(b.implementation)})" if b.implementation else ""
        bid = printable(b.backend_id)  # the file's delegate id
        if b.status == "specialized":
            lines.append(
                f"backend {bid}{impl}: {b.inputs_seen} inputs, {len(b.keys_replaced)} "
                f"keys and {b.blobs_replaced} blobs replaced, {human_bytes(b.bytes_in)} in, "
                f"{human_bytes(b.bytes_out)} out, {b.seconds:.3f} s"
            )
        elif b.status == "not_supported":
            why = f": {printable(b.reason)}" if b.reason else ""
            lines.append(f"backend {bid}{impl}: declined{why} (data kept as is)")
        else:
            lines.append(f"backend {bid}: no implementation (data kept as is)")
    if not report.specialized:
        lines.append(f"unchanged: {printable(report.unchanged_reason or '')}")
    lines.append(f"published in {report.seconds:.3f} s")
    return "\n".join(lines)


@guarded("specialize", publishes=True)
def run_specialize(args: argparse.Namespace) -> int:
    """Run ``ptestore specialize`` with parsed arguments; returns the exit status."""
    from ..coordinator import nothing_specialized_message, specialize
    from ..errors import AlreadySpecialized, NothingSpecialized

    quiet = args.quiet or args.json
    progress = None if not progress_wanted(disabled=quiet or args.no_progress) else Progress()
    try:
        device = device_profile(args)
        report = specialize(
            args.src,
            args.dst,
            ptd=ptd_pair(args),
            backends=args.backend,
            mode="create" if args.create else "overwrite",
            event_tracer=progress,
            storage_options=storage_options(args),
            src_storage_options=side_storage_options(args, "src"),
            dst_storage_options=side_storage_options(args, "dst"),
            spool_dir=args.spool_dir,
            allow_unchanged=args.allow_unchanged,
            device=device,
            provenance=bool(args.provenance),
            in_place=args.in_place,
        )
    except AlreadySpecialized as exc:
        if not args.in_place or not _asked_before(args, exc, device):
            raise
        _nothing_to_do(args, exc)
        return EXIT_OK
    except NothingSpecialized as exc:
        raise NothingSpecialized(
            f"{exc} Nothing was published; --allow-unchanged publishes an unchanged copy.",
            backend_ids=exc.backend_ids,
            installed=exc.installed,
            hint=exc.hint,
        ) from None
    finally:
        if progress is not None:
            progress.close()
    # Everything was published already: an error or interrupt while reporting it must
    # not read as "nothing was published" (exits.error_message says what was).
    files = sorted(report.files, key=lambda f: f.role != "ptd")
    written = [redacted_url(f.destination) for f in files]
    published(" and ".join(written) or args.dst)
    _report(args, report, nothing_specialized_message(report))
    return EXIT_OK


def _asked_before(args: argparse.Namespace, exc: AlreadySpecialized, device: Any) -> bool:
    """Whether the in-place file's own record is exactly this request, made in place
    from the file itself, its content intact (what ``ensure(in_place=True)`` adopts:
    :func:`~ptestore.device.in_place.is_own_output`)."""
    import os

    from ..device.in_place import is_own_output
    from ..device.keys import backend_versions
    from ..errors import PteStoreError

    record: Any = exc.provenance
    if record is None or not exc.path:
        return False
    path = os.path.realpath(exc.path)
    try:
        versions = backend_versions(args.backend)
    except PteStoreError:  # a backend that cannot be loaded: not this request's
        return False
    return is_own_output(path, record, versions, device, made_from=path)


def _nothing_to_do(args: argparse.Namespace, exc: AlreadySpecialized) -> None:
    from ..coordinator.respecialize import describe_record

    record: Any = exc.provenance
    if args.json:
        out_json({"nothing_to_do": True, "path": exc.path, "provenance": record.to_dict()})
    elif not args.quiet:
        out(
            f"{printable(exc.path)}: already specialized by "
            f"{printable(describe_record(record))}: nothing to do"
        )


def _report(args: argparse.Namespace, report: SpecializationReport, message: str | None) -> None:
    from ..backends.registry import did_you_mean

    ids = [b.backend_id for b in report.backends]
    for name in report.unused_backends:
        say(
            f"ptestore specialize: warning: no delegate in {printable(args.src)} has backend "
            f"id {name!r}"
            f"{did_you_mean(name, ids)}; that backend was not used"
        )
    if message is not None:  # only with --allow-unchanged: strict runs raise instead
        say(f"ptestore specialize: warning: {printable(message)}")
    if args.json:
        out_json(redacted(report.to_dict()))  # every URL in it as shown: no credential
    elif not args.quiet:
        out(format_summary(report))
