"""``ptestore fleet run JOBFILE [--workers N] [--scheduler ADDRESS] [--pair-timeout SECONDS]
[--json] [--quiet] [--no-progress] [--report FILE]``,
``ptestore fleet plan JOBFILE [--json] [--report FILE]``, ``ptestore fleet retire JOBFILE`` and
``ptestore fleet check-index INDEX [--repair] [--models NAMES]``.

Exit status of ``run``: 0 when every pair is done or skipped and indexed, 1 when any
failed or was left out of the index (``index_error``; each reason, a model whose entries
could not be published among them, in ``index_errors``), 2 for a bad job file (the
message names the line and key) or an unreachable scheduler.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import ConfigurationError
from .exits import EXIT_FAILURE, EXIT_OK, guarded
from .options import add_storage_options, storage_options
from .output import out, out_json, published, say, write_stdout
from .parser import add_common_flags
from .progress import progress_wanted

__all__ = ["add_fleet_parser", "run_check_index", "run_fleet", "run_retire"]

_EPILOG = """\
examples:
  ptestore fleet plan job.toml
  ptestore fleet run job.toml --workers 4
  ptestore fleet run job.toml --scheduler tcp://scheduler:8786 --json
  ptestore fleet retire job.toml --dry-run
  ptestore fleet check-index s3://models/fleet/ptestore-index.json --repair"""

_RUN_EPILOG = """\
examples:
  ptestore fleet run job.toml                # every pair not current, a worker per CPU
  ptestore fleet run job.toml --workers 4 --report matrix.html
  ptestore fleet run job.toml --models mlp --devices pixel9,galaxy-s24 --fail-fast
  ptestore fleet run job.toml --pair-timeout 600 --json
  ptestore fleet run job.toml --scheduler tcp://scheduler:8786 --no-progress"""

_PLAN_EPILOG = """\
examples:
  ptestore fleet plan job.toml               # run or skip each pair, and why
  ptestore fleet plan job.toml --devices pixel9 --json
  ptestore fleet plan job.toml --report plan.json"""

_RETIRE_EPILOG = """\
examples:
  ptestore fleet retire job.toml --dry-run   # the entries it would retire
  ptestore fleet retire job.toml
  ptestore fleet retire job.toml --all-jobs --json"""

_CHECK_INDEX_EPILOG = """\
examples:
  ptestore fleet check-index s3://models/fleet/ptestore-index.json
  ptestore fleet check-index s3://models/fleet/ptestore-index.json --repair --models mlp
  ptestore fleet check-index out/ptestore-index.json --json"""


