"""``python -m ptestore.xnnpack build|make|verify``: the native piece and packed-weight files.

- ``build [--force]``: build the native piece now (else it is built on first use);
- ``fingerprint``: print this machine's CPU fingerprint (what a fleet job's device
  declares as ``xnnpack_cpu``);
- ``make PTE [--ptd PTD] --dir DIR``: make (or find) the file, print its record as JSON;
- ``verify FILE --pte PTE [--ptd PTD]``: check a file; exit 1 with the reason if it fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import PteStoreError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptestore.xnnpack")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the native piece for the installed executorch")
    b.add_argument("--force", action="store_true", help="build even when cached")
    sub.add_parser("fingerprint", help="print this machine's CPU fingerprint")
    m = sub.add_parser("make", help="make or find the packed-weight file of an artifact")
    m.add_argument("pte")
    m.add_argument("--ptd")
    m.add_argument("--dir", required=True)
    v = sub.add_parser("verify", help="check a packed-weight file against an artifact")
    v.add_argument("file")
    v.add_argument("--pte", required=True)
    v.add_argument("--ptd")
    args = parser.parse_args(argv)
    try:
        if args.command == "fingerprint":
            from .identity import cpu_fingerprint

            print(cpu_fingerprint())
        elif args.command == "build":
            from .native import build_shim

            shim = build_shim(force=args.force)
            print(shim.path)
        elif args.command == "make":
            from .cache import make_cache

            made = make_cache(args.pte, ptd=args.ptd, directory=args.dir)
            print(json.dumps(made.to_json(), indent=1))
        else:
            from .cache import verify_cache

            ok = verify_cache(args.file, pte=args.pte, ptd=args.ptd)
            print(json.dumps(ok.to_json(), indent=1))
    except PteStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
