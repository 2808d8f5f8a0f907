#!/usr/bin/env python
"""Export small seeded models with the real ExecuTorch exporter into ``tests/fixtures/``.

Run with the interop environment (torch 2.13.0+cpu, executorch 1.4.1)::

    python scripts/make_fixtures.py                 # (re)writes tests/fixtures/
    python scripts/make_fixtures.py --out DIR       # somewhere else
    python scripts/make_fixtures.py --large DIR     # a bigger model for manual/benchmark checks
                                                    # (not committed)

Deterministic: every model is built after ``torch.manual_seed``, inputs come from seeded
generators, and the JSON is written with sorted keys, so rerunning gives byte-identical files.

For every fixture this writes ``<name>.pte`` (+ ``<name>.ptd``) and ``<name>.json`` with:
methods, example inputs, eager outputs, the ExecuTorch runtime's outputs for the original files
(run in a child process through ``tests/support/et_runtime.py``), the facts ExecuTorch's own
reader sees (``tests/support/et_reference.py``), which DataSegment fields are physically absent,
and, where a float32 weight is identifiable, a "doubled weight" expectation whose runtime side
is checked here on a byte-patched copy.  ``manifest.json`` lists all fixtures.

Every claimed feature is checked against the reference reader before anything is written.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402
from support.et_reference import (  # noqa: E402
    reference_facts,
    reference_program_extras,
    reference_segment_field_presence,
)
from support.et_runtime import Job, run_programs  # noqa: E402
from torch import nn  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "fixtures"
MAX_FIXTURE_BYTES = 1 << 20


# --------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.relu(self.fc1(x)))
        return out


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        out: torch.Tensor = self.fc(y.mean(dim=(2, 3)))
        return out


class EmbedLinear(nn.Module):
    """Two embeddings (not taken by XNNPACK -> portable, constant segment) feeding a Linear
    (XNNPACK, named data)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb1 = nn.Embedding(7, 5)  # 140 B: padding differs between 16 and 64 alignment
        self.emb2 = nn.Embedding(7, 5)
        self.fc = nn.Linear(5, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.emb1(idx) + self.emb2(idx))
        return out


class TiedMLP(nn.Module):
    """a.weight and b.weight hold identical bytes (deduplicated into one segment)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.relu(self.a(x)))
        return out


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)


class SharedForward(nn.Module):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.shared.lin(x)
        return out


class SharedRelu(nn.Module):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.shared.lin(x))


class Stateful(nn.Module):
    """A mutable buffer with an initial state (-> mutable data segment)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(8, dtype=torch.float32))
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        assert isinstance(state, torch.Tensor)
        state.add_(x)
        return state * self.scale


