"""``ptestore select INDEX --model NAME --device NAME [--device-option K=V]... [--json]``
and ``ptestore fetch INDEX_OR_URL DEST [--model NAME --device NAME] [--base LOCAL_FILE]...
[--json]``.

Exit status: 0 an artifact (or, for ``select``, the portable source) was chosen and,
for ``fetch``, published verified; 1 a download failed or did not verify; 2 bad input
(no such model, a malformed index, missing flags).
"""

from __future__ import annotations

import argparse
from typing import Any

from .._text import for_terminal, printable
from .exits import EXIT_OK, guarded, redacted
from .options import (
    add_device_flags,
    add_storage_options,
    add_trust_origin_flag,
    device_or_name,
    storage_options,
    trusted_origins,
)
from .output import out, out_json, published
from .parser import add_common_flags

__all__ = ["add_fetch_parser", "add_select_parser", "run_fetch", "run_select"]


def _index_flags(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--model", metavar="NAME", required=required, help="the model's name")
    add_device_flags(
        p,
        required=required,
        help="the device (its options default to those the index records for the name)",
    )
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_storage_options(p)
    add_trust_origin_flag(p)
    add_common_flags(p)


def add_select_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ptestore select``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "select",
        help="pick the artifact of a model that fits a device, from a fleet index",
        description="Rate every artifact of the model in the index with the backends' "
        "check_compatibility for the device; print the best (optimal, else prefer "
        "re-specialization), or the portable source when none fits, and why.",
        epilog="examples:\n  ptestore select s3://models/fleet/ptestore-index.json "
        "--model mlp --device pixel9\n"
        "  ptestore select out/ptestore-index.json --model mlp --device pixel9 "
        "--device-option soc=sm8650 --json",
    )
    p.add_argument("index", metavar="INDEX", help="the index (path or URL)")
    _index_flags(p, required=True)
    p.set_defaults(func=run_select)
    return p


def add_fetch_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ptestore fetch``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "fetch",
        help="download the artifact selected for a device (and its .ptd), verified",
        description="Download what the index selects for --model on --device (or the "
        "artifact at URL) to DEST (a .ptd goes beside it): resumable, each 4 MiB chunk "
        "checked as it arrives against the record in the artifact's trailer (the one the "
        "index names), published atomically only when every byte checks. A DEST that "
        "already is what the index names (every chunk read and hashed) is left as it is, "
        "nothing downloaded; one that holds some of it (an earlier version) gives the "
        "chunks it holds, as --base does: only the others are downloaded.",
        epilog="examples:\n  ptestore fetch s3://models/fleet/ptestore-index.json "
        "/data/mlp.pte --model mlp --device pixel9\n"
        "  ptestore fetch s3://models/fleet/ptestore-index.json /data/mlp.new.pte "
        "--model mlp --device pixel9 --base /data/mlp.pte",
    )
    p.add_argument("source", metavar="INDEX_OR_URL", help="an index (.json) or an artifact")
    p.add_argument("dest", metavar="DEST", help="local path of the .pte")
    p.add_argument(
        "--base",
        metavar="LOCAL_FILE",
        action="append",
        help="a local file holding an earlier version of the artifact (or the portable "
        "source): the chunks it holds are taken from it (a reflink clone where the file "
        "system can, else a copy), each verified, and only the others are downloaded; "
        "its .ptd is the one beside it (repeatable: the first that holds a chunk gives it)",
    )
    p.add_argument(
        "--xnnpack-cache",
        action="store_true",
        help="also the XNNPACK packed-weight file the fleet made for this CPU and "
        "ExecuTorch build, verified, beside DEST (the [xnnpack] extra)",
    )
    _index_flags(p, required=False)
    p.set_defaults(func=run_fetch)
    return p


def _print(args: argparse.Namespace, value: dict[str, Any], text: str) -> None:
    # The URLs an index names (resolved against the index's URL, with its credentials)
    # and the index's own, shown as every URL is: credentials redacted.
    if args.json:
        out_json(redacted(value))
    else:  # a reason quotes the index and names given: what would act on a terminal escaped
        out(for_terminal(redacted(text)))


