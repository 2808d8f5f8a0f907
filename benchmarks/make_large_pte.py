"""Make large real XNNPACK programs for the benchmarks.

    python benchmarks/make_large_pte.py OUT.pte [--layers 16] [--dim 4096]
    python benchmarks/make_large_pte.py OUT.pte --grow-from REAL.pte --factor 4

The first form exports ``--layers`` x Linear(dim, dim) fp32 (with ReLU between) with the
real ExecuTorch exporter: each weight is a dim*dim*4-byte named-data segment
(``--dim 2048``: 16 MiB; 64 layers: 1 GiB; 16 layers: 256 MiB). Needs the [interop]
extra; the exporter's peak memory is ~4-5x the model.

The second form synthesizes a larger program from a real export without the exporter
(whose peak memory would be ~14 GiB for 4 GiB): ptestore rewrites REAL.pte keeping the
first ``--keep`` weight-sized named values as they are and growing every later one
``--factor`` times, its original bytes first, then zeros (``allow_size_change=True``).
Metadata, keys, delegates and the XNNPACK graph stay the export's own; the XNNPACK
runtime reads the first dim*dim*4 bytes of each value, so the grown program still runs
and gives the original's outputs. ``--keep 16 --factor 5`` on the 1 GiB export (64 x 16
MiB) gives 16 x 16 MiB + 48 x 80 MiB = 4 GiB, with 16 MiB weights left to replace.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def export(out: str, layers: int, dim: int) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    modules: list[torch.nn.Module] = []
    for _ in range(layers):
        modules += [torch.nn.Linear(dim, dim), torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules).eval()
    inputs = (torch.randn(1, dim),)
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        et = program.to_executorch()
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        et.write_to_file(f)
    os.replace(tmp, out)


def grow(out: str, real: str, factor: int, keep: int) -> None:
    import numpy as np

    import ptestore
    from ptestore.backends import BackendData, BackendInterface

    class Grow(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            sizes = {k: len(named.get_data(k)) for k in named}
            big = max(sizes.values())
            weights = [k for k, size in sizes.items() if size == big]
            for key in weights[keep:]:
                size = sizes[key]
                value = np.zeros(size * factor, dtype=np.uint8)
                value[:size] = np.frombuffer(named.get_data(key), dtype=np.uint8)
                output.write_named_data(key, BackendData(value, allow_size_change=True))
                del value

    report = ptestore.specialize(real, out, backends=[Grow()], provenance=False)
    assert report.specialized, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--grow-from", metavar="REAL.pte")
    ap.add_argument("--factor", type=int, default=5)
    ap.add_argument("--keep", type=int, default=16)
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.grow_from:
        grow(args.out, args.grow_from, args.factor, args.keep)
    else:
        export(args.out, args.layers, args.dim)
    print(
        f"wrote {args.out}: {os.path.getsize(args.out)} bytes in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
