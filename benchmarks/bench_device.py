"""Benchmark: on the device. A cache hit of ``ptestore.ensure`` on a 1 GiB model, and one
16 MiB weight replaced in place in that model against a durable copy.

    python benchmarks/bench_device.py --dir /tmp/bench-device [--size-gib 1] [--runs 5]

The model is made from the real XNNPACK fixture ``tests/fixtures/mlp_xnnpack.pte`` by
ptestore itself: its first named weight becomes 16 MiB, the other three share the rest
of ``--size-gib`` (the runtime cannot run it: the weights are zeros and a pattern; the
container, metadata and delegates are the export's). Figures:

- hit: median (max) of ``--runs`` x 20 in-process ``ensure`` calls after the first, and
  a whole ``python -c "import ptestore; ptestore.ensure(...)"`` hit against a bare
  ``python -c pass`` (median and minimum of ``--runs``);
- in place: the 16 MiB weight replaced by its bytes reversed (same size), by
  ``specialize(p, p, in_place=True)``: seconds, bytes the process wrote (``wchar`` of
  ``/proc/self/io``: the journal and the file), peak extra disk (free blocks sampled
  every millisecond, ``statvfs``); against copying the file durably (``copy_file_range``
  then ``fsync``, what a staged rewrite must at least do) and a staged ``specialize``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ptestore
from ptestore.backends import BackendData, BackendInterface

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mlp_xnnpack.pte"
MIB = 1 << 20


class Inflate(BackendInterface):
    """Gives the first key ``first`` bytes and the others ``rest`` bytes each."""

    name = "XnnpackBackend"

    def __init__(self, first: int, rest: int) -> None:
        self.first, self.rest = first, rest
        self.keys: list[str] = []

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        self.keys = list(context.get_named_data_map())
        for i, key in enumerate(self.keys):
            n = self.first if i == 0 else self.rest
            value = (bytes(range(256)) * (n // 256 + 1))[:n]
            output.write_named_data(key, BackendData(value, allow_size_change=True))


class Reverse(BackendInterface):
    """Replaces one key by its bytes reversed (same size)."""

    name = "XnnpackBackend"

    def __init__(self, key: str) -> None:
        self.key = key

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = bytes(context.get_named_data_map().get_data(self.key))
        output.write_named_data(self.key, BackendData(value[::-1]))


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


class FreeSampler:
    """The lowest free space of a file system while it runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = self.free()
        self.low = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bfree * st.f_frsize

    def _run(self) -> None:
        while not self._stop.is_set():
            self.low = min(self.low, self.free())
            time.sleep(0.001)

    def __enter__(self) -> FreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.low = min(self.low, self.free())


def durable_copy(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        left = os.fstat(fi.fileno()).st_size
        while left:
            left -= os.copy_file_range(fi.fileno(), fo.fileno(), left)
        os.fsync(fo.fileno())
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    d: Path = args.dir
    d.mkdir(parents=True, exist_ok=True)
    model = d / "model.pte"
    total = int(args.size_gib * (1 << 30))
    inflate = Inflate(16 * MIB, (total - 16 * MIB) // 3)
    ptestore.specialize(FIXTURE, model, backends=[inflate], provenance=False)
    out: dict[str, Any] = {"size": model.stat().st_size, "uptime": os.getloadavg()}

    # -- cache hit
    cache = d / "cache"
    t = time.perf_counter()
    ptestore.ensure(model, cache_dir=cache, backends=["passthrough"])
    out["ensure_first_s"] = time.perf_counter() - t
    hits = []
    for _ in range(args.runs * 20):
        t = time.perf_counter()
        a = ptestore.ensure(model, cache_dir=cache, backends=["passthrough"])
        hits.append(time.perf_counter() - t)
        assert not a.created
    out["hit_median_ms"] = statistics.median(hits) * 1e3
    out["hit_max_ms"] = max(hits) * 1e3
    code = (
        f"import ptestore; ptestore.ensure({str(model)!r}, cache_dir={str(cache)!r}, "
        "backends=['passthrough'])"
    )
    whole, bare = [], []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        whole.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
    out["hit_process_ms"] = statistics.median(whole) * 1e3
    out["bare_process_ms"] = statistics.median(bare) * 1e3
    # minimums too: other load on the machine only ever adds time
    out["hit_process_min_ms"] = min(whole) * 1e3
    out["bare_process_min_ms"] = min(bare) * 1e3

    # -- in place against a durable copy and a staged specialize
    key = inflate.keys[0]
    copies = []
    for _ in range(args.runs):
        copies.append(durable_copy(model, d / "copy.pte"))
        os.unlink(d / "copy.pte")
    out["durable_copy_s"] = statistics.median(copies)
    staged = []
    for _ in range(args.runs):
        t = time.perf_counter()
        ptestore.specialize(model, d / "staged.pte", backends=[Reverse(key)], provenance=False)
        staged.append(time.perf_counter() - t)
        os.unlink(d / "staged.pte")
    out["staged_specialize_s"] = statistics.median(staged)
    times, written, extra = [], [], []
    for _ in range(args.runs):  # reversing twice gives the original back: same work
        os.sync()
        w0 = wchar()
        with FreeSampler(d) as fs:
            t = time.perf_counter()
            r = ptestore.specialize(
                model, model, backends=[Reverse(key)], in_place=True, provenance=False
            )
            times.append(time.perf_counter() - t)
        written.append(wchar() - w0)
        extra.append(fs.start - fs.low)
        assert r.files[0].bytes_replaced == 16 * MIB
    out["in_place_s"] = statistics.median(times)
    out["in_place_written_bytes"] = statistics.median(written)
    out["in_place_peak_extra_disk_bytes"] = max(extra)
    out["in_place_over_durable_copy"] = out["in_place_s"] / out["durable_copy_s"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
