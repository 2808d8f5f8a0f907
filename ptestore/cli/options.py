"""Helpers shared by the sub-commands: the storage options, byte counts for people."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_storage_options", "human_bytes", "parse_storage_option", "storage_options"]


def parse_storage_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, VALUE parsed as JSON when it can be
    (``anon=true`` gives True, ``endpoint_url=http://h:9000`` stays a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parsed: object
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--storage-option/-o KEY=VALUE`` option."""
    parser.add_argument(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        action="append",
        type=parse_storage_option,
        default=[],
        help="fsspec/s3fs storage option for remote URLs (VALUE parsed as JSON if it can be); "
        "repeatable",
    )


def storage_options(args: argparse.Namespace) -> dict[str, object]:
    """The storage options given with ``-o``, as keyword arguments (a later one wins)."""
    pairs: list[tuple[str, object]] = getattr(args, "storage_option", None) or []
    return dict(pairs)


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
