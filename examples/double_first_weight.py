"""A small ptestore backend you can copy: it serves ``XnnpackBackend`` delegates.

It shows every part of the backend API:

- walk the delegate inputs (``for item in context``): processed blob + compile specs;
- read named data through the model-wide map (``get_named_data_map()``), asking
  ``get_tensor_info`` what each value is and ``get_array`` for it as a numpy array;
- submit a replacement for an existing key (``write_named_data``) with an alignment.

What it does is deliberately simple, so the mechanics stay visible: it doubles the
first (by key order) named-data value that the model describes as a float32 tensor. A real
backend would transform weights into its device's preferred form here, once, instead of
at every model load.

Run it (from the repository root):

    python -m ptestore specialize examples/mlp_xnnpack.pte mlp_specialized.pte \
        --backend examples.double_first_weight:DoubleFirstWeight
"""

from __future__ import annotations

import sys

import numpy as np

from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NotSupported,
)


class DoubleFirstWeight(BackendInterface):
    #: The BackendDelegate.id this implementation serves.
    name = "XnnpackBackend"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        # 1. The delegate blobs of this backend, one unique blob at a time.
        for item in context:
            specs = {spec.key: spec.value.hex() for spec in item.compile_specs}
            print(
                f"[example] {item.backend_id} blob for {', '.join(item.methods)}: "
                f"{len(item.processed)} bytes, compile specs {specs}",
                file=sys.stderr,
            )

        # 2. The model-wide named data (.pte merged with .ptd).
        #    Tensor info says what each value is: never guess the dtype.
        named = context.get_named_data_map()
        keys = [
            k
            for k in sorted(named.keys())
            if (info := named.get_tensor_info(k)) is not None
            and info.dtype == "float32"
            and info.role == "tensor"
            and not named.get_shared_keys(k)
        ]
        if not keys:
            # Nothing to do: leave this backend's data exactly as it is.
            raise NotSupported("no float32 weight in this model")
        key = keys[0]
        weights = named.get_array(key)  # read-only float32, with the tensor's shape

        # 3. Replace the value of an existing key (never a new key, same size), 64-byte aligned.
        doubled = (weights * np.float32(2)).astype(np.float32)
        output.write_named_data(key, BackendData(doubled.tobytes(), alignment=64))
        print(f"[example] replaced {key[:16]}... (float32 {list(weights.shape)})", file=sys.stderr)
