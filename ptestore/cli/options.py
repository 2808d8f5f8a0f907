"""The flags the sub-commands share, built in one place so that each means the same
everywhere, and byte counts for people.

- ``--backend SPEC`` (repeatable, in order; :func:`add_backend_flag`): ``specialize``,
  ``ensure``, ``verify``;
- ``--device NAME`` and ``--device-option K=V`` (:func:`add_device_flags`, read back by
  :func:`device_profile` or :func:`device_or_name`): ``specialize``, ``ensure``,
  ``verify``, ``select``, ``fetch``;
- ``--ptd`` (:func:`add_ptd_flag`): one ``.ptd`` beside the ``.pte`` (``inspect``,
  ``verify``, ``ensure``), or a ``SRC_PTD DST_PTD`` pair (``specialize``, read back by
  :func:`ptd_pair`);
- ``-o/--storage-option KEY=VALUE``, and ``--src-option``/``--dst-option`` where a
  command has both sides (:func:`add_storage_options`, read back by
  :func:`storage_options` and :func:`side_storage_options`): every command that opens a
  URL;
- ``--trust-origin ORIGIN`` (repeatable; :func:`add_trust_origin_flag`, read back by
  :func:`trusted_origins`): ``select``, ``fetch``, ``ensure``, the commands that open
  what an index names.

A command's help may say what a flag is for there (``verify``'s backends are those the
file should have been made with); its syntax, its default and how its value is read are
the builder's.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile

__all__ = [
    "add_backend_flag",
    "add_device_flags",
    "add_ptd_flag",
    "add_storage_options",
    "add_trust_origin_flag",
    "device_or_name",
    "device_profile",
    "human_bytes",
    "parse_storage_option",
    "ptd_pair",
    "side_storage_options",
    "storage_options",
    "trusted_origins",
]

#: The help of ``--backend`` unless a command says what its backends are for.
BACKEND_HELP = (
    "backend implementation: a registered name, package.module:attr, optionally "
    "REF@BACKEND_ID and =ARGUMENT (repeatable; default: every registered backend "
    "whose name is a backend id in the program; see `ptestore backends`)"
)
#: The help of ``--device-option``.
DEVICE_OPTION_HELP = (
    "an option of the device profile (VALUE parsed as JSON if it can be); repeatable"
)


def add_backend_flag(parser: argparse.ArgumentParser, *, help: str = BACKEND_HELP) -> None:
    """Add ``--backend SPEC``: repeatable, kept in order in ``args.backend`` (None when
    not given: the command's default backends). SPEC is
    ``REF[@BACKEND_ID][=ARGUMENT]`` (:func:`ptestore.backends.load_backend` reads each)."""
    parser.add_argument("--backend", metavar="SPEC", action="append", default=None, help=help)


def add_device_flags(
    parser: argparse.ArgumentParser,
    *,
    help: str,
    option_help: str = DEVICE_OPTION_HELP,
    required: bool = False,
) -> None:
    """Add ``--device NAME`` (``args.device``, None when not given) and the repeatable
    ``--device-option K=V`` (``args.device_option``, the texts as given:
    :func:`device_profile` parses them, so a malformed one is the same error, exit 2,
    in every command)."""
    parser.add_argument("--device", metavar="NAME", required=required, help=help)
    parser.add_argument(
        "--device-option", metavar="K=V", action="append", default=[], help=option_help
    )


def device_profile(args: argparse.Namespace) -> DeviceProfile | None:
    """The device of ``--device`` and ``--device-option``: a ``DeviceProfile`` of the
    name and the options, None without ``--device``.

    Raises :class:`~ptestore.errors.ConfigurationError` for ``--device-option``
    without ``--device`` and for an option that is not ``KEY=VALUE``."""
    pairs: list[str] = getattr(args, "device_option", None) or []
    name: str | None = getattr(args, "device", None)
    from ..backends.compat import DeviceProfile, parse_device_options

    options = parse_device_options(pairs)
    if name is None:
        if options:
            from ..errors import ConfigurationError

            raise ConfigurationError("--device-option needs --device NAME")
        return None
    return DeviceProfile(name, options)


def device_or_name(args: argparse.Namespace) -> DeviceProfile | str | None:
    """As :func:`device_profile`, but a name given without ``--device-option`` stays a
    ``str``, so that the callee takes the options it has recorded for that name (an
    index, a job, a provenance record)."""
    if not getattr(args, "device_option", None):
        name: str | None = getattr(args, "device", None)
        return name
    return device_profile(args)


def add_ptd_flag(parser: argparse.ArgumentParser, *, help: str, pair: bool = False) -> None:
    """Add ``--ptd``: ``--ptd PTD`` (``args.ptd``, one path or URL, None when not given),
    or with ``pair`` ``--ptd SRC_PTD DST_PTD`` (read it with :func:`ptd_pair`)."""
    if pair:
        parser.add_argument("--ptd", nargs=2, metavar=("SRC_PTD", "DST_PTD"), help=help)
    else:
        parser.add_argument("--ptd", metavar="PTD", help=help)


def ptd_pair(args: argparse.Namespace) -> tuple[str, str] | None:
    """The ``(SRC_PTD, DST_PTD)`` of ``--ptd SRC_PTD DST_PTD``, or None."""
    given: list[str] | None = getattr(args, "ptd", None)
    return (given[0], given[1]) if given else None


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


def add_trust_origin_flag(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--trust-origin ORIGIN`` (``args.trust_origin``, the texts as
    given: the library checks each, a malformed one a ConfigurationError, exit 2)."""
    parser.add_argument(
        "--trust-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="an origin (https://HOST[:PORT]) whose files an index read over http(s) may "
        "name besides its own server's; the storage options (headers) are sent to it too "
        "(repeatable)",
    )


def trusted_origins(args: argparse.Namespace) -> list[str] | None:
    """The origins given with ``--trust-origin`` (None: none)."""
    given: list[str] = getattr(args, "trust_origin", None) or []
    return given or None


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units, as the progress bars)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
