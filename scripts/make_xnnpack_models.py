"""Export the XNNPACK programs of the packed-weight tests and benchmark (real exporter).

    python scripts/make_xnnpack_models.py linear OUT.pte --layers 64 --dim 2048
    python scripts/make_xnnpack_models.py linear OUT.pte --layers 16 --dim 4096 --int8
    python scripts/make_xnnpack_models.py conv-prelu OUT.pte

``linear``: a stack of Linear(dim, dim) layers with bias, fully delegated to XNNPACK
(fp32, or int8 dynamic-quant with per-channel weights); 64 x 2048 is the 1 GiB fp32
program, 16 x 4096 int8 the 256 MiB one. ``conv-prelu``: Conv2d-PReLU-Conv2d, the graph
whose load crashes ExecuTorch 1.4.1 whenever the packed-weight cache is on.
``--ptd`` puts the weights in a .ptd beside the .pte. Needs torch and executorch.
Weights come from a fixed seed, so one command always writes the same bytes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["export_conv_prelu", "export_linear_stack"]


def _lower(module: Any, inputs: tuple[Any, ...], out: Path, ptd: bool) -> list[Path]:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(module, inputs)
    if ptd:
        from executorch.exir.passes.external_constants_pass import (
            delegate_external_constants_pass_unlifted,
        )

        gm = ep.module()
        delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda node: "weights")
        ep = torch.export.export(gm, inputs)
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        prog.write_to_file(f)
    written = [out]
    if ptd:
        with tempfile.TemporaryDirectory() as d:
            prog.write_tensor_data_to_file(d)
            files = sorted(Path(d).glob("*.ptd"))
            if len(files) != 1:
                raise RuntimeError(f"expected one .ptd, got {[p.name for p in files]}")
            target = out.with_suffix(".ptd")
            target.write_bytes(files[0].read_bytes())
            written.append(target)
    return written


def export_linear_stack(
    out: str | Path,
    *,
    layers: int,
    dim: int,
    int8: bool = False,
    ptd: bool = False,
    seed: int = 0,
    scale: float = 1.0,
) -> list[Path]:
    """A stack of ``layers`` Linear(dim, dim) with bias; the files written. ``scale``
    multiplies every weight (a program with the same keys' layout and other bytes)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    module = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)]).eval()
    if scale != 1.0:
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(scale)
    inputs = (torch.randn(1, dim),)
    if int8:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        gm = torch.export.export(module, inputs).module()
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
        )
        gm = prepare_pt2e(gm, quantizer)
        gm(*inputs)
        module = convert_pt2e(gm)
    return _lower(module, inputs, Path(out), ptd)


def export_conv_prelu(out: str | Path, *, seed: int = 0) -> list[Path]:
    """Conv2d(3, 8, 3) - PReLU(8) - Conv2d(8, 8, 3) on a 1x3x16x16 input."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.Conv2d(8, 8, 3)).eval()
    return _lower(module, (torch.randn(1, 3, 16, 16),), Path(out), False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    lin = sub.add_parser("linear")
    lin.add_argument("out")
    lin.add_argument("--layers", type=int, required=True)
    lin.add_argument("--dim", type=int, required=True)
    lin.add_argument("--int8", action="store_true")
    lin.add_argument("--ptd", action="store_true")
    lin.add_argument("--seed", type=int, default=0)
    cp = sub.add_parser("conv-prelu")
    cp.add_argument("out")
    args = parser.parse_args()
    if args.kind == "linear":
        files = export_linear_stack(
            args.out,
            layers=args.layers,
            dim=args.dim,
            int8=args.int8,
            ptd=args.ptd,
            seed=args.seed,
        )
    else:
        files = export_conv_prelu(args.out)
    for f in files:
        print(f, f.stat().st_size)


if __name__ == "__main__":
    main()
