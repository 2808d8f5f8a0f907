"""The XNNPACK delegate blob: its ``XH00`` header and the XNNGraph tensor values.

The header (its layout and checks: :mod:`.xnnheader`, re-exported here) says where the
FlatBuffer is; without it the whole blob is the FlatBuffer. The XNNGraph (schema.fbs,
identifier ``XN01``/``XN00``) lists ``xvalues``; a constant tensor has
``constant_buffer_idx`` into ``constant_data``, whose entry names the named-data key
(offset UINT64_MAX) and the byte size.

Read with the same bounds-checked :class:`~ptestore.format.flatbuf.FlatView` as the
container; every violation is a :class:`~ptestore.errors.FormatError`.
"""

from __future__ import annotations

import struct

from .._dataclass import dataclass
from ..errors import FormatError
from .flatbuf import TableView, WorkBudget
from .sizes import ConstantEntry, graph_root
from .tensorinfo import QuantParams, TensorInfo, read_dims
from .xnnheader import (
    XNN_HEADER_LENGTH,
    XNN_HEADER_MAGIC,
    XnnHeader,
    parse_xnn_header,
    xnngraph_span,
)

__all__ = [
    "XNN_DATATYPES",
    "XNN_HEADER_LENGTH",
    "XNN_HEADER_MAGIC",
    "PACKING_NODES",
    "PackedWeight",
    "XnnConstant",
    "XnnHeader",
    "parse_packed_weights",
    "parse_xnn_header",
    "parse_xnngraph",
    "xnngraph_span",
]

#: XNNDatatype -> dtype name.
XNN_DATATYPES: dict[int, str] = {
    0: "invalid",
    1: "float32",
    2: "float16",
    3: "qint8_per_tensor",
    4: "quint8_per_tensor",
    5: "qint32_per_tensor",
    6: "qint8_per_channel",
    7: "qint32_per_channel",
    8: "qint4_per_channel",
    9: "qint8_dynamic",
    10: "qint4_blockwise",
    11: "qint8_packed",
    12: "int32",
    13: "float32_packed",
    14: "bfloat16",
}

# Field ids (declaration order; a union takes two: type, then value).
_G_XNODES = 1
_G_XVALUES = 2
_XV_TYPE, _XV_VALUE = 0, 1
_XV_TENSOR, _XV_QUANTIZED = 1, 2
_TV_DATATYPE, _TV_NUM_DIMS, _TV_DIMS, _TV_CONSTANT_BUFFER_IDX = 0, 1, 2, 3
_TV_ID_OUT = 6
_XN_TYPE, _XN_VALUE = 0, 1
_QTV_TENSOR, _QTV_PARAMS_TYPE, _QTV_PARAMS = 0, 1, 2
_Q_PER_CHANNEL, _Q_PER_TENSOR, _Q_PER_TOKEN, _Q_GROUP = 1, 2, 3, 4
# PerChannelQuant: scale 0, channel_dim 1, scale_buffer_idx 2, num_scales 3
# PerChannelGroupQuant: scale 0, channel_dim 1, group_size 2, scale_bf16 3 (deprecated),
#   scale_buffer_idx 4, num_scales 5
# PerTensorQuant: scale 0 (float), zero_point 1
_F32 = struct.Struct("<f")
_I16 = struct.Struct("<h")


@dataclass(frozen=True)
class XnnConstant:
    """A named constant of an XNNPACK graph and what the graph says it holds."""

    key: str
    info: TensorInfo


def _i16(t: TableView, fid: int, name: str) -> int:
    pos = t.field_pos(fid, name, 2)
    if pos is None:
        return 0
    return int(_I16.unpack_from(t.view.buf, pos)[0])


def _f32(t: TableView, fid: int, name: str) -> float:
    pos = t.field_pos(fid, name, 4)
    if pos is None:
        return 0.0
    return float(_F32.unpack_from(t.view.buf, pos)[0])


def _f32s(t: TableView, fid: int, name: str) -> tuple[float, ...]:
    vec = t.vector(fid, name, 4)
    if vec is None:
        return ()
    t.view.spend(vec.length, 4 * vec.length, vec.field)
    return tuple(float(v) for v in struct.unpack_from(f"<{vec.length}f", t.view.buf, vec.start))