@guarded("select")
def run_select(args: argparse.Namespace) -> int:
    """Run ``ptestore select``."""
    from ..fleet.select import select

    device = device_or_name(args)
    assert device is not None  # --device is required
    choice = select(
        args.index,
        args.model,
        device,
        storage_options=storage_options(args),
        trusted_origins=trusted_origins(args),
    )
    # URLs from the index, paths given: one printable line each (ptestore._text)
    files = printable(choice.pte["url"]) + (
        f" + {printable(choice.ptd['url'])}" if choice.ptd else ""
    )
    text = f"{choice.kind}: {files}\n{choice.reason}"
    packed = choice.xnnpack
    if packed is not None:  # made for this machine's CPU
        text += "\nxnnpack: " + (
            f"{printable(packed['url'])} ({packed['size']} bytes, ExecuTorch "
            f"{(packed.get('executorch') or {}).get('version')})"
            if packed.get("url")
            else f"refused by the fleet's runtime: {packed.get('refused')}"
        )
    elif choice.xnnpack_error is not None:  # for this CPU, malformed: not reported
        text += f"\nxnnpack: not used: {choice.xnnpack_error}"
    _print(args, choice.to_dict(), text)
    return EXIT_OK


def _file_line(f: dict[str, Any]) -> str:
    chunks = f.get("verified") == "chunks"
    how = "chunk by chunk" if chunks else "whole"
    if f.get("current"):  # DEST already held it: read and hashed, left as it was
        return (
            f"{printable(f['path'])}: already {printable(f['url'])} ({f['size']} bytes "
            f"verified {how} from its own bytes; nothing downloaded, the file left as it was)"
        )
    # What "received" counts: every byte the store sent, in how many requests, the read
    # of the trailer (the file's last bytes, read first) included: with a base, received
    # and taken from it may add up to more than the file.
    moved = f"{f.get('received', 0)} received from the store"
    if "requests" in f:
        moved += f" in {f['requests']} request{'' if f['requests'] == 1 else 's'}"
    if chunks:
        moved += ", the read of its trailer included"
    if f.get("from_base"):
        moved += f"; {f['from_base']} taken from {', '.join(map(printable, f.get('bases', {})))}"
    resumed = f", resumed at {f['resumed_from']}" if f.get("resumed_from") else ""
    where = f"{printable(f['url'])} -> {printable(f['path'])}"
    return f"{where}: {f['size']} bytes verified {how} ({moved}{resumed})"


@guarded("fetch", publishes=True)
def run_fetch(args: argparse.Namespace) -> int:
    """Run ``ptestore fetch``."""
    from ..fleet.fetch import fetch

    result = fetch(
        args.source,
        args.dest,
        model=args.model,
        device=device_or_name(args),
        storage_options=storage_options(args),
        base=args.base,
        xnnpack_cache=args.xnnpack_cache,
        trusted_origins=trusted_origins(args),
    )
    # Published: an error or interrupt while saying so must not read as "nothing was
    # published" (exits.error_message says what was). A file already current was not:
    # with none published, a failure says "nothing published".
    made = [str(f["path"]) for f in result.files if not f.get("current")]
    if result.xnnpack is not None and result.xnnpack.get("path") is not None:
        made.append(str(result.xnnpack["path"]))  # delivered, installed beside the .pte
    if made:
        published(" and ".join(made))
    lines = [_file_line(f) for f in result.files]
    if result.choice is not None:
        lines.insert(0, f"{result.choice.kind}: {result.choice.reason}")
    packed = result.xnnpack
    if packed is not None and packed["path"] is not None:
        where = f"{printable(packed['url'])} -> {printable(packed['path'])}"
        line = f"{where}: {packed['size']} bytes verified"
        if packed.get("from_base"):
            line += (
                f" ({packed['received']} received from the store, {packed['from_base']} "
                "taken from earlier packed-weight files)"
            )
        lines.append(line)
        lines += [
            f"removed {printable(p)}: the earlier packed-weight file of this .pte"
            for p in packed["removed"]
        ]
    elif packed is not None:
        lines.append(f"no XNNPACK packed-weight file: {packed['reason']}")
    _print(args, result.to_dict(), "\n".join(lines))
    return EXIT_OK
