"""Benchmark: peak memory of one large replacement, whole or in pieces.

    python benchmarks/bench_chunks.py --dir /tmp/bench-chunks [--weight-mib 80]

The model is made from the real XNNPACK fixture by ptestore itself (its first weight
becomes ``--weight-mib`` MiB, the other three 64 MiB each). Each run is a fresh child
process: it imports ptestore and numpy, resets its peak RSS (``/proc/self/clear_refs``;
``ru_maxrss`` would include the parent's image from before ``exec``), then
specializes the model to a new file with a backend that doubles the large weight,
either ``whole`` (one array for the result, ``write_named_data``) or ``chunks`` (8 MiB
pieces read from the zero-copy view and given to ``write_named_data_chunks``), and
reports the peak RSS (``VmHWM``) above that baseline.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = r"""
import json, sys
import numpy as np
import ptestore
from ptestore.backends import BackendData, BackendInterface

mode, src, dst, key = sys.argv[1:5]

class Double(BackendInterface):
    name = "XnnpackBackend"
    def initialize_backend_data(self, context, output):
        original = context.get_named_data_map().get_data(key)
        if mode == "whole":
            out = np.frombuffer(original, dtype=np.float32) * 2  # one array for the result
            output.write_named_data(key, BackendData(out))
            return
        view, piece = memoryview(original), 8 << 20
        def pieces():
            for start in range(0, view.nbytes, piece):
                yield (np.frombuffer(view[start:start + piece], dtype=np.float32) * 2).tobytes()
        output.write_named_data_chunks(key, view.nbytes, pieces())

import ptestore.coordinator  # what the run needs, imported before the baseline

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

with open("/proc/self/clear_refs", "w") as f:  # peak RSS := current RSS
    f.write("5")
base = hwm()
ptestore.specialize(src, dst, backends=[Double()], provenance=False)
peak = hwm()
print(json.dumps({"mode": mode, "baseline_kib": base, "peak_kib": peak,
                  "above_mib": round((peak - base) / 1024, 1)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--weight-mib", type=int, default=80)
    args = ap.parse_args()
    from bench_device import FIXTURE, MIB, Inflate

    import ptestore

    args.dir.mkdir(parents=True, exist_ok=True)
    model = args.dir / "model.pte"
    inflate = Inflate(args.weight_mib * MIB, 64 * MIB)
    ptestore.specialize(FIXTURE, model, backends=[inflate], provenance=False)
    key = inflate.keys[0]
    for mode in ("whole", "chunks", "whole", "chunks"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(model), str(args.dir / "out.pte"), key],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        print(out.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