def _named(
    constants: list[ConstantEntry], idx: int, field: str, source: str
) -> tuple[str, int] | None:
    if idx == 0:
        return None
    if idx >= len(constants):
        raise FormatError(
            source, field, idx, f"< {len(constants)} (entries in XNNGraph.constant_data)"
        )
    return constants[idx]


def parse_xnngraph(
    buf: bytes | bytearray | memoryview,
    source: str,
    where: str = "",
    budget: WorkBudget | None = None,
) -> list[XnnConstant]:
    """The named constants of the XNNGraph FlatBuffer ``buf`` (and of their scales), in
    ``xvalues`` order. ``where`` prefixes each description's location; ``budget`` is
    charged too (the file's, shared by its graphs)."""
    root, constants = graph_root(buf, source, budget)
    xvalues = root.vector(_G_XVALUES, "xvalues", 4)
    out: list[XnnConstant] = []
    if xvalues is None:
        return out
    prefix = f"{where} " if where else ""
    for i in range(xvalues.length):
        xv = xvalues.table(i)
        kind = xv.scalar(_XV_TYPE, "xvalue_union_type", "u8")
        value = xv.table(_XV_VALUE, "xvalue_union")
        if value is None or kind not in (_XV_TENSOR, _XV_QUANTIZED):
            continue
        quant: TableView | None = None
        qkind = 0
        tensor: TableView | None = value
        if kind == _XV_QUANTIZED:
            tensor = value.table(_QTV_TENSOR, "tensor_value")
            qkind = value.scalar(_QTV_PARAMS_TYPE, "quant_params_type", "u8")
            quant = value.table(_QTV_PARAMS, "quant_params")
        if tensor is None:
            raise FormatError(source, f"{value.field}.tensor_value", None, "present")
        idx = tensor.scalar(_TV_CONSTANT_BUFFER_IDX, "constant_buffer_idx", "u32")
        entry = _named(constants, idx, f"{tensor.field}.constant_buffer_idx", source)
        if entry is None:
            continue
        key, size = entry
        dtype_code = _i16(tensor, _TV_DATATYPE, "datatype")
        dims = read_dims(tensor.vector(_TV_DIMS, "dims", 4), unsigned=True)
        num_dims = tensor.scalar(_TV_NUM_DIMS, "num_dims", "u32")
        if num_dims != len(dims):
            raise FormatError(
                source, f"{tensor.field}.num_dims", num_dims, f"{len(dims)} (the length of dims)"
            )
        here = f"{prefix}xvalues[{i}]"
        params, scale = _quant(quant, qkind, constants, source, key, here)
        out.append(
            XnnConstant(
                key,
                TensorInfo(
                    dtype=XNN_DATATYPES.get(dtype_code, f"xnn_datatype_{dtype_code}"),
                    shape=dims,
                    nbytes=size,
                    source="xnnpack",
                    where=here,
                    quantization=params,
                ),
            )
        )
        if scale is not None:
            out.append(scale)
    return out


def _quant(
    q: TableView | None,
    qkind: int,
    constants: list[ConstantEntry],
    source: str,
    key: str,
    where: str,
) -> tuple[QuantParams | None, XnnConstant | None]:
    if q is None:
        return None, None
    if qkind == _Q_PER_TENSOR:
        return (
            QuantParams(
                "per_tensor",
                scale=(_f32(q, 0, "scale"),),
                zero_point=(q.scalar(1, "zero_point", "i32"),),
            ),
            None,
        )
    if qkind == _Q_PER_TOKEN:
        return QuantParams("per_token_dynamic"), None
    if qkind not in (_Q_PER_CHANNEL, _Q_GROUP):
        return None, None
    group = qkind == _Q_GROUP
    axis = q.scalar(1, "channel_dim", "i32")
    group_size = q.scalar(2, "group_size", "i32") if group else None
    buf_fid, num_fid = (4, 5) if group else (2, 3)
    idx = q.scalar(buf_fid, "scale_buffer_idx", "u32")
    num = q.scalar(num_fid, "num_scales", "u32")
    entry = _named(constants, idx, f"{q.field}.scale_buffer_idx", source)
    scale_dtype = "bfloat16" if group else "float32"
    scale_info: XnnConstant | None = None
    if entry is not None:
        skey, ssize = entry
        scale_info = XnnConstant(
            skey,
            TensorInfo(
                dtype=scale_dtype,
                shape=(num,),
                nbytes=ssize,
                source="xnnpack",
                where=f"{where} quant_params",
                role="scale",
                scales_for=key,
            ),
        )
    params = QuantParams(
        "per_channel_group" if group else "per_channel",
        scale=_f32s(q, 0, "scale"),
        zero_point=(),
        channel_axis=axis,
        group_size=group_size,
        scale_key=None if entry is None else entry[0],
        num_scales=num,
        scale_dtype=scale_dtype,
    )
    return params, scale_info


