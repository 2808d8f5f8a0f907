"""A small ptestore backend you can copy: it serves ``XnnpackBackend`` delegates.

It shows every part of the backend API:

- walk the delegate inputs (``for item in context``): processed blob + compile specs;
- read named data through the model-wide map (``get_named_data_map()``);
- submit a replacement for an existing key (``write_named_data``) with an alignment.

What it does is deliberately simple, so the mechanics stay visible: it doubles the
float32 weight stored under the first named-data key (by key order) of the model. A real
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
        named = context.get_named_data_map()
        keys = sorted(named.keys())
        if not keys:
            # Nothing to do: leave this backend's data exactly as it is.
            raise NotSupported("no named data in this model")
        key = keys[0]
        weights = np.frombuffer(named.get_data(key), dtype=np.float32)

        # 3. Replace the value of an existing key (never a new key), 64-byte aligned.
        output.write_named_data(key, BackendData((weights * 2).tobytes(), alignment=64))
        print(f"[example] replaced {key[:16]}... ({weights.nbytes} bytes)", file=sys.stderr)
