"""What ExecuTorch's own deserializers say each named-data key holds (reference for the
tensor info ptestore reports).

- XNNPACK delegate graphs: the blob comes from ``deserialize_pte_binary`` (which puts
  segment delegates back inline), its header is parsed by ExecuTorch's ``XNNHeader``, the
  FlatBuffer is decompiled by the ``flatc`` bundled with ExecuTorch against the shipped
  ``schema.fbs`` and turned into ExecuTorch's ``XNNGraph`` dataclasses.
- EXTERNAL program tensors: ``deserialize_pte_binary(...).program.execution_plan[].values``.
- .ptd tensor layouts: ``reference_facts`` (FlatTensor's own deserializer).

Descriptions are plain dicts in ptestore's ``TensorInfo.to_json()`` vocabulary, produced
from ExecuTorch's enum *names* through the tables below (shared with nothing in ptestore).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from support.et_reference import reference_facts

XNN_DTYPE_NAMES = {
    "xnn_datatype_fp32": "float32",
    "xnn_datatype_fp16": "float16",
    "xnn_datatype_bf16": "bfloat16",
    "xnn_datatype_int32": "int32",
    "xnn_datatype_qint8": "qint8_per_tensor",
    "xnn_datatype_quint8": "quint8_per_tensor",
    "xnn_datatype_qint32": "qint32_per_tensor",
    "xnn_datatype_qcint8": "qint8_per_channel",
    "xnn_datatype_qcint32": "qint32_per_channel",
    "xnn_datatype_qcint4": "qint4_per_channel",
    "xnn_datatype_qbint4": "qint4_blockwise",
    "xnn_datatype_qdint8": "qint8_dynamic",
    "xnn_datatype_qpint8": "qint8_packed",
    "xnn_datatype_pfp32": "float32_packed",
}
SCALAR_TYPE_NAMES = {
    "BYTE": "uint8",
    "CHAR": "int8",
    "SHORT": "int16",
    "INT": "int32",
    "LONG": "int64",
    "HALF": "float16",
    "FLOAT": "float32",
    "DOUBLE": "float64",
    "BOOL": "bool",
    "QINT8": "qint8",
    "QUINT8": "quint8",
    "QINT32": "qint32",
    "BFLOAT16": "bfloat16",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
}
_ELEMENT_BYTES = {"float32": 4, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


def _xnngraph(graph_bytes: bytes) -> Any:
    import executorch.backends.xnnpack.serialization as ser
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import XNNGraph
    from executorch.exir._serialize._dataclass import _json_to_dataclass
    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    schema = Path(next(iter(ser.__path__))) / "schema.fbs"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "graph.bin").write_bytes(graph_bytes)
        _flatc_decompile(tmp, str(schema), str(Path(tmp, "graph.bin")))
        text = Path(tmp, "graph.json").read_bytes()
    # flatc writes inf for float fields (output_min_max); JSON spells it Infinity.
    obj = json.loads(re.sub(rb":\s*(-?)inf\b", rb": \1Infinity", text))
    return _json_to_dataclass(obj, XNNGraph)


def _xnn_descriptions(blob: bytes, where: str) -> list[tuple[str, dict[str, Any]]]:
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import (
        PerChannelGroupQuant,
        PerChannelQuant,
        PerTensorQuant,
        PerTokenDynamicQuant,
        XNNQuantizedTensorValue,
    )
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    try:
        hdr = XNNHeader.from_bytes(blob[: XNNHeader.EXPECTED_LENGTH])
        graph = _xnngraph(blob[hdr.flatbuffer_offset : hdr.flatbuffer_offset + hdr.flatbuffer_size])
    except ValueError:
        graph = _xnngraph(blob)
    consts = graph.constant_data
    out: list[tuple[str, dict[str, Any]]] = []
    for i, xv in enumerate(graph.xvalues):
        u = xv.xvalue_union
        tv = u.tensor_value if isinstance(u, XNNQuantizedTensorValue) else u
        if tv.constant_buffer_idx == 0 or not consts[tv.constant_buffer_idx].named_key:
            continue
        entry = consts[tv.constant_buffer_idx]
        here = f"{where} xvalues[{i}]"
        quant = None
        scale = None
        if isinstance(u, XNNQuantizedTensorValue):
            q = u.quant_params
            if isinstance(q, PerTensorQuant):
                quant = {"scheme": "per_tensor", "scale": [q.scale], "zero_point": [q.zero_point]}
            elif isinstance(q, PerTokenDynamicQuant):
                quant = {"scheme": "per_token_dynamic"}
            elif isinstance(q, PerChannelQuant | PerChannelGroupQuant):
                group = isinstance(q, PerChannelGroupQuant)
                skey = consts[q.scale_buffer_idx].named_key if q.scale_buffer_idx else None
                quant = {
                    "scheme": "per_channel_group" if group else "per_channel",
                    "scale": list(q.scale),
                    "channel_axis": q.channel_dim,
                    "group_size": q.group_size if group else None,
                    "scale_key": skey,
                    "num_scales": q.num_scales,
                    "scale_dtype": "bfloat16" if group else "float32",
                }
                if skey:
                    scale = (
                        skey,
                        {
                            "dtype": "bfloat16" if group else "float32",
                            "shape": [q.num_scales],
                            "nbytes": consts[q.scale_buffer_idx].size,
                            "source": "xnnpack",
                            "where": f"{here} quant_params",
                            "role": "scale",
                            "scales_for": entry.named_key,
                        },
                    )
        out.append(
            (
                entry.named_key,
                {
                    "dtype": XNN_DTYPE_NAMES[tv.datatype.name],
                    "shape": list(tv.dims),
                    "nbytes": entry.size,
                    "source": "xnnpack",
                    "where": here,
                    "role": "tensor",
                    "quantization": quant,
                },
            )
        )
        if scale is not None:
            out.append(scale)
    return out


def _tensor_description(
    scalar: str, sizes: list[int], dim_order: list[int], src: str
) -> dict[str, Any]:
    dtype = SCALAR_TYPE_NAMES[scalar]
    n = 1
    for s in sizes:
        n *= s
    order = None if dim_order == list(range(len(dim_order))) else dim_order
    return {
        "dtype": dtype,
        "shape": sizes,
        "nbytes": n * _ELEMENT_BYTES[dtype],
        "source": src,
        "dim_order": order,
        "role": "tensor",
        "quantization": None,
    }


def reference_tensor_descriptions(
    pte: Path, ptd: Path | None = None
) -> dict[str, list[dict[str, Any]]]:
    """key -> its descriptions, in ptestore's precedence (XNNPACK, program, .ptd)."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor, TensorDataLocation

    program = deserialize_pte_binary(pte.read_bytes()).program
    found: list[tuple[str, dict[str, Any]]] = []
    for plan in program.execution_plan:
        seen: set[int] = set()
        for pos, d in enumerate(plan.delegates):
            if d.id != "XnnpackBackend" or d.processed.index in seen:
                continue
            seen.add(d.processed.index)
            blob = bytes(program.backend_delegate_data[d.processed.index].data)
            found += _xnn_descriptions(blob, f"{plan.name}[{pos}]")
    for plan in program.execution_plan:
        for i, v in enumerate(plan.values):
            t = v.val
            extra = getattr(t, "extra_tensor_info", None)
            if not isinstance(t, Tensor) or extra is None:
                continue
            if extra.location != TensorDataLocation.EXTERNAL:
                continue
            desc = _tensor_description(
                t.scalar_type.name, list(t.sizes), list(t.dim_order), "program"
            )
            desc["where"] = f"{plan.name} values[{i}]"
            found.append((extra.fully_qualified_name, desc))
    if ptd is not None:
        names = {v: k for k, v in _scalar_type_values().items()}
        for nd in reference_facts(ptd, "ptd")["named_data"]:
            lay = nd["tensor_layout"]
            if lay is not None:
                found.append(
                    (
                        nd["key"],
                        _tensor_description(
                            names[lay["scalar_type"]], lay["sizes"], lay["dim_order"], "ptd"
                        ),
                    )
                )
    out: dict[str, list[dict[str, Any]]] = {}
    for key, desc in found:
        out.setdefault(key, []).append(desc)
    return out


def _scalar_type_values() -> dict[str, int]:
    from executorch.exir.scalar_type import ScalarType

    return {s.name: int(s.value) for s in ScalarType}
