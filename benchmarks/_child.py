"""One measured process of ``benchmarks/run.py`` (run as a script, never imported).

    python benchmarks/_child.py MODE SRC DST

MODE is ``idle`` (import ptestore and numpy, nothing else), ``passthrough``, ``one``
(the first weight in the file, 16 MiB in every benchmark program, doubled), ``tenpct``
(the weights in file order doubled until >= 10% of the file's bytes are replaced) or
``et`` (ExecuTorch's own Python round trip: ``deserialize_pte_binary`` then
``serialize_pte_binary``, written and fsynced). Prints one
JSON line: the seconds spent inside the process on the work (interpreter start-up and
imports excluded) and, for ptestore, the file report.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _doubling(keys: list[str]) -> Any:
    import numpy as np

    from ptestore.backends import BackendData, BackendInterface

    class Doubling(BackendInterface):
        """Doubles float32 weights; the replacement is the numpy result itself."""

        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            for key in keys:
                doubled = np.frombuffer(named.get_data(key), dtype=np.float32) * 2
                output.write_named_data(key, BackendData(doubled))
                del doubled

    return Doubling()


def _weights(src: str) -> list[tuple[str, int]]:
    """Named keys of weights (segments of 1 MiB or more), in file order."""
    from ptestore.format.reader import read_container
    from ptestore.storage.loaders import LocalFileLoader

    with LocalFileLoader(src) as loader:
        c = read_container(loader).container
        sized = [
            (c.absolute(c.segments[e.segment_index]), e.key, c.segments[e.segment_index].size)
            for e in c.named_data
        ]
    return [(k, s) for _, k, s in sorted(sized) if s >= 1 << 20]


def main() -> None:
    mode, src, dst = sys.argv[1:4]
    import numpy  # noqa: F401  (part of the idle baseline, as in every mode)

    import ptestore

    if mode == "idle":
        print(json.dumps({"inner_s": 0.0}))
        return
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if mode == "et":
        from executorch.exir._serialize._program import (
            deserialize_pte_binary,
            serialize_pte_binary,
        )

        with open(src, "rb") as f:
            data = f.read()
        pte = deserialize_pte_binary(data)
        del data
        cord = serialize_pte_binary(pte, extract_delegate_segments=True)
        with open(dst, "wb") as f:
            cord.write_to_file(f)
            f.flush()
            os.fsync(f.fileno())
    else:
        if mode == "passthrough":
            backends: list[Any] = ["passthrough"]
        else:
            weights = _weights(src)
            if mode == "one":
                keys = [weights[0][0]]
            else:
                need, total, keys = os.path.getsize(src) / 10, 0, []
                for key, size in weights:
                    if total >= need:
                        break
                    keys.append(key)
                    total += size
            backends = [_doubling(keys)]
        report = ptestore.specialize(src, dst, backends=backends, provenance=False)
        out["file"] = report.files[0].__dict__
    out["inner_s"] = time.perf_counter() - t0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
