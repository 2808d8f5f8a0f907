"""``ptestore ensure SRC --cache-dir DIR [--backend SPEC]... [--device NAME
[--device-option K=V]...] [--ptd PTD] [--max-bytes N] [--in-place [--portable PTE]]
[--no-provenance] [--lock-timeout S] [--progress|--no-progress] [--json]``
and ``ptestore ensure INDEX --cache-dir DIR --model NAME --device NAME
[--device-option K=V]... [--portable PTE] [-o K=V]...``: the specialized model for SRC,
made once and cached, or the artifact a fleet's job index selects for the device,
downloaded once (see docs/device.md); prints its path."""

from __future__ import annotations

import argparse
import re
from typing import Any

from .._text import printable
from ..errors import ConfigurationError
from .exits import EXIT_OK, guarded, redacted
from .options import (
    add_backend_flag,
    add_device_flags,
    add_ptd_flag,
    add_storage_options,
    add_trust_origin_flag,
    device_or_name,
    device_profile,
    storage_options,
    trusted_origins,
)
from .output import out, out_json, published, say
from .parser import add_common_flags

__all__ = ["add_ensure_parser", "parse_size", "run_ensure"]

_EPILOG = """\
examples:
  ptestore ensure model.pte --cache-dir ~/.cache/models --backend my-npu
  ptestore ensure model.pte --cache-dir cache --device phone --device-option soc=sm8650
  ptestore ensure model.pte --cache-dir cache --ptd model.ptd --max-bytes 2G --json
  ptestore ensure model.pte --cache-dir cache --in-place
  ptestore ensure model.pte --cache-dir cache --in-place --portable original/model.pte
  ptestore ensure s3://models/fleet/ptestore-index.json --cache-dir cache \
      --model mlp --device pixel9 --device-option soc=sm8650
  ptestore ensure s3://models/fleet/ptestore-index.json --cache-dir cache \
      --model mlp --device pixel9 --portable app/assets/mlp.pte

Prints the path of the specialized .pte (a second line with the .ptd when there is one).

Exit status: 0 success (made now or found in the cache); 1 backend or storage failure,
a full disk included (the cache and the source are left as they were); 2 bad input."""

_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"4096"``, ``"512K"``, ``"2G"``, ``"1GiB"`` -> bytes (binary units)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 1048576, 512K, 64M or 2G, got {text!r}"
        )
    return int(m[1]) * _SCALE[m[2].lower()]


def add_ensure_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ensure`` sub-command."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "ensure",
        help="the specialized model for this device, made once and cached",
        description="Return the specialized model for SRC from the cache in DIR, "
        "specializing it first if the cache has no current entry (the source, a backend "
        "version or the device changed). Any number of processes may run this at once: "
        "one specializes, the others wait and get its result.",
        epilog=_EPILOG,
    )
    p.add_argument(
        "src",
        metavar="SRC",
        help="source .pte (path or URL), or with --model a fleet job's index (.json)",
    )
    p.add_argument("--cache-dir", metavar="DIR", required=True, help="the cache directory")
    add_backend_flag(p, help="backend implementation (repeatable; as for `ptestore specialize`)")
    add_device_flags(p, help="the device profile to specialize for")
    p.add_argument(
        "--model",
        metavar="NAME",
        help="SRC is a job index: the model's name in it (needs --device); the artifact "
        "selected for the device is fetched, verified, and cached while the index names it",
    )
    add_ptd_flag(p, help="the model's external weights (.ptd)")
    p.add_argument(
        "--max-bytes",
        metavar="N",
        type=parse_size,
        help="evict least-recently-used entries until the cache holds at most N bytes",
    )
    p.add_argument(
        "--in-place",
        action="store_true",
        help="rewrite SRC itself (crash-safe, about 1x disk) instead of caching a copy",
    )
    p.add_argument(
        "--portable",
        metavar="PTE",
        help="with --in-place: the portable source (the original .pte) to specialize into "
        "SRC when SRC is already a specialized output that is not current (a backend "
        "upgraded, a cleared cache); without it such a SRC is refused, never specialized "
        "twice. With --model (an index): a local copy of the portable source whose "
        "chunks the download takes instead of fetching them (each verified)",
    )
    p.add_argument(
        "--no-provenance",
        dest="provenance",
        action="store_false",
        default=True,
        help="write no provenance trailer (the artifact then cannot be told current or "
        "stale; such an entry has a cache key of its own)",
    )
    p.add_argument(
        "--lock-timeout",
        metavar="SECONDS",
        type=_seconds,
        default=None,
        help="wait at most SECONDS for the entry's lock while another process makes or "
        "uses it, then fail naming the lock file and its holder's pid (default: wait)",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show the specialization's progress on stderr (default: only on a terminal)",
    )
    shown.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never show progress"
    )
    p.add_argument(
        "--xnnpack-cache",
        action="store_true",
        help="also make (once) XNNPACK's packed-weight file beside the entry and print its "
        "path (the [xnnpack] extra; refused by the runtime: the model is still served)",
    )
    p.add_argument(
        "--xnnpack-retry",
        action="store_true",
        help="with --xnnpack-cache: make the packed-weight file again although the runtime "
        "refused one before (here, or the fleet's)",
    )
    p.add_argument(
        "--xnnpack-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="with --xnnpack-cache: seconds each run of the runtime may take while the "
        "packed-weight file is made (default: 3600); one that takes longer is stopped and "
        "not remembered as a refusal",
    )
    p.add_argument("--json", action="store_true", help="print the artifact (or error) as JSON")
    add_storage_options(p)
    add_trust_origin_flag(p)
    add_common_flags(p)
    p.set_defaults(func=run_ensure)
    return p


