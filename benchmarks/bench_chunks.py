"""Benchmark: peak memory of large replacements, by how a backend reads and writes them.

    python benchmarks/bench_chunks.py --dir /tmp/bench-chunks \\
        --sizes-mib 80,32,152,152,152,152,152,152 --replace 2        # 1 GiB, 10.9% replaced
    python benchmarks/bench_chunks.py --dir /tmp/bench-chunks \\
        --sizes-mib 80,80,80,80,80,1232,1232,1232 --replace 5        # 4 GiB, 9.8% replaced

The model is made by ptestore itself from the real quantized XNNPACK fixture (eight
named values): its values get the ``--sizes-mib`` sizes (written in 8 MiB pieces, so
making it needs no memory either). Each measured run is a fresh child process: it
imports ptestore, the coordinator and numpy (and what a run imports on first use:
the stamper, the digest, hashlib, ctypes), resets its peak RSS
(``/proc/self/clear_refs``; ``ru_maxrss`` would include the parent's image from before
``exec``), specializes the model to a new local file with a backend that inverts the
bits of the first ``--replace`` values, and reports its peak RSS (``VmHWM``) above that
baseline (``--provenance``: the output is stamped, its digest read first;
``--in-place``: a copy of the model is specialized in place, through its journal). The
backends (``--modes``, each run ``--runs`` times, interleaved):

- ``view-whole``: ``get_data`` (the zero-copy mapped view), one new array per value for
  the result, ``write_named_data``: the original's pages and the result are both held;
- ``view-chunks``: 8 MiB slices of the mapped view, each piece a new ``bytes``,
  ``write_named_data_chunks``: the mapped original's pages stay resident;
- ``lean-whole``: one result array for the largest value, reused for every value,
  the original read in 8 MiB pieces by ``read_into`` into one reused buffer (no
  mapping), ``write_named_data``;
- ``lean-chunks``: ``read_chunks`` in, one reused 8 MiB array out,
  ``write_named_data_chunks``: chunks both ways.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "quant_xnnpack.pte"
MIB = 1 << 20
PIECE = 8 * MIB
MODES = ("view-whole", "view-chunks", "lean-whole", "lean-chunks")

CHILD = r"""
import json, sys
import numpy as np
import ptestore
from ptestore.backends import BackendData, BackendInterface

mode, src, dst, provenance = sys.argv[1:5]
keys = sys.argv[5:]
PIECE = 8 << 20


class Invert(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context, output):
        named = context.get_named_data_map()
        if mode == "view-whole":
            for key in keys:
                original = np.frombuffer(named.get_data(key), dtype=np.uint8)
                output.write_named_data(key, BackendData(np.invert(original)))
                del original
        elif mode == "view-chunks":
            for key in keys:
                view = memoryview(named.get_data(key))
                def pieces(view=view):
                    for start in range(0, view.nbytes, PIECE):
                        part = np.frombuffer(view[start:start + PIECE], dtype=np.uint8)
                        yield np.invert(part).tobytes()
                output.write_named_data_chunks(key, view.nbytes, pieces())
                del view
        elif mode == "lean-whole":
            sizes = {key: named.get_data_size(key) for key in keys}
            result = np.empty(max(sizes.values()), dtype=np.uint8)  # one array, reused
            piece = np.empty(PIECE, dtype=np.uint8)  # one read buffer, reused
            for key in keys:
                out = result[:sizes[key]]
                for at in range(0, out.size, PIECE):
                    n = named.read_into(key, piece, at)
                    np.invert(piece[:n], out=out[at:at + n])
                output.write_named_data(key, BackendData(out))  # spooled: reusable after
        elif mode == "lean-chunks":
            buf = np.empty(PIECE, dtype=np.uint8)  # one piece out, reused
            for key in keys:
                def pieces(key=key):
                    for piece in named.read_chunks(key, PIECE):
                        part = np.frombuffer(piece, dtype=np.uint8)
                        yield np.invert(part, out=buf[:part.size])
                output.write_named_data_chunks(key, named.get_data_size(key), pieces())
        else:
            raise SystemExit(f"unknown mode {mode}")


# What the run needs, imported before the baseline (a run imports most of it lazily: the
# stamper and the digest when stamping, hashlib for a replacement, ctypes and the C library
# for the writeback of a large copy).
import hashlib
import ptestore._libc
import ptestore.coordinator
import ptestore.coordinator.digest
import ptestore.provenance.stamp

ptestore._libc._lib()


def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])


with open("/proc/self/clear_refs", "w") as f:  # peak RSS := current RSS
    f.write("5")
base = hwm()
if dst == src:  # --in-place: the replacements go to a journal beside the file
    ptestore.specialize(src, src, backends=[Invert()], in_place=True, provenance=provenance == "1")
else:
    ptestore.specialize(src, dst, backends=[Invert()], provenance=provenance == "1")
peak = hwm()
print(json.dumps({"mode": mode, "baseline_kib": base, "peak_kib": peak,
                  "above_mib": round((peak - base) / 1024, 1)}))
"""


def make_model(path: Path, sizes: list[int]) -> list[str]:
    """The fixture with its named values resized to ``sizes`` (bytes), written in pieces."""
    import ptestore
    from ptestore.backends import BackendInterface

    keys: list[str] = []

    class Inflate(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            keys.extend(context.get_named_data_map())
            if len(keys) < len(sizes):
                raise SystemExit(f"{FIXTURE} has {len(keys)} values, {len(sizes)} sizes given")
            pattern = bytes(range(256)) * (PIECE // 256)

            def pieces(n: int) -> Iterator[bytes]:
                for start in range(0, n, PIECE):
                    yield pattern[: min(PIECE, n - start)]

            for key, n in zip(keys, sizes, strict=False):
                output.write_named_data_chunks(key, n, pieces(n), allow_size_change=True)

    tmp = path.with_suffix(".tmp")
    ptestore.specialize(FIXTURE, tmp, backends=[Inflate()], provenance=False)
    os.replace(tmp, path)
    return keys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--sizes-mib", default="80,32,152,152,152,152,152,152")
    ap.add_argument("--replace", type=int, default=2, help="the first N values are replaced")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--provenance", action="store_true", help="stamp a provenance trailer")
    ap.add_argument("--in-place", action="store_true", help="specialize a copy in place")
    args = ap.parse_args()
    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    model = args.dir / f"model-{'-'.join(args.sizes_mib.split(','))}.pte"
    keys = make_model(model, sizes) if not model.exists() else None
    if keys is None:
        from ptestore.testing import open_named_data

        with open_named_data(model) as named:
            keys = named.keys()
    replaced = keys[: args.replace]
    total = model.stat().st_size
    share = sum(sizes[: args.replace]) / total
    print(
        json.dumps(
            {
                "model_bytes": total,
                "replaced_mib": [s // MIB for s in sizes[: args.replace]],
                "replaced_share": round(share, 3),
                "load_average": os.getloadavg(),
            }
        )
    )
    modes = args.modes.split(",")
    results: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            src, dst = model, args.dir / "out.pte"
            if args.in_place:
                src = dst
                shutil.copyfile(model, src)  # in the parent: not counted
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    mode,
                    str(src),
                    str(dst),
                    "1" if args.provenance else "0",
                    *replaced,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            print(out.strip())
            results[mode].append(json.loads(out)["above_mib"])
    (args.dir / "out.pte").unlink(missing_ok=True)
    for mode, figures in results.items():
        print(f"{mode}: min {min(figures)} MiB, max {max(figures)} MiB above the imports")
    print(json.dumps({"load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
