"""``ptestore inspect URL [--json]``: the structure of a .pte or .ptd, from its metadata."""

from __future__ import annotations

import argparse
from typing import Any

from .._text import printable
from ..errors import ConfigurationError
from .exits import EXIT_OK, guarded
from .options import add_ptd_flag, add_storage_options, storage_options
from .output import out, out_json, write_stdout
from .parser import add_common_flags

__all__ = ["add_inspect_parser", "run_inspect"]

_EPILOG = """\
examples:
  ptestore inspect model.pte
  ptestore inspect model.pte --ptd model.ptd
  ptestore inspect --json model.ptd | jq '.named_data[] | {key, size, dtype: .tensor_info.dtype}'
  ptestore inspect s3://bucket/models/model.pte -o endpoint_url=http://127.0.0.1:9000
  ptestore inspect pixel9/model.pte --compare model.pte        # what specializing changed
  ptestore inspect pixel9/model.pte --compare model.pte --json
  ptestore inspect pixel9/model.pte --compare model.pte --html map.html

Exit status: 0 success, 1 storage failure, 2 malformed or missing file, refused access
or bad arguments."""


def add_inspect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="show the structure of a .pte or .ptd",
        description="Show header, methods, delegates (with compile specs), segments, named "
        "data (size, dtype and shape of each key) and wasted bytes of a .pte or .ptd. "
        "Reads only the metadata.",
        epilog=_EPILOG,
    )
    p.add_argument(
        "url", metavar="URL", help="local path or fsspec URL (file://, memory://, s3://)"
    )
    add_ptd_flag(
        p,
        help="the .ptd of the .pte at URL: describe both, and where every key's bytes are "
        "(with --html: draw both)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--html",
        metavar="FILE",
        default=None,
        help="write the layout map (one self-contained HTML page) to FILE",
    )
    p.add_argument(
        "--compare",
        metavar="SRC",
        default=None,
        help="compare URL with the source SRC it was specialized from: which segments "
        "and keys were replaced, grown, shrunk, moved, cloned, added or removed, and their "
        "bytes (text, --json, or drawn with --html); reads the segment bytes of both",
    )
    p.add_argument(
        "--compare-ptd",
        metavar="SRC_PTD",
        default=None,
        help="with --compare and --ptd: compare PTD with its source SRC_PTD too",
    )
    add_storage_options(p)
    add_common_flags(p)
    p.set_defaults(func=run_inspect)
    return p


def _print_json(obj: object) -> None:
    """``obj`` as JSON on stdout, the whole text made before any of it is written (an
    error while making it leaves stdout empty for the error's own object) and strict
    JSON (a NaN or infinity is refused, not written as ``NaN``)."""
    out_json(obj, strict=True)


@guarded("inspect")
def run_inspect(args: argparse.Namespace) -> int:
    """Run ``ptestore inspect`` with parsed arguments; returns the exit status."""
    from ..inspection import describe_files, read_files, render_files

    if args.html is not None:
        from ..viz.html import check_output_path, is_stdout
        from ..viz.layout import layout_html, write_layout_html

        check_output_path(args.html, "--html")
        drawn: dict[str, Any] = {
            "ptd": args.ptd,
            "compare": args.compare,
            "compare_ptd": args.compare_ptd,
            **storage_options(args),
        }
        if is_stdout(args.html):  # `-`, /dev/stdout: the page is the output
            if args.json:
                raise ConfigurationError(
                    f"--html {args.html} writes the page on stdout, where --json writes its "
                    "object: give --html a FILE, or leave out --json"
                )
            write_stdout(layout_html(args.url, **drawn))
            return EXIT_OK
        write_layout_html(args.html, args.url, **drawn)
        if not args.json:
            out(f"wrote {printable(args.html)}")
            return EXIT_OK
    elif args.compare_ptd and not args.compare:
        raise ConfigurationError("--compare-ptd SRC_PTD needs --compare SRC (or --html FILE)")
    elif args.compare:
        from ..format.layoutdiff import render_changes
        from ..viz.layout import compare_files

        changes = compare_files(
            args.url,
            args.compare,
            ptd=args.ptd,
            compare_ptd=args.compare_ptd,
            **storage_options(args),
        )
        if args.json:
            _print_json(changes)
            return EXIT_OK
        texts = [render_changes(changes, file=changes["file"], source=changes["source"])]
        if "ptd" in changes:
            d = changes["ptd"]
            texts.append(render_changes(d, file=d["file"], source=d["source"]))
        out("\n\n".join(texts))
        return EXIT_OK
    files = read_files(args.url, args.ptd, **storage_options(args))
    if args.json:
        _print_json(describe_files(files))
    else:
        out(render_files(files))
    return EXIT_OK