def add_fleet_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ptestore fleet run`` and ``ptestore fleet plan`` to ``subparsers``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "fleet",
        help="specialize every (model, device) pair of a job file",
        description="Run or plan a fleet job (a TOML file listing models, device profiles, "
        "backends and a destination template). See docs/fleet.md.",
        epilog=_EPILOG,
    )
    sub = p.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    r = sub.add_parser(
        "run",
        help="run every pair that is not current",
        description="Specialize every (model, device) pair whose destination does not "
        "already hold an artifact with matching provenance. Exit status: 0 all done or "
        "skipped and indexed, 1 a pair failed or was left out of the index, 2 bad job "
        "file.",
        epilog=_RUN_EPILOG,
    )
    r.add_argument("job", metavar="JOBFILE", help="the job file (TOML)")
    r.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="local worker processes (default: the CPU count; 1 runs inline, or in one "
        "worker process with --pair-timeout)",
    )
    r.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="run on a Dask distributed scheduler (tcp://host:port; default: "
        "$PTESTORE_DASK_SCHEDULER)",
    )
    r.add_argument(
        "--pair-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail a pair still running after SECONDS and stop its worker process "
        "(SIGTERM, then SIGKILL); the pair is not run again; not with --scheduler "
        "(default: no limit)",
    )
    _filters(r)
    r.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first failed pair (pairs not started are reported failed)",
    )
    r.add_argument("--json", action="store_true", help="print the result as one JSON object")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    r.add_argument(
        "--report",
        metavar="FILE",
        default=None,
        help="also write the models x devices matrix: an HTML page, or JSON if FILE ends "
        "with .json",
    )
    r.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (also: TQDM_DISABLE=1, or stderr not a terminal)",
    )
    add_common_flags(r)
    r.set_defaults(func=run_fleet)
    pl = sub.add_parser(
        "plan",
        help="list what a run would do, without doing it",
        description="For every pair: run or skip, and why. Reads each source once and "
        "each destination's trailer; writes nothing.",
        epilog=_PLAN_EPILOG,
    )
    pl.add_argument("job", metavar="JOBFILE", help="the job file (TOML)")
    _filters(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument(
        "--report",
        metavar="FILE",
        default=None,
        help="also write the models x devices matrix: an HTML page, or JSON if FILE ends "
        "with .json",
    )
    add_common_flags(pl)
    pl.set_defaults(func=run_fleet)
    rt = sub.add_parser(
        "retire",
        help="retire the index entries of pairs the job no longer names",
        description="Mark every entry of the job's index that this job file wrote and "
        "whose model or device the job no longer names as retired: select, fetch and "
        "ensure never return it, and gc no longer counts its files as referenced. Entries "
        "other job files wrote under the prefix are left (--all-jobs: retired too). Exit "
        "status: 0, 1 storage failure, 2 bad job file.",
        epilog=_RETIRE_EPILOG,
    )
    rt.add_argument("job", metavar="JOBFILE", help="the job file (TOML)")
    rt.add_argument("--dry-run", action="store_true", help="list them, change nothing")
    rt.add_argument(
        "--all-jobs",
        action="store_true",
        help="also retire entries other job files (or none) wrote under the prefix",
    )
    rt.add_argument("--json", action="store_true", help="print the result as JSON")
    add_common_flags(rt)
    rt.set_defaults(func=run_retire)
    ci = sub.add_parser(
        "check-index",
        help="check a sharded index's catalogs against its leaves (and repair them)",
        description="Check that every model's catalog of a version 3 index (what select "
        "rates) agrees with the entries its leaves hold; with --repair, rebuild each one "
        "that does not, or that an interrupted rebuild left marked, from its leaves (safe "
        "beside running fleet runs). Exit status: 0 every catalog agrees (or was "
        "repaired), 1 some do not (while runs publish, a catalog may lag its leaves for a "
        "moment: check again once they are done), 2 no index there.",
        epilog=_CHECK_INDEX_EPILOG,
    )
    ci.add_argument(
        "index", metavar="INDEX", help="the index (path or URL of its ptestore-index.json)"
    )
    ci.add_argument("--repair", action="store_true", help="rebuild the catalogs found wrong")
    ci.add_argument(
        "--models",
        metavar="NAME[,NAME]",
        action="append",
        default=None,
        help="only these models (comma-separated; repeatable): their objects alone are read",
    )
    ci.add_argument("--json", action="store_true", help="print the result as JSON")
    add_storage_options(ci)
    add_common_flags(ci)
    ci.set_defaults(func=run_check_index)
    return p


@guarded("fleet")
def run_check_index(args: argparse.Namespace) -> int:
    """Run ``ptestore fleet check-index INDEX [--repair] [--json]``."""
    from ..fleet.index_check import check_index

    models = _names(args.models)
    found = check_index(args.index, storage_options(args), repair=args.repair, models=models)
    code = EXIT_OK if found.ok else EXIT_FAILURE
    if args.json:
        out_json(found.to_dict())
        return code
    lines = []
    if found.version != 3:  # its entries checked: one that is not an entry is a problem
        for problems in found.problems.values():
            lines += [f"{found.index}: {problem}" for problem in problems]
        lines.append(
            f"{found.index}: index version {found.version}: one object, no catalogs to check"
        )
        out("\n".join(lines))
        return code
    for model, problems in found.problems.items():
        lines += [f"{model}: {problem}" for problem in problems]
    for model in found.marked:
        lines.append(f"{model}: its catalog carries a rebuild's mark (an interrupted rebuild)")
    for model in found.repaired:
        left = found.left.get(model)
        lines.append(f"{model}: rebuilt" + (f", still: {'; '.join(left)}" if left else ""))
    for model, left in found.left.items():
        if model not in found.repaired:  # a rebuild that could not be written
            lines.append(f"{model}: {'; '.join(left)}")
    wrong = len(set(found.problems) | set(found.marked))
    fixed = [m for m in found.repaired if m not in found.left]
    lines.append(
        f"{found.index}: {found.models} models, {wrong} catalogs wrong"
        + (f", {len(fixed)} repaired" if args.repair and (found.problems or found.marked) else "")
    )
    out("\n".join(lines))
    return code


@guarded("fleet")
def run_retire(args: argparse.Namespace) -> int:
    """Run ``ptestore fleet retire JOBFILE [--dry-run] [--json]``."""
    from ..fleet import load_job
    from ..fleet.retire import retire_dropped

    done = retire_dropped(load_job(args.job), dry_run=args.dry_run, all_jobs=args.all_jobs)
    if args.json:
        out_json(done.to_dict())
        return EXIT_OK
    if not done.found:
        out(f"no index at {done.index}: nothing to retire")
        return EXIT_OK
    verb = "would retire" if args.dry_run else "retired"
    lines = [f"{verb} {e['model']}/{e['device']}: {e['reason']}" for e in done.retired]
    others = f", {done.others} of other jobs left" if done.others else ""
    lines.append(
        f"{verb} {len(done.retired)} entries of {done.index} ({done.already} retired before"
        f"{others})"
    )
    out("\n".join(lines))
    return EXIT_OK


def _names(values: list[str] | None) -> list[str] | None:
    """The names of a repeatable comma-separated flag (``--models a,b --models c``)."""
    return None if values is None else [n for v in values for n in v.split(",") if n]


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        metavar="NAME[,NAME]",
        action="append",
        default=None,
        help="only these models of the job (comma-separated; repeatable)",
    )
    p.add_argument(
        "--devices",
        metavar="NAME[,NAME]",
        action="append",
        default=None,
        help="only these devices of the job (comma-separated; repeatable)",
    )


