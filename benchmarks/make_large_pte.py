"""Export a large real XNNPACK .pte with the real ExecuTorch exporter (for benchmarks).

    python benchmarks/make_large_pte.py OUT.pte [--layers 16] [--dim 4096]

16 x Linear(4096, 4096) fp32 gives 16 named weight segments of 64 MiB each plus biases:
a 1.0 GiB .pte. Needs the [interop] extra (torch + executorch); peak memory ~4-5 GiB.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=4096)
    args = ap.parse_args()

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.dim, args.dim), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).eval()
    inputs = (torch.randn(1, args.dim),)
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        et = program.to_executorch()
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        et.write_to_file(f)
    os.replace(tmp, args.out)
    print(
        f"wrote {args.out}: {os.path.getsize(args.out)} bytes in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
