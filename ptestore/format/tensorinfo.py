"""What a named-data value holds: dtype, shape, byte size and quantization parameters.

A :class:`TensorInfo` comes from one of the descriptions a model carries (``source``):

- ``"xnnpack"``: an XNNPACK delegate graph (``XNNGraph.xvalues`` + ``constant_data``);
- ``"program"``: a ``Tensor`` value of an execution plan whose data is EXTERNAL (its
  fully qualified name is the key);
- ``"ptd"``: the ``TensorLayout`` stored next to the entry in a .ptd.

dtype names are lowercase: the ExecuTorch scalar types (``float32``, ``bfloat16``,
``int8``, ``qint8``, ``quint4x2``, ...) and the XNNPACK datatypes
(``qint8_per_channel``, ``qint32_per_tensor``, ``qint4_blockwise``, ...), see
:data:`DTYPES`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from .._dataclass import dataclass, field
from ..errors import FormatError
from .flatbuf import Vector
from .model import TensorLayout

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DTYPES",
    "MAX_ARRAY_DIMS",
    "MAX_OTHER_USES",
    "SCALAR_TYPE_NAMES",
    "DtypeSpec",
    "QuantParams",
    "TensorInfo",
    "array_view",
    "info_from_layout",
    "read_dims",
    "scalar_type_info",
]

TensorSource = Literal["ptd", "program", "xnnpack"]

#: The most dims a tensor description may have (:func:`read_dims` refuses more) and
#: :func:`array_view` shapes an array into: numpy's own limit. ExecuTorch's runtime takes
#: far fewer (``kTensorDimensionLimit`` = 16), XNNPACK 6 (``XNN_MAX_TENSOR_DIMS``), so
#: no loadable file is refused; without a limit a 1 MB sizes vector of 250,000 dims made
#: every element count a growing big-int product (minutes).
MAX_ARRAY_DIMS = 64
#: Element counts from here on are refused: no file holds a tensor that large.
_MAX_NUMEL = 1 << 64
#: The most other descriptions of one key :attr:`TensorInfo.other_uses` lists (a key
#: that many graphs describe differently cannot make every report that large).
MAX_OTHER_USES = 8


@dataclass(frozen=True)
class DtypeSpec:
    """How one dtype is stored: bits per element (None: a packed, opaque format) and the
    numpy dtype :func:`array_view` uses (None: raw ``uint8`` bytes, shape ``(nbytes,)``)."""

    bits: int | None
    array: str | None


_F = DtypeSpec
#: Every dtype name ptestore reports. ``array`` for float formats numpy lacks
#: (``bfloat16``, ``float8_*``) is the unsigned integer of the same width: the bit patterns.
DTYPES: dict[str, DtypeSpec] = {
    "bool": _F(8, "bool"),
    "uint8": _F(8, "uint8"),
    "int8": _F(8, "int8"),
    "int16": _F(16, "int16"),
    "int32": _F(32, "int32"),
    "int64": _F(64, "int64"),
    "uint16": _F(16, "uint16"),
    "uint32": _F(32, "uint32"),
    "uint64": _F(64, "uint64"),
    "float16": _F(16, "float16"),
    "float32": _F(32, "float32"),
    "float64": _F(64, "float64"),
    "bfloat16": _F(16, "uint16"),
    "bits16": _F(16, "uint16"),
    "float8_e5m2": _F(8, "uint8"),
    "float8_e4m3fn": _F(8, "uint8"),
    "float8_e5m2fnuz": _F(8, "uint8"),
    "float8_e4m3fnuz": _F(8, "uint8"),
    "complex32": _F(32, None),
    "complex64": _F(64, "complex64"),
    "complex128": _F(128, "complex128"),
    "bits1x8": _F(8, "uint8"),
    "bits2x4": _F(8, "uint8"),
    "bits4x2": _F(8, "uint8"),
    "bits8": _F(8, "uint8"),
    "qint8": _F(8, "int8"),
    "quint8": _F(8, "uint8"),
    "qint32": _F(32, "int32"),
    "quint4x2": _F(4, None),
    "quint2x4": _F(2, None),
    # XNNPACK datatypes (backends/xnnpack/serialization/schema.fbs)
    "qint8_per_tensor": _F(8, "int8"),
    "quint8_per_tensor": _F(8, "uint8"),
    "qint32_per_tensor": _F(32, "int32"),
    "qint8_per_channel": _F(8, "int8"),
    "qint32_per_channel": _F(32, "int32"),
    "qint4_per_channel": _F(4, None),
    "qint4_blockwise": _F(4, None),
    "qint8_dynamic": _F(8, "int8"),
    "qint8_packed": _F(None, None),
    "float32_packed": _F(None, None),
}

#: ExecuTorch ``ScalarType`` (schema/scalar_type.fbs) -> dtype name.
SCALAR_TYPE_NAMES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bfloat16",
    16: "quint4x2",
    17: "quint2x4",
    18: "bits1x8",
    19: "bits2x4",
    20: "bits4x2",
    21: "bits8",
    22: "bits16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
    27: "uint16",
    28: "uint32",
    29: "uint64",
}


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # "nan", "inf", "-inf"


@dataclass(frozen=True)
class QuantParams:
    """Quantization parameters of a quantized tensor.

    ``scheme`` is ``"per_tensor"`` (one ``scale`` and ``zero_point``), ``"per_channel"``
    (a scale per slice along ``channel_axis``, symmetric: zero point 0),
    ``"per_channel_group"`` (blockwise: ``group_size`` elements per scale along the
    input channels) or ``"per_token_dynamic"`` (computed at run time). Scales stored as
    named data are named by ``scale_key`` (``num_scales`` values of ``scale_dtype``);
    scales stored in the graph itself are in ``scale``.
    """

    scheme: Literal["per_tensor", "per_channel", "per_channel_group", "per_token_dynamic"]
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()
    channel_axis: int | None = None
    group_size: int | None = None
    scale_key: str | None = None
    num_scales: int | None = None
    scale_dtype: str | None = None

    def to_json(self) -> dict[str, object]:
        """A JSON object; a scale that is not finite (a file can hold any float) is the
        string ``"nan"``, ``"inf"`` or ``"-inf"``: JSON has no such numbers."""
        return {
            "scheme": self.scheme,
            "scale": [_json_float(x) for x in self.scale],
            "zero_point": list(self.zero_point),
            "channel_axis": self.channel_axis,
            "group_size": self.group_size,
            "scale_key": self.scale_key,
            "num_scales": self.num_scales,
            "scale_dtype": self.scale_dtype,
        }


@dataclass(frozen=True)
class TensorInfo:
    """What the model says a named-data value holds.

    ``shape`` is the logical shape; ``dim_order`` (None = contiguous) says how the bytes
    are laid out. For XNNPACK tensors the shape is already the stored layout (for
    example NHWC / OHWI for convolution weights). ``role`` is ``"tensor"`` for a tensor
    value and ``"scale"`` for the quantization scales of another tensor (whose key is
    ``scales_for``). ``other_uses`` lists other, *different* descriptions of the same
    key (identical bytes used as, say, an int8 weight and a float32 bias); it is empty
    in the common case and a careful backend leaves such keys alone. It lists at most
    :data:`MAX_OTHER_USES`; ``more_uses`` counts the different descriptions past those.
    """

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    source: TensorSource
    #: Where the description is, for people: ``"forward[0] xvalues[2]"``, ``"forward values[3]"``.
    where: str = ""
    dim_order: tuple[int, ...] | None = None
    quantization: QuantParams | None = None
    role: Literal["tensor", "scale"] = "tensor"
    scales_for: str | None = None
    other_uses: tuple[TensorInfo, ...] = field(default=())
    more_uses: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def array_dtype(self) -> str:
        """The numpy dtype of :meth:`NamedDataMap.get_array` for this value."""
        spec = DTYPES.get(self.dtype)
        if spec is None or spec.array is None or not self._elementwise(spec):
            return "uint8"
        return spec.array

    @property
    def array_shape(self) -> tuple[int, ...]:
        """The shape of :meth:`NamedDataMap.get_array` for this value."""
        spec = DTYPES.get(self.dtype)
        if spec is None or spec.array is None or not self._elementwise(spec):
            return (self.nbytes,)
        return self.shape

    def _elementwise(self, spec: DtypeSpec) -> bool:
        return spec.bits is not None and self.numel * spec.bits == 8 * self.nbytes

    def description(self) -> tuple[object, ...]:
        """What the description says, without where it came from (hashable: equal for
        two descriptions that say the same)."""
        return (self.dtype, self.shape, self.nbytes, self.dim_order, self.quantization, self.role)

    def same_description(self, other: TensorInfo) -> bool:
        """Equal up to where the description came from."""
        return self.description() == other.description()

    def to_json(self) -> dict[str, object]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "source": self.source,
            "where": self.where,
            "dim_order": None if self.dim_order is None else list(self.dim_order),
            "quantization": None if self.quantization is None else self.quantization.to_json(),
            "role": self.role,
            "scales_for": self.scales_for,
            "other_uses": [o.to_json() for o in self.other_uses],
            "more_uses": self.more_uses,
        }


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    spec = DTYPES.get(dtype)
    n = 1
    for d in shape:
        n *= max(d, 0)
    if spec is None or spec.bits is None:
        return 0
    return (n * spec.bits + 7) // 8


def read_dims(vec: Vector | None, *, unsigned: bool = False) -> tuple[int, ...]:
    """The dims of a tensor's sizes vector (int32 each; ``unsigned``: uint32), () when it
    is absent. :class:`FormatError` naming the file and field for more than
    :data:`MAX_ARRAY_DIMS` dims (checked before reading them) and for dims, all > 0,
    whose product reaches 2**64 (the product stops there)."""
    if vec is None:
        return ()
    source = vec.view.source
    if vec.length > MAX_ARRAY_DIMS:
        raise FormatError(
            source,
            f"{vec.field} (length)",
            vec.length,
            f"<= {MAX_ARRAY_DIMS} dims",
            "ptestore's limit; ExecuTorch's runtime takes at most 16",
        )
    dims = tuple(vec.i32s())
    if unsigned:
        dims = tuple(d & 0xFFFFFFFF for d in dims)
    if min(dims, default=0) > 0:
        n = 1
        for d in dims:
            n *= d
            if n >= _MAX_NUMEL:
                raise FormatError(
                    source,
                    vec.field,
                    list(dims),
                    "dims whose product (the element count) is < 2**64",
                    "a tensor larger than any file",
                )
    return dims


def scalar_type_info(
    scalar_type: int,
    sizes: tuple[int, ...],
    dim_order: tuple[int, ...],
    source: TensorSource,
    where: str,
) -> TensorInfo:
    """A TensorInfo from an ExecuTorch scalar type, sizes and dim order.

    A scalar type code ptestore does not know is named ``scalar_type_<code>`` and has
    ``nbytes`` 0 (its element size is unknown)."""
    dtype = SCALAR_TYPE_NAMES.get(scalar_type, f"scalar_type_{scalar_type}")
    order = None if dim_order == tuple(range(len(dim_order))) or not dim_order else dim_order
    return TensorInfo(
        dtype=dtype,
        shape=sizes,
        nbytes=_nbytes(dtype, sizes),
        source=source,
        where=where,
        dim_order=order,
    )


def info_from_layout(layout: TensorLayout, where: str) -> TensorInfo:
    """The TensorInfo of a .ptd ``TensorLayout``."""
    return scalar_type_info(layout.scalar_type, layout.sizes, layout.dim_order, "ptd", where)


def array_view(data: object, info: TensorInfo | None, key: str, source: str) -> np.ndarray:
    """A zero-copy, read-only numpy view of ``data`` as ``info`` describes it.

    No info (or a dtype of unknown element size): the whole value as ``uint8``. A value
    shorter than ``info.nbytes`` raises :class:`FormatError`; trailing bytes past
    ``info.nbytes`` are not part of the array. So does a described shape the array
    cannot take: a dim < 0, more than :data:`MAX_ARRAY_DIMS` dims, or any other numpy
    refuses (the error names the key and the description).
    """
    import numpy as np

    raw = memoryview(data).cast("B")  # type: ignore[arg-type]
    if info is None or (info.dtype not in DTYPES and info.nbytes == 0):
        arr = np.frombuffer(raw, dtype=np.uint8)
    else:
        described = f"{info.dtype} {list(info.shape)}, described by {info.source} {info.where}"
        if raw.nbytes < info.nbytes:
            raise FormatError(
                source,
                f"named data {key!r} (size)",
                raw.nbytes,
                f">= {info.nbytes} bytes ({described})",
            )
        dtype = np.dtype(info.array_dtype)
        shape = info.array_shape
        count = info.nbytes // dtype.itemsize
        arr = np.frombuffer(raw, dtype=dtype, count=count)
        order = info.dim_order if shape == info.shape else None
        try:
            if min(shape, default=0) < 0 or len(shape) > MAX_ARRAY_DIMS:
                raise ValueError
            if order is not None and sorted(order) == list(range(len(shape))):
                physical = tuple(shape[d] for d in order)
                inverse = [order.index(i) for i in range(len(order))]
                arr = arr.reshape(physical).transpose(inverse)
            else:
                arr = arr.reshape(shape)
        except (ValueError, OverflowError):
            raise FormatError(
                source,
                f"named data {key!r} (shape)",
                list(shape),
                f"at most {MAX_ARRAY_DIMS} dims, each >= 0, that {count} {dtype} "
                f"elements can take ({described})",
            ) from None
    arr.flags.writeable = False
    return arr