class LargeMLP(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


# --------------------------------------------------------------------------- helpers


def randn(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def encode_tensor(t: torch.Tensor | np.ndarray) -> dict[str, Any]:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.reshape(-1).tolist()}


def encode_per_method(d: dict[str, list[Any]]) -> dict[str, list[dict[str, Any]]]:
    return {m: [encode_tensor(t) for t in ts] for m, ts in d.items()}


def as_list(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out)


def eager(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Eager outputs on a deep copy (stateful modules must not see earlier calls)."""
    m = copy.deepcopy(module)
    with torch.no_grad():
        return [o.detach().clone() for o in as_list(m(*[i.clone() for i in inputs]))]


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def portable_candidates(t: torch.Tensor) -> list[tuple[str, bytes]]:
    t = t.detach().contiguous()
    out = [("contiguous", t.numpy().tobytes())]
    if t.dim() == 4:
        # storage bytes of the channels-last tensor: NHWC order (numpy's tobytes() of a
        # channels_last tensor would give the logical NCHW order instead)
        out.append(("channels_last", t.permute(0, 2, 3, 1).contiguous().numpy().tobytes()))
    return out


def get_param(module: nn.Module, name: str) -> torch.Tensor:
    return dict(module.named_parameters(remove_duplicate=False))[name]


@dataclass
class MethodSpec:
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]


@dataclass
class Export:
    pte: bytes
    ptd: bytes | None = None


@dataclass
class Spec:
    name: str
    description: str
    methods: dict[str, MethodSpec]
    build: Callable[[], Export]
    declared_features: list[str] = field(default_factory=list)
    doubled_param: str | None = None  # parameter name inside each method's module
    atol: float = 1e-5
    rtol: float = 1e-5
    checks: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)


# --------------------------------------------------------------------------- export recipes


def _lower_imports() -> tuple[Any, Any, Any, Any]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower

    return XnnpackPartitioner, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower


def _collect_ptd(manager: Any) -> bytes | None:
    with tempfile.TemporaryDirectory() as d:
        manager.write_tensor_data_to_file(d)
        files = sorted(Path(d).glob("*.ptd"))
        if not files:
            return None
        if len(files) != 1:
            raise RuntimeError(f"expected one .ptd, got {[f.name for f in files]}")
        return files[0].read_bytes()


def export_xnnpack(methods: dict[str, MethodSpec], config: Any = None) -> Export:
    XnnpackPartitioner, _, _, lower = _lower_imports()
    eps = {n: torch.export.export(s.module.eval(), s.inputs) for n, s in methods.items()}
    arg: Any = eps if len(eps) > 1 else eps["forward"]
    manager = lower(arg, partitioner=[XnnpackPartitioner()])
    prog = manager.to_executorch(config) if config is not None else manager.to_executorch()
    return Export(prog.buffer)


def export_portable(methods: dict[str, MethodSpec], config: Any = None) -> Export:
    _, _, to_edge, _ = _lower_imports()
    eps = {n: torch.export.export(s.module.eval(), s.inputs) for n, s in methods.items()}
    arg: Any = eps if len(eps) > 1 else eps["forward"]
    manager = to_edge(arg)
    prog = manager.to_executorch(config) if config is not None else manager.to_executorch()
    ptd = _collect_ptd(prog) if getattr(prog, "_tensor_data", None) else None
    return Export(prog.buffer, ptd)


def export_xnnpack_external(spec: MethodSpec) -> Export:
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )

    XnnpackPartitioner, _, _, lower = _lower_imports()
    gm = torch.export.export(spec.module.eval(), spec.inputs).module()
    delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda node: "weights")
    prog = lower(
        torch.export.export(gm, spec.inputs), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    return Export(prog.buffer, _collect_ptd(prog))


def _quantize(module: nn.Module, inputs: tuple[torch.Tensor, ...], dynamic: bool) -> nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(module.eval(), inputs).module()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    )
    gm = prepare_pt2e(gm, quantizer)
    gm(*inputs)
    converted: nn.Module = convert_pt2e(gm)
    return converted


def export_quantized_xnnpack(spec: MethodSpec, dynamic: bool = False) -> Export:
    XnnpackPartitioner, _, _, lower = _lower_imports()
    gm = _quantize(spec.module, spec.inputs, dynamic)
    spec.module = gm  # eager reference = the converted (quantize/dequantize) module
    prog = lower(torch.export.export(gm, spec.inputs), partitioner=[XnnpackPartitioner()])
    return Export(prog.to_executorch().buffer)


def export_scale_alias(spec: MethodSpec) -> Export:
    """Dynamic per-channel quantized Linear whose bias is set to its own weight scales: the
    XNNPACK key of the bias (sha256 of its bytes) and the key of the scales ("scale_" + the
    same sha256) then name identical bytes, which the NamedDataStore stores once."""
    from support.et_reference import segment_bytes

    first = export_quantized_xnnpack(MethodSpec(copy.deepcopy(spec.module), spec.inputs), True)
    facts = reference_facts(first.pte, "pte")
    scale_entries = [nd for nd in facts["named_data"] if nd["key"].startswith("scale_")]
    if len(scale_entries) != 1:
        raise RuntimeError(f"expected one scale key, got {scale_entries}")
    scales = np.frombuffer(segment_bytes(first.pte, scale_entries[0]["segment_index"]), np.float32)
    lin = spec.module
    assert isinstance(lin, nn.Linear)
    with torch.no_grad():
        lin.bias.copy_(torch.from_numpy(scales.copy()))
    return export_quantized_xnnpack(spec, True)


# --------------------------------------------------------------------------- feature checks


def _segment_keys(facts: dict[str, Any]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for nd in facts["named_data"]:
        out.setdefault(nd["segment_index"], []).append(nd["key"])
    return out


def auto_features(rec: dict[str, Any]) -> list[str]:
    """Features derived from what the reference reader sees."""
    pte = rec["facts"].get("pte")
    ptd = rec["facts"].get("ptd")
    feats: set[str] = set()
    if pte is not None:
        extras = rec["extras"]
        if pte["header"] is None:
            feats.add("no_extended_header")
        ids = {d["id"] for d in pte["delegates"]}
        feats.update(f"delegate:{i}" for i in ids)
        if not ids:
            feats.add("portable_only")
        if len(pte["methods"]) > 1:
            feats.add("multi_method")
        per_method: dict[str, int] = {}
        for d in pte["delegates"]:
            per_method[d["method"]] = per_method.get(d["method"], 0) + 1
        if any(v > 1 for v in per_method.values()):
            feats.add("several_delegates_in_one_method")
        seg_refs: dict[int, int] = {}
        for d in pte["delegates"]:
            if d["location"] == "segment":
                seg_refs[d["index"]] = seg_refs.get(d["index"], 0) + 1
            else:
                feats.add("inline_delegate")
        if any(v > 1 for v in seg_refs.values()):
            feats.add("shared_delegate_blob")
        cs = extras["constant_segment"]
        if cs is not None and pte["segments"]:
            size = pte["segments"][cs["segment_index"]]["size"]
            feats.add("constant_segment" if size > 0 else "empty_constant_segment")
            if size > 0 and ids:
                feats.add("partially_delegated")
        if extras["constant_buffer_count"] > 0:
            feats.add("deprecated_constant_buffer")
        if not pte["segments"]:
            feats.add("no_segments")
        if extras["mutable_data_segments"]:
            feats.add("mutable_data_segment")
        if pte["named_data"]:
            feats.add("named_data_in_pte")
        if any(len(v) > 1 for v in _segment_keys(pte).values()):
            feats.add("several_keys_one_segment")
        absent = [
            p["index"] for p in rec["segment_field_presence"]["pte"] if not p["offset_present"]
        ]
        if len(absent) > 1:
            feats.add("several_absent_segment_offsets")
        if any(
            d["location"] == "segment" and d["index"] in absent and d["index"] != 0
            for d in pte["delegates"]
        ):
            feats.add("delegate_blob_at_offset_0")
    if ptd is not None:
        feats.add("ptd")
        if ptd["named_data"]:
            feats.add("named_data_in_ptd")
        if any(nd["tensor_layout"] is not None for nd in ptd["named_data"]):
            feats.add("ptd_tensor_layouts")
        if any(len(v) > 1 for v in _segment_keys(ptd).values()):
            feats.add("several_keys_one_segment")
    if rec.get("doubled") is not None:
        feats.add("doubled_expectation")
    return sorted(feats)


# --------------------------------------------------------------------------- doubled weight


def find_doubled(
    param_name: str, methods: dict[str, MethodSpec], export: Export, rec: dict[str, Any]
) -> dict[str, Any]:
    first = next(iter(methods.values()))
    tensor = get_param(first.module, param_name)
    cands = portable_candidates(tensor)
    files: list[tuple[str, bytes]] = [("pte", export.pte)]
    if export.ptd is not None:
        files.append(("ptd", export.ptd))
    found: dict[str, Any] | None = None
    for kind, data in files:
        facts = rec["facts"][kind]
        base = facts["header"]["segment_base_offset"] if facts["header"] else 0
        keys = _segment_keys(facts)
        for seg in facts["segments"]:
            seg_bytes = data[base + seg["offset"] : base + seg["offset"] + seg["size"]]
            for layout, cb in cands:
                if seg["index"] in keys and seg_bytes == cb:
                    on_seg = keys[seg["index"]]
                    key = param_name if param_name in on_seg else None
                    if key is None and sha256_hex(cb) in on_seg:
                        key = sha256_hex(cb)
                    if key is None:
                        raise RuntimeError(f"{param_name}: segment keys {on_seg} not expected")
                    found = {
                        "file": kind,
                        "key": key,
                        "keys_on_segment": on_seg,
                        "segment_index": seg["index"],
                        "offset_in_segment": 0,
                        "nbytes": len(cb),
                        "layout": layout,
                    }
                elif kind == "pte" and rec["extras"]["constant_segment"] is not None:
                    cs = rec["extras"]["constant_segment"]
                    if cs["segment_index"] != seg["index"]:
                        continue
                    for off in cs["offsets"][1:]:
                        if seg_bytes[off : off + len(cb)] == cb:
                            found = {
                                "file": kind,
                                "key": None,
                                "keys_on_segment": keys.get(seg["index"], []),
                                "segment_index": seg["index"],
                                "offset_in_segment": off,
                                "nbytes": len(cb),
                                "layout": layout,
                            }
                if found:
                    break
            if found:
                break
        if found:
            break
    if found is None:
        raise RuntimeError(f"could not locate the bytes of {param_name}")
    if found["file"] == "pte" and found["key"] is not None and len(found["key"]) == 64:
        layout_bytes = dict(cands)[found["layout"]]
        if found["key"] != sha256_hex(layout_bytes):
            raise AssertionError(f"{param_name}: key is not the SHA-256 of the weight bytes")
    doubled_out: dict[str, list[torch.Tensor]] = {}
    for mname, ms in methods.items():
        m2 = copy.deepcopy(ms.module)
        with torch.no_grad():
            get_param(m2, param_name).mul_(2)
        doubled_out[mname] = eager(m2, ms.inputs)
    found.update({"param": param_name, "dtype": "float32", "outputs_eager": doubled_out})
    return found


def doubled_copy(export: Export, rec: dict[str, Any], d: dict[str, Any]) -> Export:
    kind = d["file"]
    data = bytearray(export.pte if kind == "pte" else export.ptd or b"")
    facts = rec["facts"][kind]
    base = facts["header"]["segment_base_offset"] if facts["header"] else 0
    start = base + facts["segments"][d["segment_index"]]["offset"] + d["offset_in_segment"]
    vals = np.frombuffer(bytes(data[start : start + d["nbytes"]]), dtype=np.float32) * 2
    data[start : start + d["nbytes"]] = vals.astype(np.float32).tobytes()
    if kind == "pte":
        return Export(bytes(data), export.ptd)
    return Export(export.pte, bytes(data))


# --------------------------------------------------------------------------- specs


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def _absent(rec: dict[str, Any], kind: str = "pte") -> list[int]:
    return [p["index"] for p in rec["segment_field_presence"][kind] if not p["offset_present"]]


def specs() -> list[Spec]:
    _, Config, _, _ = _lower_imports()
    out: list[Spec] = []

    def mlp_methods() -> dict[str, MethodSpec]:
        torch.manual_seed(0)
        return {"forward": MethodSpec(MLP().eval(), (randn(100, 2, 16),))}

    def conv_methods() -> dict[str, MethodSpec]:
        torch.manual_seed(0)
        return {"forward": MethodSpec(ConvNet().eval(), (randn(101, 1, 3, 8, 8),))}

    m = mlp_methods()
    out.append(
        Spec(
            "mlp_xnnpack",
            "MLP Linear(16,32)-ReLU-Linear(32,8), fully XNNPACK-delegated; empty constant "
            "segment 0 and the delegate blob (segment 1) both at offset 0 with absent offset "
            "fields; weights as SHA-256-keyed named data",
            m,
            lambda m=m: export_xnnpack(m),  # type: ignore[misc]
            doubled_param="fc1.weight",
            checks=[
                lambda r: _check(_absent(r)[:2] == [0, 1], "segments 0 and 1 must lack offset"),
                lambda r: _check(r["facts"]["pte"]["segments"][0]["size"] == 0, "seg 0 empty"),
            ],
        )
    )
    m = conv_methods()
    out.append(
        Spec(
            "conv_xnnpack",
            "Conv2d(3,8,3)-ReLU-Conv2d(8,16,3)-ReLU-mean-Linear(16,4) on XNNPACK: the mean "
            "splits the graph into two delegates (two blob segments); conv weights keyed by the "
            "SHA-256 of their channels-last bytes",
            m,
            lambda m=m: export_xnnpack(m),  # type: ignore[misc]
            doubled_param="conv1.weight",
            checks=[
                lambda r: _check(len(r["facts"]["pte"]["delegates"]) == 2, "two delegates"),
            ],
        )
    )
    m = mlp_methods()
    out.append(
        Spec(
            "mlp_portable",
            "The MLP without delegation: all weights in the constant segment (segment 0, the "
            "only segment), no named data",
            m,
            lambda m=m: export_portable(m),  # type: ignore[misc]
            doubled_param="fc1.weight",
            checks=[lambda r: _check(len(r["facts"]["pte"]["segments"]) == 1, "one segment")],
        )
    )
    m = conv_methods()
    out.append(
        Spec(
            "conv_portable",
            "The conv model without delegation (constant segment only)",
            m,
            lambda m=m: export_portable(m),  # type: ignore[misc]
            doubled_param="conv2.weight",
        )
    )

    def embed_methods() -> dict[str, MethodSpec]:
        torch.manual_seed(0)
        idx = torch.tensor([[1, 3, 5, 6], [0, 2, 4, 6]], dtype=torch.long)
        return {"forward": MethodSpec(EmbedLinear().eval(), (idx,))}

    m = embed_methods()
    out.append(
        Spec(
            "partial_xnnpack",
            "Partially delegated: two Embeddings stay portable (non-empty constant segment 0), "
            "add + Linear go to one XNNPACK delegate (blob segment + named data)",
            m,
            lambda m=m: export_xnnpack(m),  # type: ignore[misc]
            doubled_param="fc.weight",
            checks=[lambda r: _check("partially_delegated" in auto_features(r), "partial")],
        )
    )
    m = mlp_methods()
    out.append(
        Spec(
            "mlp_xnnpack_ext",
            "The XNNPACK MLP with external weights (delegate_external_constants_pass_unlifted, "
            "tag 'weights'): SHA-256-keyed blobs in the .ptd (no tensor layouts), the .pte "
            "keeps the empty constant segment and the blob",
            m,
            lambda m=m: export_xnnpack_external(m["forward"]),  # type: ignore[misc]
            doubled_param="fc1.weight",
            checks=[lambda r: _check(r["facts"]["ptd"]["named_data"] != [], "ptd named data")],
        )
    )
    m = mlp_methods()
    out.append(
        Spec(
            "mlp_portable_ext",
            "The portable MLP with external constants (ExecutorchBackendConfig("
            "external_constants=True)): FQN keys with tensor layouts in the .ptd; the .pte has "
            "no extended header but lists one empty segment",
            m,
            lambda m=m: export_portable(m, Config(external_constants=True)),  # type: ignore[misc]
            doubled_param="fc1.weight",
            checks=[lambda r: _check(r["facts"]["pte"]["header"] is None, "no pte header")],
        )
    )
    m = mlp_methods()
    out.append(
        Spec(
            "mlp_xnnpack_align4096",
            "The XNNPACK MLP exported with segment_alignment=4096 (like pre-2024-08 files)",
            m,
            lambda m=m: export_xnnpack(m, Config(segment_alignment=4096)),  # type: ignore[misc]
            declared_features=["segment_alignment_4096"],
            doubled_param="fc2.weight",
            checks=[
                lambda r: _check(
                    all(s["offset"] % 4096 == 0 for s in r["facts"]["pte"]["segments"])
                    and r["facts"]["pte"]["header"]["segment_base_offset"] % 4096 == 0,
                    "4096-aligned",
                )
            ],
        )
    )
    m = embed_methods()
    out.append(
        Spec(
            "partial_xnnpack_align_hi",
            "The partially delegated model with constant_tensor_alignment=64 and "
            "delegate_alignment=256: the extended header is padded to 256 bytes on disk (its "
            "length field still says 32) and constant tensors are 64-aligned in segment 0",
            m,
            lambda m=m: export_xnnpack(  # type: ignore[misc]
                m, Config(constant_tensor_alignment=64, delegate_alignment=256)
            ),
            declared_features=[
                "raised_constant_tensor_alignment",
                "raised_delegate_alignment",
                "padded_extended_header",
            ],
            doubled_param="emb2.weight",
            checks=[
                # partial_xnnpack (same model, default alignments) has root offset 60 = 28 + 32
                lambda r: _check(r["extras"]["root_offset"] == 28 + 256, "header padded to 256"),
                lambda r: _check(
                    all(o % 64 == 0 for o in r["extras"]["constant_segment"]["offsets"]),
                    "64-aligned constants",
                ),
            ],
        )
    )

    torch.manual_seed(0)
    shared = Shared()
    x = randn(102, 2, 16)
    m = {
        "forward": MethodSpec(SharedForward(shared).eval(), (x,)),
        "forward_relu": MethodSpec(SharedRelu(shared).eval(), (x,)),
    }
    out.append(
        Spec(
            "two_methods_xnnpack",
            "Two methods (forward, forward_relu) over the same Linear, lowered to XNNPACK: two "
            "different delegate blobs, one set of named weights shared by both",
            m,
            lambda m=m: export_xnnpack(m),  # type: ignore[misc]
            declared_features=["named_data_shared_across_methods"],
            doubled_param="shared.lin.weight",
            checks=[
                lambda r: _check(len(r["facts"]["pte"]["named_data"]) == 2, "2 shared keys"),
                lambda r: _check(
                    len({d["index"] for d in r["facts"]["pte"]["delegates"]}) == 2, "2 blobs"
                ),
            ],
        )
    )

    torch.manual_seed(0)
    shared2 = Shared()
    x = randn(103, 2, 16)
    m = {
        "forward": MethodSpec(SharedForward(shared2).eval(), (x,)),
        "forward_copy": MethodSpec(SharedForward(shared2).eval(), (randn(104, 2, 16),)),
    }
    out.append(
        Spec(
            "shared_blob_xnnpack",
            "Two methods with identical graphs over the same Linear: their byte-identical "
            "XNNPACK blobs are deduplicated, so both delegates reference one segment",
            m,
            lambda m=m: export_xnnpack(m),  # type: ignore[misc]
            doubled_param="shared.lin.weight",
            checks=[lambda r: _check("shared_delegate_blob" in auto_features(r), "shared blob")],
        )
    )

    def tied_methods() -> dict[str, MethodSpec]:
        torch.manual_seed(0)
        return {"forward": MethodSpec(TiedMLP().eval(), (randn(105, 2, 8),))}

    m = tied_methods()
    out.append(
        Spec(
            "tied_portable_ext",
            "Portable, external constants: a.weight and b.weight have identical bytes, so two "
            "FQN keys share one .ptd segment (segment 0, whose offset field is absent)",
            m,
            lambda m=m: export_portable(m, Config(external_constants=True)),  # type: ignore[misc]
            doubled_param="a.bias",
            checks=[
                lambda r: _check(
                    any(
                        sorted(v) == ["a.weight", "b.weight"]
                        for v in _segment_keys(r["facts"]["ptd"]).values()
                    ),
                    "a.weight and b.weight share a segment",
                )
            ],
        )
    )

    def stateful_methods() -> dict[str, MethodSpec]:
        torch.manual_seed(0)
        return {"forward": MethodSpec(Stateful(), (randn(106, 8),))}

    def export_stateful(m: dict[str, MethodSpec]) -> Export:
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

        return export_portable(m, Config(passes=[InitializedMutableBufferPass(["state"])]))

    m = stateful_methods()
    out.append(
        Spec(
            "mutable_portable",
            "Portable program with a mutable buffer that has an initial state "
            "(InitializedMutableBufferPass): constant segment 0 plus a mutable data segment 1",
            m,
            lambda m=m: export_stateful(m),  # type: ignore[misc]
            doubled_param="scale",
            checks=[lambda r: _check("mutable_data_segment" in auto_features(r), "mutable")],
        )
    )

    torch.manual_seed(0)
    m = {"forward": MethodSpec(MLP().eval(), (randn(107, 2, 16),))}
    out.append(
        Spec(
            "quant_xnnpack",
            "The MLP statically quantized (XNNPACKQuantizer, symmetric per-channel int8) and "
            "lowered to XNNPACK: int8 weights, int32 biases and per-channel 'scale_<sha256>' keys",
            m,
            lambda m=m: export_quantized_xnnpack(m["forward"]),  # type: ignore[misc]
            declared_features=["quantized", "scale_keys"],
            atol=0.05,
            rtol=0.0,
            checks=[
                lambda r: _check(
                    any(nd["key"].startswith("scale_") for nd in r["facts"]["pte"]["named_data"]),
                    "scale_ keys",
                )
            ],
        )
    )

    torch.manual_seed(0)
    m = {"forward": MethodSpec(nn.Linear(16, 32).eval(), (randn(108, 2, 16),))}
    out.append(
        Spec(
            "scale_alias_xnnpack",
            "Dynamically quantized (per-channel int8 weights) Linear lowered to XNNPACK, its "
            "fp32 bias set to its own weight scales: keys '<sha>' (bias) and 'scale_<sha>' "
            "(scales) name identical bytes and share one .pte segment",
            m,
            lambda m=m: export_scale_alias(m["forward"]),  # type: ignore[misc]
            declared_features=["quantized", "scale_keys"],
            atol=0.05,
            rtol=0.0,
            checks=[
                lambda r: _check(
                    "several_keys_one_segment" in auto_features(r), "two keys on one segment"
                )
            ],
        )
    )
    return out


# --------------------------------------------------------------------------- driver


def build_all(out_dir: Path, only: set[str] | None = None) -> None:
    all_specs = [s for s in specs() if only is None or s.name in only]
    records: list[tuple[Spec, Export, dict[str, Any]]] = []
    jobs: list[Job] = []
    job_owner: list[tuple[int, str, str]] = []  # (record index, method, "orig" | "doubled")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in all_specs:
            print(f"exporting {spec.name}", file=sys.stderr, flush=True)
            export = spec.build()
            rec: dict[str, Any] = {"facts": {}, "segment_field_presence": {}}
            rec["facts"]["pte"] = reference_facts(export.pte, "pte")
            rec["segment_field_presence"]["pte"] = reference_segment_field_presence(
                export.pte, "pte"
            )
            rec["extras"] = reference_program_extras(export.pte)
            if export.ptd is not None:
                rec["facts"]["ptd"] = reference_facts(export.ptd, "ptd")
                rec["segment_field_presence"]["ptd"] = reference_segment_field_presence(
                    export.ptd, "ptd"
                )
            rec["outputs_eager"] = {n: eager(s.module, s.inputs) for n, s in spec.methods.items()}
            rec["doubled"] = None
            if spec.doubled_param is not None:
                rec["doubled"] = find_doubled(spec.doubled_param, spec.methods, export, rec)
            for check in spec.checks:
                check(rec)
            idx = len(records)
            records.append((spec, export, rec))
            variants: list[tuple[str, Export]] = [("orig", export)]
            if rec["doubled"] is not None:
                variants.append(("doubled", doubled_copy(export, rec, rec["doubled"])))
            for tag, ex in variants:
                pte_p = Path(tmp) / f"{spec.name}.{tag}.pte"
                pte_p.write_bytes(ex.pte)
                ptd_p = None
                if ex.ptd is not None:
                    ptd_p = Path(tmp) / f"{spec.name}.{tag}.ptd"
                    ptd_p.write_bytes(ex.ptd)
                for mname, ms in spec.methods.items():
                    jobs.append(
                        Job(
                            pte_p,
                            mname,
                            [i.numpy() for i in ms.inputs],
                            ptd=ptd_p,
                            label=f"{spec.name}/{mname}/{tag}",
                        )
                    )
                    job_owner.append((idx, mname, tag))
        print(f"running {len(jobs)} runtime jobs", file=sys.stderr, flush=True)
        results = run_programs(jobs)
    runtime_out: dict[tuple[int, str, str], list[np.ndarray]] = {}
    for (idx, mname, tag), res in zip(job_owner, results, strict=True):
        if not res.ok or res.outputs is None:
            raise RuntimeError(f"runtime failed: {res.describe()}")
        runtime_out[(idx, mname, tag)] = res.outputs

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_entries: list[dict[str, Any]] = []
    for idx, (spec, export, rec) in enumerate(records):
        tol = {"atol": spec.atol, "rtol": spec.rtol}
        orig = {m: runtime_out[(idx, m, "orig")] for m in spec.methods}
        for m, outs in orig.items():
            ref = [t.numpy() for t in rec["outputs_eager"][m]]
            for a, b in zip(outs, ref, strict=True):
                np.testing.assert_allclose(
                    a, b, atol=spec.atol, rtol=spec.rtol, err_msg=f"{spec.name}/{m} vs eager"
                )
        if rec["doubled"] is not None:
            dbl = {m: runtime_out[(idx, m, "doubled")] for m in spec.methods}
            for m, outs in dbl.items():
                ref = [t.numpy() for t in rec["doubled"]["outputs_eager"][m]]
                for a, b in zip(outs, ref, strict=True):
                    np.testing.assert_allclose(
                        a, b, atol=spec.atol, rtol=spec.rtol, err_msg=f"{spec.name}/{m} doubled"
                    )
                # doubling must change something, or the expectation proves nothing
                if all(np.array_equal(a, b) for a, b in zip(outs, orig[m], strict=True)):
                    raise AssertionError(f"{spec.name}/{m}: doubling changed nothing")
            rec["doubled"]["outputs_runtime"] = encode_per_method(dbl)
            rec["doubled"]["outputs_eager"] = encode_per_method(rec["doubled"]["outputs_eager"])
        features = sorted(set(auto_features(rec)) | set(spec.declared_features))
        pte_name = f"{spec.name}.pte"
        ptd_name = f"{spec.name}.ptd" if export.ptd is not None else None
        doc = {
            "name": spec.name,
            "description": spec.description,
            "features": features,
            "thirdparty": False,
            "pte": pte_name,
            "ptd": ptd_name,
            "methods": rec["facts"]["pte"]["methods"],
            "inputs": encode_per_method(
                {n: [t for t in s.inputs] for n, s in spec.methods.items()}
            ),
            "outputs_eager": encode_per_method(rec["outputs_eager"]),
            "outputs_runtime": encode_per_method(orig),
            "tolerance": tol,
            "facts": rec["facts"],
            "segment_field_presence": rec["segment_field_presence"],
            "extras": rec["extras"],
            "doubled": rec["doubled"],
        }
        for fname, data in [(pte_name, export.pte), (ptd_name, export.ptd)]:
            if fname is None or data is None:
                continue
            if len(data) >= MAX_FIXTURE_BYTES:
                raise RuntimeError(f"{fname} is {len(data)} bytes, too big for a fixture")
            (out_dir / fname).write_bytes(data)
        (out_dir / f"{spec.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        manifest_entries.append(
            {
                "name": spec.name,
                "description": spec.description,
                "features": features,
                "thirdparty": False,
                "json": f"{spec.name}.json",
                "pte": pte_name,
                "ptd": ptd_name,
                "pte_size": len(export.pte),
                "ptd_size": len(export.ptd) if export.ptd is not None else None,
            }
        )
    if only is None:
        manifest_entries += build_thirdparty(out_dir)
    manifest_path = out_dir / "manifest.json"
    kept: list[dict[str, Any]] = []
    if only is not None and manifest_path.exists():
        # --only: keep the entries that were not rebuilt
        names = {e["name"] for e in manifest_entries}
        existing = json.loads(manifest_path.read_text()).get("fixtures", [])
        kept = [e for e in existing if e["name"] not in names]
    manifest = {
        "generator": "scripts/make_fixtures.py",
        "versions": {"torch": torch.__version__, "executorch": version("executorch")},
        "fixtures": manifest_entries + kept,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(manifest_entries)} fixtures to {out_dir}", file=sys.stderr)


# --------------------------------------------------------------------------- third party


@dataclass
class ThirdParty:
    name: str
    file: str  # relative to the fixtures directory
    upstream: str
    description: str
    inputs: dict[str, tuple[torch.Tensor, ...]]
    runnable: bool  # False: the pip runtime refuses it; the exact error is recorded


UPSTREAM = "pytorch/executorch@cff6f4dd32e630945b7188512c1f2b4f102b05ad"

THIRDPARTY: list[ThirdParty] = [
    ThirdParty(
        "tp_et_arduino_add",
        "thirdparty/et_arduino_add.pte",
        "examples/arduino/examples/AddModel/model.pte",
        "ExecuTorch's Arduino AddModel example (portable, one 4-byte constant segment)",
        {"forward": (randn(300, 3),)},
        True,
    ),
    ThirdParty(
        "tp_et_apple_add",
        "thirdparty/et_apple_add.pte",
        "extension/apple/ExecuTorch/__tests__/resources/add.pte",
        "ExecuTorch's Apple test resource add.pte (2025-02): no extended header, one empty "
        "segment with both fields absent",
        {"forward": (randn(301, 1), randn(302, 1))},
        True,
    ),
    ThirdParty(
        "tp_et_arduino_kws_cortex_m",
        "thirdparty/et_arduino_kws_cortex_m.pte",
        "examples/arduino/examples/KeywordSpotting/model.pte",
        "ExecuTorch's Arduino int8 keyword-spotting model for Cortex-M: 39 KB constant segment "
        "with 256-aligned tensors; its cortex_m kernels are not in the pip runtime",
        {"forward": (randn(303, 1, 1, 49, 10),)},
        False,
    ),
    ThirdParty(
        "tp_et_module_linear_constant_buffer",
        "thirdparty/et_module_linear_constant_buffer.pte",
        "test/models/deprecated/ModuleLinear-no-constant-segment.pte",
        "ExecuTorch's deprecated-format test model (2024-09): weights in Program.constant_buffer, "
        "no segments, no header; the pip runtime is built without the constant_buffer path",
        {"forward": (randn(304, 3),)},
        False,
    ),
]


def build_thirdparty(out_dir: Path) -> list[dict[str, Any]]:
    jobs: list[Job] = []
    owners: list[tuple[int, str]] = []
    for i, tp in enumerate(THIRDPARTY):
        src = DEFAULT_OUT / tp.file
        dst = out_dir / tp.file
        if src.resolve() != dst.resolve():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
        for m, ins in tp.inputs.items():
            jobs.append(Job(dst, m, [t.numpy() for t in ins], label=tp.name))
            owners.append((i, m))
    results = run_programs(jobs)
    entries: list[dict[str, Any]] = []
    for i, tp in enumerate(THIRDPARTY):
        path = out_dir / tp.file
        data = path.read_bytes()
        if len(data) >= MAX_FIXTURE_BYTES:
            raise RuntimeError(f"{tp.file} is too big for a fixture")
        rec: dict[str, Any] = {
            "facts": {"pte": reference_facts(data, "pte")},
            "segment_field_presence": {"pte": reference_segment_field_presence(data, "pte")},
            "extras": reference_program_extras(data),
            "doubled": None,
        }
        outputs: dict[str, list[np.ndarray]] = {}
        errors: dict[str, str] = {}
        for (owner, m), res in zip(owners, results, strict=True):
            if owner != i:
                continue
            if res.crashed:
                raise RuntimeError(f"{tp.name}: runtime crashed: {res.describe()}")
            if res.ok and res.outputs is not None:
                outputs[m] = res.outputs
            else:
                errors[m] = res.error or ""
        if tp.runnable != (not errors):
            raise RuntimeError(f"{tp.name}: expected runnable={tp.runnable}, errors {errors}")
        features = sorted(set(auto_features(rec)) | {"thirdparty"})
        doc = {
            "name": tp.name,
            "description": tp.description,
            "upstream": f"{UPSTREAM}:{tp.upstream}",
            "features": features,
            "thirdparty": True,
            "pte": tp.file,
            "ptd": None,
            "methods": rec["facts"]["pte"]["methods"],
            "inputs": encode_per_method({m: list(ins) for m, ins in tp.inputs.items()}),
            "outputs_eager": {},
            "outputs_runtime": encode_per_method(outputs),
            "runtime_errors": errors,
            "tolerance": {"atol": 0.0, "rtol": 0.0},
            "facts": rec["facts"],
            "segment_field_presence": rec["segment_field_presence"],
            "extras": rec["extras"],
            "doubled": None,
        }
        (out_dir / f"{tp.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        entries.append(
            {
                "name": tp.name,
                "description": tp.description,
                "features": features,
                "thirdparty": True,
                "json": f"{tp.name}.json",
                "pte": tp.file,
                "ptd": None,
                "pte_size": len(data),
                "ptd_size": None,
            }
        )
    return entries


def build_large(out_dir: Path, width: int, depth: int) -> None:
    """A bigger real model (default 6 x Linear(1024, 1024), ~24 MiB) for manual checks."""
    torch.manual_seed(0)
    spec = MethodSpec(LargeMLP(width, depth).eval(), (randn(200, 1, width),))
    export = export_xnnpack({"forward": spec})
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"large_mlp_{depth}x{width}_xnnpack"
    (out_dir / f"{name}.pte").write_bytes(export.pte)
    facts = reference_facts(export.pte, "pte")
    doc = {
        "name": name,
        "pte": f"{name}.pte",
        "facts": facts,
        "inputs": encode_per_method({"forward": list(spec.inputs)}),
        "outputs_eager": encode_per_method({"forward": eager(spec.module, spec.inputs)}),
    }
    (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out_dir / (name + '.pte')} ({len(export.pte)} bytes)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--only", action="append", help="rebuild only this fixture (repeatable)")
    ap.add_argument("--large", type=Path, metavar="DIR", help="export a large model into DIR")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--list", action="store_true", help="list fixture names and exit")
    args = ap.parse_args(argv)
    if args.list:
        for s in specs():
            print(f"{s.name}: {s.description}")
        return 0
    if args.large is not None:
        build_large(args.large, args.width, args.depth)
        return 0
    build_all(args.out, set(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
