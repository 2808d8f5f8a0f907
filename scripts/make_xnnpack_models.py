"""Export the XNNPACK programs of the packed-weight tests and benchmark (real exporter).

    python scripts/make_xnnpack_models.py linear OUT.pte --layers 64 --dim 2048
    python scripts/make_xnnpack_models.py linear OUT.pte --layers 16 --dim 4096 --int8
    python scripts/make_xnnpack_models.py conv-prelu OUT.pte

``linear``: a stack of Linear(dim, dim) layers with bias, fully delegated to XNNPACK
(fp32, or int8 dynamic-quant with per-channel weights); 64 x 2048 is the 1 GiB fp32
program, 16 x 4096 int8 the 256 MiB one. ``conv-prelu``: Conv2d-PReLU-Conv2d, the graph
whose load crashes ExecuTorch 1.4.1 whenever the packed-weight cache is on.
``--ptd`` puts every weight in a .ptd beside the .pte (OUT with the suffix .ptd), or
writes nothing when the export would not. Needs torch and executorch.
Weights come from a fixed seed, so one command always writes the same bytes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["export_conv_prelu", "export_linear_stack"]


def _held(module: Any) -> Any:
    """``module`` as the attribute ``model`` of a plain module. torch.export keeps the
    delegate-constant tag of a weight with a dotted name (``model.0.weight``) but drops
    it from a top-level one whose name is a number (an ``nn.Sequential``'s
    ``0.weight``): those weights stayed in the .pte and no .ptd was written."""
    from torch import nn

    class Held(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.model = inner

        def forward(self, *args: Any) -> Any:
            return self.model(*args)

    held = Held(module)
    held.training = False  # the holder's own flag: a quantized inner refuses .eval()
    return held


def _external(module: Any, inputs: tuple[Any, ...], out: Path) -> Any:
    """The exported program of ``module`` with every weight tagged for the .ptd
    (``out`` names the file in the error when one is not: nothing is written then)."""
    import torch
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )

    gm = torch.export.export(module, inputs).module()
    delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda node: "weights")
    ep = torch.export.export(gm, inputs)
    signature = ep.graph_signature
    untagged = [
        name
        for name in (*signature.inputs_to_parameters, *signature.inputs_to_buffers)
        if _node(ep, name).meta.get("custom", {}).get("delegate_constant_tag") != "weights"
    ]
    if untagged:
        raise RuntimeError(
            f"{out}: not written: the weights {untagged} lost their external tag on export "
            "and would stay in the .pte (--ptd puts every weight in the .ptd)"
        )
    return ep


def _lower(module: Any, inputs: tuple[Any, ...], out: Path, ptd: bool) -> list[Path]:
    """Export, lower to XNNPACK and write ``out`` (and with ``ptd`` the weights to
    ``out`` with the suffix ``.ptd``); the files written. With ``ptd``, nothing is
    written unless every weight went to exactly one .ptd."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = _external(_held(module), inputs, out) if ptd else torch.export.export(module, inputs)
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    data = None
    if ptd:
        with tempfile.TemporaryDirectory() as d:
            prog.write_tensor_data_to_file(d)
            files = sorted(p.name for p in Path(d).glob("*.ptd"))
            if len(files) != 1:
                raise RuntimeError(
                    f"{out}: not written: the export made {len(files)} .ptd files {files}; "
                    "--ptd writes exactly one"
                )
            data = (Path(d) / files[0]).read_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        prog.write_to_file(f)
    written = [out]
    if data is not None:
        target = out.with_suffix(".ptd")
        target.write_bytes(data)
        written.append(target)
    return written


def _node(ep: Any, name: str) -> Any:
    """The placeholder ``name`` of the exported program ``ep``."""
    return next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == name)


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
