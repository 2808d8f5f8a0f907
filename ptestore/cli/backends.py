"""``ptestore backends [--json]``: the installed backends and what each serves."""

from __future__ import annotations

import argparse
from typing import Any

from .exits import EXIT_FAILURE, EXIT_OK, guarded
from .output import out, out_json
from .parser import add_common_flags

__all__ = ["add_backends_parser", "run_backends"]

_EPILOG = """\
examples:
  ptestore backends
  ptestore backends --json | jq '.[] | select(.error != null)'

Exit status: 0, or 1 when an installed backend cannot be loaded (listed with its error)."""


def add_backends_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``backends`` sub-command to an ``argparse`` sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "backends",
        help="list the installed backends (registered and entry points)",
        description="List every installed backend: the name `--backend` takes, the backend "
        "id it serves by default ('*': a generic backend, used for the id it is named for), "
        "where it comes from (package.module:attr), its origin (registered or entry point "
        "of the group ptestore.backends), the version of its distribution and, for one "
        "that cannot be loaded, why.",
        epilog=_EPILOG,
    )
    p.add_argument("--json", action="store_true", help="print one JSON array")
    add_common_flags(p)
    p.set_defaults(func=run_backends)
    return p


@guarded("backends")
def run_backends(args: argparse.Namespace) -> int:
    """Run ``ptestore backends`` with parsed arguments; returns the exit status."""
    from ..backends import installed_backends

    found = installed_backends()
    code = EXIT_FAILURE if any(b.error is not None for b in found) else EXIT_OK
    if args.json:
        fields = ("name", "serves", "spec", "origin", "version", "error")
        out_json([{f: getattr(b, f) for f in fields} for b in found])
        return code
    rows = [[b.name, b.serves, b.spec, b.origin, b.version or "-", b.error or "ok"] for b in found]
    heads = ["name", "serves", "spec", "origin", "version", "status"]
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    # the listing whole, then the status: its reader gone (| head), still 1 for a broken one
    out(
        "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [heads, ["-" * w for w in widths], *rows]
        )
    )
    return code