@guarded("fleet", publishes=True)
def run_fleet(args: argparse.Namespace) -> int:
    """Run ``ptestore fleet run|plan``: exit 0 every pair done or skipped (and, for
    ``run``, indexed), 1 a pair failed (or was left out of the index), 2 a bad job file
    or an unreachable scheduler."""
    from ..fleet import load_job, plan_job, run_plan
    from ..fleet.preflight import filter_job, preflight

    report_out = False  # --report - (or /dev/stdout): the report is the output
    if args.report:
        from ..viz.html import check_output_path, is_stdout

        check_output_path(args.report, "--report")
        report_out = is_stdout(args.report)
        if report_out and args.json:
            raise ConfigurationError(
                f"--report {args.report} writes the report on stdout, where --json writes "
                "its object: give --report a FILE, or leave out --json"
            )

    if args.fleet_command == "run":  # before the job is read and planned
        from ..fleet.runner import check_pair_timeout

        check_pair_timeout(args.pair_timeout, args.scheduler)
    job = filter_job(load_job(args.job), _names(args.models), _names(args.devices))
    # A job-wide mistake (a backend, an option, a source, an unwritable destination)
    # is one message and exit 2, before any pair.
    preflight(job, write=args.fleet_command == "run")
    plan = plan_job(job)
    if args.fleet_command == "plan":
        code = EXIT_FAILURE if plan.count("fail") else EXIT_OK
        if report_out:
            write_stdout(_report_text(args.report, plan))
        elif args.report:
            from ..viz.matrix import write_report

            write_report(args.report, plan)
        if args.json:
            shown = {
                "pairs": [p.to_dict() for p in plan.pairs],
                "estimate": plan.estimate.to_dict(),
            }
            out_json(shown)
        elif not report_out:
            out(plan.render())
        return code
    show = progress_wanted(disabled=args.quiet or args.json or args.no_progress)
    bar: Any = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=len(plan.pairs), unit="pair", desc="pairs", file=sys.stderr)

    def progress(result: Any) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{result.model}/{result.device} {result.status}")

    from ..fleet.runner import FleetInterrupted

    try:
        result = run_plan(
            plan,
            workers=args.workers,
            scheduler=args.scheduler,
            progress=progress,
            fail_fast=args.fail_fast,
            pair_timeout=args.pair_timeout,
        )
    except FleetInterrupted as stop:
        if bar is not None:
            bar.close()
            bar = None
        # The partial summary: which pairs were published, then exit 130.
        if args.json:
            # One JSON document: the result (no error object after it, whose
            # "published" could not say which pairs were), the message on stderr.
            from .exits import EXIT_INTERRUPTED, error_message

            out_json({**stop.result.to_json(), "interrupted": True})
            say(error_message("fleet", stop, publishes=True))
            return EXIT_INTERRUPTED
        if not args.quiet:
            out(stop.result.summary())
        raise
    finally:
        if bar is not None:
            bar.close()
    # The pairs and the index are published: an error or interrupt while reporting them
    # must not read as "nothing was published" (exits.error_message says what was).
    done = result.count("done")
    published(
        f"{done} pair{'' if done == 1 else 's'}"
        + (f" and the index {result.index}" if result.index else "")
    )
    code = result.exit_code
    if report_out:
        write_stdout(_report_text(args.report, plan, result))
    elif args.report:
        from ..errors import PteStoreError
        from ..viz.matrix import write_report

        try:
            write_report(args.report, plan, result)
        except PteStoreError as exc:  # the pairs are published: say so, exit 1
            say(f"ptestore fleet: the report was not written: {exc}")
            code = max(code, EXIT_FAILURE)
    if args.json:
        out_json(result.to_json())
    elif not args.quiet and not report_out:
        out(result.summary())
    return code


def _report_text(path: str, plan: Any, result: Any = None) -> str:
    """The ``--report`` written on stdout: JSON when ``path`` ends with ``.json``, else
    the HTML page (as :func:`ptestore.viz.matrix.write_report` writes a file)."""
    import json

    from ..viz.matrix import matrix_data, matrix_html

    data = matrix_data(plan, result)
    return json.dumps(data, indent=2) + "\n" if path.endswith(".json") else matrix_html(data)
