"""``ptestore verify URL [--source SRC] [--backend SPEC]... [--device NAME
[--device-option K=V]... | --job JOB] [--ptd PTD] [--quick] [--range START:END] [--json]``.

Exit status: 0 intact or current, 1 stale or mismatched (the message names the field),
or an object replaced while it was read ("changed while being verified"), 2 bad input
or a corrupt artifact.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigurationError, ObjectNotFound, PreconditionFailed, StorageError
from .exits import guarded, redacted, with_verdict
from .options import (
    add_backend_flag,
    add_device_flags,
    add_ptd_flag,
    add_storage_options,
    device_or_name,
    storage_options,
)
from .output import out, out_json, say
from .parser import add_common_flags

__all__ = ["add_verify_parser", "run_verify"]

_EPILOG = """\
examples:
  ptestore verify out.pte                  # intact: structure, trailer and bytes
  ptestore verify out.pte --quick          # without the full read of the bytes
  ptestore verify out.pte --range 0:4194304  # only the chunks of those bytes
  ptestore verify out.pte --backend my_pkg.backend:MyBackend --device pixel9 \
      --device-option soc=sm8650
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
        "was made for that profile. Without any of them only integrity is checked and the "
        "answer is 'intact'. Exit status: 0 intact or current, 1 stale (or an object "
        "changed while being verified), 2 bad input or corrupt (the bytes do not match "
        "the SHA-256 the provenance records).",
        epilog=_EPILOG,
    )
    p.add_argument(
        "url",
        metavar="URL",
        nargs="?",
        default=None,
        help="the artifact (.pte or .ptd; path or URL); without it, --job checks every pair",
    )
    p.add_argument("--source", metavar="SRC", help="the source it should have been made from")
    add_backend_flag(p, help="a backend it should have been made with (repeatable, in order)")
    add_device_flags(
        p,
        help="the device profile it should have been made for (options from --job or "
        "--device-option; without options only the name is compared)",
        option_help="an option of the --device profile (VALUE parsed as JSON if it can be); "
        "repeatable; not with --job",
    )
    add_ptd_flag(
        p, help="the .ptd of a .pte (default: the one beside it, when its record names one)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="skip the full read that checks the bytes against the recorded SHA-256",
    )
    p.add_argument(
        "--range",
        metavar="START:END",
        default=None,
        help="check only the bytes in START:END (END exclusive; either may be empty; an END "
        "past the content is its end) against the record's chunk digests, widened to whole "
        "chunks (as --quick otherwise)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="a fleet job file: its storage options, and for URL, a destination of the "
        "job, its pair's source, device and backends (with --device NAME any URL: that "
        "device's options and the job's backends; another URL is refused)",
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
    from ..verification import verify

    if args.url is None:
        return _verify_job(args)
    from ..provenance.check import parse_range

    # Bad arguments and a missing file are errors, as for every command (the error
    # object, exit 2), raised before anything is read; "invalid" is the verdict on a
    # file that is there and fails its checks.
    byte_range = None if args.range is None else parse_range(args.range)
    source, backends, device, options, cpu, ptd_source = _inputs(args)
    report = verify(
        args.url,
        source=source,
        backends=backends,
        device=device,
        storage_options=options,
        ptd=args.ptd,
        quick=args.quick or args.range is not None,
        xnnpack_cpu=cpu,
        ptd_source=ptd_source,
        as_planned=args.job is not None,  # sources judged as fleet plan judges them
    )
    if byte_range is not None and report.exit_code == 0:
        checked = _check_range(args, report, options, byte_range)
        if checked is not None:
            return _range_intact(args, report, checked)
        # else a damaged chunk in the range: report is invalid, said as the full check's

    def write() -> None:
        if args.json:  # the report on stdout; the reason of a failed verdict on stderr too
            out_json(redacted(report.to_dict()))
            if report.exit_code != 0:
                say(redacted(report.message()))
        elif report.exit_code == 0:
            out(redacted(report.message()))
        else:
            say(redacted(report.message()))

    return with_verdict(report.exit_code, write)


def _check_range(
    args: argparse.Namespace, report: Any, options: dict[str, Any], byte_range: tuple[int, int]
) -> Any:
    """``verify URL --range START:END`` once the artifact is intact or current
    (structure and record, ``--quick``): the chunks covering the range, checked. The
    ``BytesChecked``, or None when a chunk in it is damaged: ``report`` is then the
    ``invalid`` verdict naming that chunk and its bytes (damage is a verdict, as the full
    check says it; bad input stays an error). ``options``: the storage options verify
    was given (a ``--job`` file's too), routed to URL as verify routes them."""
    from ..errors import FormatError
    from ..provenance.check import check_bytes
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader

    if report.shared:  # check_bytes would say "no provenance record" without why
        raise ConfigurationError(
            f"{args.url}: --range checks bytes against the chunk digests of a provenance "
            "record, and a shared content-addressed .ptd carries none by design (a fleet "
            "stores it once, named by the digest of its bytes, without a trailer): verify "
            "it without --range (all its bytes against its content address), or verify "
            "the .pte files that use it"
        )
    loader = open_loader(args.url, **options_for_loader(args.url, options, "dst"))
    try:
        return check_bytes(loader, byte_range)
    except PreconditionFailed as exc:  # as verify() says it: not damage, verify it again
        raise StorageError(
            f"{args.url}: changed while being verified (verify it again): {exc}"
        ) from exc
    except FormatError as exc:  # a damaged chunk (its bytes named): the verdict
        report.status = "invalid"
        report.error = str(exc)
        return None
    finally:
        loader.close()


def _range_intact(args: argparse.Namespace, report: Any, checked: Any) -> int:
    """The verdict of a range whose chunks all check: ``URL: bytes A:B intact``."""
    n = checked.chunks
    what = f"{n} chunk{'s' if n != 1 else ''} of the record" if n else "the whole content"
    if args.json:
        shown = report.to_dict()
        shown["range"] = {"start": checked.start, "end": checked.end, "chunks": n}
        out_json(redacted(shown))
    else:
        from .._text import printable

        url = printable(redacted(args.url))
        out(f"{url}: bytes {checked.start}:{checked.end} intact ({what} checked)")
    return 0


def _inputs(
    args: argparse.Namespace,
) -> tuple[Any, Any, Any, dict[str, Any], str | None, str | None]:
    """What to verify ``args.url`` against: ``(source, backends, device, options, cpu,
    ptd_source)``; with ``--job``, from the pair whose destination the URL is."""
    options: dict[str, Any] = storage_options(args)
    source = args.source
    backends = args.backend
    device: Any = None
    cpu = None
    ptd_source = None
    if args.job is None:
        # Without options only the name is compared (backends get a profile of that name).
        return source, backends, device_or_name(args), options, None, None
    if args.device_option:
        raise ConfigurationError(
            "--device-option cannot be given with --job (the job file has the options)"
        )
    from ..fleet import load_job

    job = load_job(args.job)
    # The job's options, as the fleet used them: verify routes them to each side (those
    # given here, checked against what is verified; the job's, where they can apply).
    given = options
    from ..coordinator.targets import same_target

    # Any spelling of a destination (relative or absolute, repeated slashes, file://,
    # a link to it) is that destination: compared as the store will address it.
    pairs = job.pairs()
    for pair in pairs:
        is_ptd = pair.ptd_destination is not None and same_target(args.url, pair.ptd_destination)
        if is_ptd or same_target(args.url, pair.destination):
            if source is None:
                source = pair.model.ptd if is_ptd else pair.model.source
                # A .pte's record names its .ptd's source too: compared as well.
                ptd_source = None if is_ptd else pair.model.ptd
            if args.device is None:
                device = pair.device
            if not is_ptd:
                cpu = pair.xnnpack_cpu
            break
    else:
        _check_not_a_destination(args, job, pairs)
    if args.device is not None:
        device = job.device(args.device)
        cpu = job.xnnpack_cpu.get(args.device)
    if backends is None:
        backends = list(job.backends)
    from ..storage.types import StorageURL

    urls = [u for u in (args.url, source, ptd_source) if u is not None]
    if any(not StorageURL.of(u).local for u in urls):
        options = {**job.storage_options, **given}
    return source, backends, device, options, cpu, ptd_source


#: How many of a job's destinations the refusal of another URL names.
_NEAREST = 3


def _check_not_a_destination(args: argparse.Namespace, job: Any, pairs: list[Any]) -> None:
    """``verify URL --job JOB`` of a URL no pair of the job writes: it gets none of a
    pair's source, device or backends to compare with, so without ``--device NAME``
    (that device of the job: its profile and the job's backends) it would say "current"
    having compared nothing (a copy under another name, a mistyped path): refused,
    naming the job's nearest destinations. A fleet's shared content-addressed ``.ptd``
    is taken (the job's storage options; at most intact, as without ``--job``)."""
    from ..fleet.shared import is_shared_url

    if args.device is not None or is_shared_url(args.url):
        return
    from .._text import printable
    from ..coordinator.targets import target_identity
    from ..storage.types import redacted_url
    from .parser import nearest

    dsts = [d for p in pairs for d in (p.destination, p.ptd_destination) if d is not None]
    # Compared as the store addresses them: a relative path as its absolute one.
    by_key = {":".join(target_identity(d)): d for d in dsts}
    want = ":".join(target_identity(args.url))
    near: list[str] = []
    while len(near) < _NEAREST and (key := nearest(want, by_key)) is not None:
        near.append(by_key.pop(key))
    named = near or dsts[:_NEAREST]
    listed = ", ".join(printable(redacted_url(d)) for d in named)
    if not near and len(dsts) > len(named):
        listed += f" and {len(dsts) - len(named)} more"
    raise ConfigurationError(
        f"{args.url}: not a destination of the job {job.path} "
        f"({'nearest' if near else 'its destinations'}: {listed}): --job compares a "
        "destination with its pair's source, device and backends, and this URL is none "
        "(a copy under another name, a mistyped path); give a destination of the job, "
        "or --device NAME to compare it with that device of the job and its backends "
        "(--source SRC for what it was made from)"
    )


def _any_remote(pair: Any) -> bool:
    """Whether a job's pair reads or writes any remote URL (its options apply to it)."""
    from ..storage.types import StorageURL

    urls = (pair.model.source, pair.model.ptd, pair.destination, pair.ptd_destination)
    return any(u is not None and not StorageURL.of(u).local for u in urls)


def _verify_job(args: argparse.Namespace) -> int:
    """``verify --job JOB``: every pair of the job, a few at once; exit the worst."""
    import concurrent.futures as cf

    from ..fleet import load_job
    from ..verification import VerifyReport, verify

    if args.job is None:
        raise ConfigurationError("verify needs URL, or --job JOB to check every pair of a job")
    if args.source or args.backend or args.device or args.device_option or args.ptd:
        raise ConfigurationError(
            "verify --job without URL takes each pair's source, backends and device from "
            "the job: --source, --backend, --device, --device-option and --ptd do not apply"
        )
    if args.range is not None:  # the bytes of one file: each pair's are others
        raise ConfigurationError(
            f"verify --job without URL checks every pair of the job: --range {args.range} "
            "names bytes of one artifact (give its URL: verify URL --job JOB --range "
            "START:END); --quick checks every pair without reading its bytes"
        )
    job = load_job(args.job)
    # The job's options as the fleet used them: verify routes them to each side. Checked
    # once against the whole job (as the fleet's preflight does), then given to the
    # pairs they can apply to: a local pair of a job that also has remote ones takes none.
    options = {**job.storage_options, **storage_options(args)}
    pairs = job.pairs()
    if options:
        from ..storage.routing import StorageOptions

        StorageOptions(options).check(
            [u for p in pairs for u in (p.model.source, p.model.ptd) if u is not None],
            [u for p in pairs for u in (p.destination, p.ptd_destination) if u is not None],
        )

    def one(pair: Any) -> Any:
        try:
            return checked(pair)
        except (ObjectNotFound, ConfigurationError) as exc:  # this pair's: not made yet,
            return VerifyReport(str(pair.destination), status="invalid", error=str(exc))
        except StorageError as exc:  # this pair's storage, not the others': said per pair
            return VerifyReport(str(pair.destination), status="unverified", error=str(exc))

    def checked(pair: Any) -> Any:
        return verify(
            pair.destination,
            source=pair.model.source,
            backends=list(job.backends),
            device=pair.device,
            storage_options=options if _any_remote(pair) else {},
            quick=args.quick,
            xnnpack_cpu=pair.xnnpack_cpu,
            ptd_source=pair.model.ptd,
            as_planned=True,
        )

    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        reports = list(pool.map(one, pairs))
    code = max((r.exit_code for r in reports), default=0)

    def write() -> None:
        if args.json:  # the reports on stdout; each failed pair's reason on stderr too
            out_json(redacted({"exit_code": code, "pairs": [r.to_dict() for r in reports]}))
            for r in reports:
                if r.exit_code != 0:
                    say(redacted(r.message()))
            return
        for r in reports:
            if r.exit_code == 0:
                out(redacted(r.message()))
            else:
                say(redacted(r.message()))
        counts = {
            s: sum(1 for r in reports if r.status == s)
            for s in ("current", "stale", "invalid", "unverified")
        }
        out(
            f"{len(reports)} pairs: {counts['current']} current, {counts['stale']} stale, "
            f"{counts['invalid']} invalid"
            + (f", {counts['unverified']} not verified" if counts["unverified"] else "")
        )

    return with_verdict(code, write)