def _seconds(text: str) -> float:
    """``--lock-timeout``: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    """``--xnnpack-timeout``: a number of seconds > 0."""
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


#: The flags of ``--xnnpack-cache``'s file, by their attribute.
_PACKED_FLAGS = {"--xnnpack-retry": "xnnpack_retry", "--xnnpack-timeout": "xnnpack_timeout"}


@guarded("ensure", publishes=True)
def run_ensure(args: argparse.Namespace) -> int:
    """Run ``ptestore ensure``; returns the exit status."""
    from ..device import ensure
    from .progress import Progress, progress_wanted

    packed = [f for f, given in _PACKED_FLAGS.items() if getattr(args, given) not in (None, False)]
    if packed and not args.xnnpack_cache:  # never ignored: refused, as cache refuses its own
        raise ConfigurationError(
            f"{' and '.join(packed)} appl{'y' if len(packed) > 1 else 'ies'} to the XNNPACK "
            "packed-weight file --xnnpack-cache makes: add --xnnpack-cache"
        )

    show = args.progress or (args.progress is None and progress_wanted(disabled=args.json))
    progress = Progress() if show else None
    try:
        # From an index, a name alone takes the options the index records for it, as
        # select does; for a model file, the profile of the name and options given.
        device = device_or_name(args) if args.model is not None else device_profile(args)
        artifact = _ensure(args, ensure, device, progress)
    finally:
        if progress is not None:
            progress.close()
    # What this call published (an entry made, a packed-weight file made or delivered):
    # an error or interrupt while saying so must not read as "nothing was published"
    # (exits.error_message says what was). A hit published nothing: said so then.
    made = [p for p in (artifact.ptd, artifact.pte) if p is not None and artifact.created]
    if artifact.xnnpack_from in ("made", "index"):
        made.append(artifact.xnnpack_cache)
    if made:
        published(" and ".join(made))
    if args.json:
        out_json(redacted(artifact.to_dict()))  # an index's URLs: credentials redacted
    else:
        # One path a line, escaped as `cache ls` escapes it (ptestore._text.printable): a
        # line break in a name is \n, a backslash \\, so no name forges a line.
        out(printable(artifact.pte))
        if artifact.ptd is not None:
            out(printable(artifact.ptd))
        if artifact.xnnpack_cache is not None:
            out(printable(artifact.xnnpack_cache))
        elif artifact.xnnpack_refused is not None:  # the index's words: one printable line
            refused = printable(artifact.xnnpack_refused)
            say(f"no XNNPACK packed-weight file: {refused}")
    return EXIT_OK


def _ensure(args: argparse.Namespace, ensure: Any, device: Any, progress: Any = None) -> Any:
    return ensure(
        args.src,
        cache_dir=args.cache_dir,
        backends=args.backend,
        device=device,
        ptd=args.ptd,
        max_bytes=args.max_bytes,
        in_place=args.in_place,
        provenance=args.provenance,
        model=args.model,
        storage_options=storage_options(args) or None,
        portable=args.portable,
        lock_timeout=args.lock_timeout,
        progress=progress,
        trusted_origins=trusted_origins(args),
        **({"xnnpack_cache": True} if args.xnnpack_cache else {}),
        **({"xnnpack_retry": True} if args.xnnpack_retry else {}),
        **({} if args.xnnpack_timeout is None else {"xnnpack_timeout": args.xnnpack_timeout}),
    )