#: The XNodeUnion types whose filter (and bias) XNNPACK packs at load time, through the
#: weights cache when it is on: type code -> (name, field id of filter_id, of bias_id).
#: (XNNFullyConnected; Conv2d, DepthwiseConv2d and ConvTranspose2d share _XNNNodeConv.)
PACKING_NODES: dict[int, tuple[str, int, int]] = {
    2: ("FullyConnected", 1, 2),
    7: ("Conv2d", 16, 17),
    13: ("DepthwiseConv2d", 16, 17),
    39: ("ConvTranspose2d", 16, 17),
}


@dataclass(frozen=True)
class PackedWeight:
    """A weight XNNPACK packs at load time: the named-data key of the node's filter and of
    its bias (None without a named bias). A packed-weight file names its entry after
    both, the filter's key followed by the bias's."""

    filter_key: str
    bias_key: str | None
    node: str
    where: str

    @property
    def entry_name(self) -> str:
        return self.filter_key + (self.bias_key or "")


def _value_keys(root: TableView, constants: list[ConstantEntry], source: str) -> dict[int, str]:
    """``id_out`` -> named-data key of every named constant value of the graph."""
    xvalues = root.vector(_G_XVALUES, "xvalues", 4)
    out: dict[int, str] = {}
    if xvalues is None:
        return out
    for i in range(xvalues.length):
        xv = xvalues.table(i)
        kind = xv.scalar(_XV_TYPE, "xvalue_union_type", "u8")
        value = xv.table(_XV_VALUE, "xvalue_union")
        if value is None or kind not in (_XV_TENSOR, _XV_QUANTIZED):
            continue
        tensor = value.table(_QTV_TENSOR, "tensor_value") if kind == _XV_QUANTIZED else value
        if tensor is None:
            raise FormatError(source, f"{value.field}.tensor_value", None, "present")
        idx = tensor.scalar(_TV_CONSTANT_BUFFER_IDX, "constant_buffer_idx", "u32")
        entry = _named(constants, idx, f"{tensor.field}.constant_buffer_idx", source)
        if entry is not None:
            out[tensor.scalar(_TV_ID_OUT, "id_out", "u32")] = entry[0]
    return out


def parse_packed_weights(
    buf: bytes | bytearray | memoryview,
    source: str,
    where: str = "",
    budget: WorkBudget | None = None,
) -> list[PackedWeight]:
    """The weights the nodes of the XNNGraph FlatBuffer ``buf`` have XNNPACK pack
    (:data:`PACKING_NODES` whose filter is a named constant), in ``xnodes`` order;
    ``budget`` as for :func:`parse_xnngraph`."""
    root, constants = graph_root(buf, source, budget)
    keys = _value_keys(root, constants, source)
    xnodes = root.vector(_G_XNODES, "xnodes", 4)
    out: list[PackedWeight] = []
    if xnodes is None:
        return out
    prefix = f"{where} " if where else ""
    for i in range(xnodes.length):
        node = xnodes.table(i)
        kind = node.scalar(_XN_TYPE, "xnode_union_type", "u8")
        if kind not in PACKING_NODES:
            continue
        name, filter_fid, bias_fid = PACKING_NODES[kind]
        value = node.table(_XN_VALUE, "xnode_union")
        if value is None:
            raise FormatError(source, f"{node.field}.xnode_union", None, f"an XNN{name}")
        filter_key = keys.get(value.scalar(filter_fid, "filter_id", "u32"))
        if filter_key is None:
            continue  # a filter computed at run time: nothing packed at load
        bias_key = keys.get(value.scalar(bias_fid, "bias_id", "u32"))
        out.append(PackedWeight(filter_key, bias_key, name, f"{prefix}xnodes[{i}]"))
    return out
