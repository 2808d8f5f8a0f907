"""Helpers shared by the sub-commands: the storage options, byte counts for people."""

from __future__ import annotations

import argparse

__all__ = [
    "add_storage_options",
    "human_bytes",
    "parse_storage_option",
    "side_storage_options",
    "storage_options",
]


def parse_storage_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, VALUE parsed as JSON when it can be
    (``anon=true`` gives True, ``endpoint_url=http://h:9000`` stays a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    import json

    parsed: object
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def add_storage_options(parser: argparse.ArgumentParser, *, sides: bool = False) -> None:
    """Add the repeatable ``--storage-option/-o KEY=VALUE`` option, and with ``sides``
    ``--src-option``/``--dst-option`` for the sources or the destinations only."""
    parser.add_argument(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        action="append",
        type=parse_storage_option,
        default=[],
        help="fsspec/s3fs storage option for remote URLs (VALUE parsed as JSON if it can be); "
        "repeatable" + ("; reaches every source and destination that accepts it" if sides else ""),
    )
    if not sides:
        return
    for side, what in (("src", "sources (SRC, SRC_PTD)"), ("dst", "destinations (DST, DST_PTD)")):
        parser.add_argument(
            f"--{side}-option",
            metavar="KEY=VALUE",
            dest=f"{side}_option",
            action="append",
            type=parse_storage_option,
            default=[],
            help=f"storage option for the {what} only, overriding -o; repeatable",
        )


def storage_options(args: argparse.Namespace) -> dict[str, object]:
    """The storage options given with ``-o``, as keyword arguments (a later one wins)."""
    pairs: list[tuple[str, object]] = getattr(args, "storage_option", None) or []
    return dict(pairs)


def side_storage_options(args: argparse.Namespace, side: str) -> dict[str, object]:
    """The options given with ``--src-option`` (``side="src"``) or ``--dst-option``."""
    pairs: list[tuple[str, object]] = getattr(args, f"{side}_option", None) or []
    return dict(pairs)


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units, as the progress bars)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
