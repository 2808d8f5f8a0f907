"""A ptestore backend that rounds float32 weights to bfloat16 precision, using only the
tensor info the model itself records.

For every named-data key of an ``XnnpackBackend`` model it asks
``get_tensor_info(key)`` what the bytes are, and rounds (round-to-nearest-even) only
plain float32 tensors: quantized weights (``qint8_per_channel``, ...), int32 biases,
quantization scales (``role == "scale"``), keys described in contradictory ways and
keys that share their stored bytes with any of those are left exactly as they are. The
values stay float32 (same size: the stock XNNPACK runtime reads float32), so the
model behaves like eager PyTorch with ``w.to(torch.bfloat16).float()`` weights.

Run it (from the repository root):

    python -m ptestore specialize examples/mlp_xnnpack.pte mlp_bf16.pte \
        --backend examples.bf16_round:Bf16Round
"""

from __future__ import annotations

import sys

import numpy as np

from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NamedDataMap,
    NotSupported,
    TensorInfo,
)


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), still float32."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).reshape(values.shape)


def is_plain_float32(info: TensorInfo | None) -> bool:
    """A float32 tensor value (not a quantization scale), described consistently."""
    return (
        info is not None
        and info.dtype == "float32"
        and info.role == "tensor"
        and info.quantization is None
        and not info.other_uses
    )


def why_not(named: NamedDataMap, key: str) -> str | None:
    """None when ``key`` and every key sharing its bytes are plain float32 tensors, else
    the reason to keep it."""
    for k in (key, *named.get_shared_keys(key)):
        info = named.get_tensor_info(k)
        if not is_plain_float32(info):
            what = "no tensor info" if info is None else f"{info.dtype} {info.role}"
            return what if k == key else f"shares its bytes with {k[:20]}: {what}"
    return None


class Bf16Round(BackendInterface):
    #: The BackendDelegate.id this implementation serves.
    name = "XnnpackBackend"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        named = context.get_named_data_map()
        written: set[str] = set(context.replaced_keys)
        for key in sorted(named.keys()):
            if key in written:
                continue
            reason = why_not(named, key)
            if reason is not None:
                print(f"[bf16] keep  {key[:20]:20} ({reason})", file=sys.stderr)
                continue
            weights = named.get_array(key)  # float32, with the tensor's shape
            rounded = round_to_bf16(weights).tobytes()
            for k in (key, *named.get_shared_keys(key)):  # shared bytes: write them all
                output.write_named_data(k, BackendData(rounded))
                written.add(k)
            print(f"[bf16] round {key[:20]:20} (float32 {list(weights.shape)})", file=sys.stderr)
        if not written - set(context.replaced_keys):
            raise NotSupported("no plain float32 weights in this model")
