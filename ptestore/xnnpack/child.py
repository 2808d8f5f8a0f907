"""The child process that runs the stock runtime: ``python -m ptestore.xnnpack.child REQ``
(the maker runs it with its own ptestore package: :func:`.runs.child_command`).

``REQ`` is a JSON file: ``shim`` and ``runtime`` (the native piece and the bindings'
extension it forwards to), ``pte``, ``ptd`` (or null), ``out`` (a directory) and
``steps``, each ``{"name": ..., "cache": PATH or null}``. For each step, in order, the
program is loaded through the Python bindings with the packed-weight cache at ``cache``
(none when null) and every method runs on probe inputs (a fixed seed per method and
input, shaped and typed by the method's metadata); the outputs go to ``out/<name>.npz``
and what the shim saw to ``out/<name>.json``. A crash ends the process, which is the
point: the parent sees the signal, and nothing it cares about was touched.

Exit status: 0 done; 3 the program cannot be probed or run (``out/error.json`` says why).
With ``parent`` (the maker's pid) in ``REQ`` it ends with the maker (:func:`die_with`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from ..format.tensorinfo import SCALAR_TYPE_NAMES

__all__ = ["SCALAR_TYPES", "main"]

#: The ExecuTorch ScalarType codes the probe makes inputs for (torch's rand/randint cover
#: them), named as :mod:`ptestore.format.tensorinfo` names every code; any other input is
#: refused with its code.
SCALAR_TYPES = {code: SCALAR_TYPE_NAMES[code] for code in (0, 1, 2, 3, 4, 5, 6, 7, 11, 15)}


class ProbeError(Exception):
    pass


def open_shim(shim: str, runtime: str) -> Any:
    """Load the native piece, global, before the bindings' extension is imported."""
    lib = ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
    lib.ptestore_xnn_configure.argtypes = [ctypes.c_char_p]
    lib.ptestore_xnn_configure.restype = ctypes.c_int
    lib.ptestore_xnn_set_runtime.argtypes = [ctypes.c_char_p]
    lib.ptestore_xnn_set_runtime.restype = ctypes.c_int
    lib.ptestore_xnn_count.argtypes = [ctypes.c_int]
    lib.ptestore_xnn_count.restype = ctypes.c_long
    lib.ptestore_xnn_max_path.restype = ctypes.c_long
    lib.ptestore_xnn_configs.restype = ctypes.c_long
    if lib.ptestore_xnn_set_runtime(runtime.encode()) != 0:
        raise ProbeError(f"{runtime}: path too long for the shim")
    return lib


def probe_inputs(module: Any, method: str) -> list[Any]:
    """Deterministic inputs for ``method`` from its metadata."""
    import torch

    meta = module.method_meta(method)
    out: list[Any] = []
    for i in range(meta.num_inputs()):
        try:
            info = meta.input_tensor_meta(i)
        except Exception as exc:
            raise ProbeError(f"method {method!r} input {i} is not a tensor ({exc})") from None
        code = int(info.dtype())
        name = SCALAR_TYPES.get(code)
        if name is None:
            raise ProbeError(f"method {method!r} input {i} has scalar type {code}")
        dtype = getattr(torch, name)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{method}/{i}".encode()))
        shape = tuple(int(s) for s in info.sizes())
        if dtype.is_floating_point:
            t = (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).to(torch.bool)
        else:
            t = torch.randint(0, 2, shape, generator=gen).to(dtype)  # valid indices too
        out.append(t)
    return out


def as_array(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bits
            return t.view(torch.int16).numpy().copy()
        return t.numpy().copy()
    return np.asarray(value)


def run_step(lib: Any, portable_lib: Any, pte: str, ptd: str | None, cache: str | None) -> Any:
    """Load once with ``cache`` and run every method; (outputs, report)."""
    if lib.ptestore_xnn_configure((cache or "").encode()) != 0:
        raise ProbeError(f"cache path too long for the runtime's option: {cache}")
    seen0, added0 = lib.ptestore_xnn_count(0), lib.ptestore_xnn_count(1)
    start = time.perf_counter()
    module = (
        portable_lib._load_for_executorch(pte, ptd)
        if ptd
        else (portable_lib._load_for_executorch(pte))
    )
    outputs: dict[str, Any] = {}
    methods = list(module.method_names())
    first_run = None
    for method in methods:
        inputs = probe_inputs(module, method)
        try:
            results = module.run_method(method, inputs)
        except Exception as exc:
            raise ProbeError(f"method {method!r} failed in the runtime: {exc}") from None
        if first_run is None:
            first_run = time.perf_counter() - start
        for j, r in enumerate(results):
            outputs[f"{method}/{j}"] = as_array(r)
    report = {
        "methods": methods,
        "loads_seen": lib.ptestore_xnn_count(0) - seen0,
        "loads_with_options": lib.ptestore_xnn_count(1) - added0,
        "load_and_first_run_s": first_run,
        # the runtime maps the file it loaded while the methods live: the explicit sign
        # that it took the packed weights from it (not a line of its log)
        "cache_mapped": None if cache is None else mapped(cache),
    }
    del module
    return outputs, report


def mapped(path: str) -> bool | None:
    """Whether the file at ``path`` (its device and inode) is mapped into this process
    (``/proc/self/maps``); None when that cannot be read."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or ":" not in fields[3]:
            continue
        major, minor = fields[3].split(":", 1)
        try:
            if (int(major, 16), int(minor, 16), int(fields[4])) == want:
                return True
        except ValueError:
            continue
    return False


#: ``prctl`` option: the signal this process gets when its parent ends.
PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """End (SIGKILL) when the maker ``parent`` ends, killed too: the runtime never runs
    on for a maker that is gone (Linux; elsewhere nothing is asked)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if isinstance(req.get("parent"), int):
        die_with(req["parent"])
    out = Path(req["out"])
    import numpy as np
    import torch  # noqa: F401  (the bindings' libraries come with it)

    from .native import bindings

    try:
        lib = open_shim(req["shim"], req["runtime"])
        portable_lib = bindings()

        for step in req["steps"]:
            outputs, report = run_step(lib, portable_lib, req["pte"], req.get("ptd"), step["cache"])
            np.savez(out / f"{step['name']}.npz", **outputs)
            (out / f"{step['name']}.json").write_text(json.dumps(report), encoding="utf-8")
    except ProbeError as exc:
        (out / "error.json").write_text(json.dumps({"reason": str(exc)}), encoding="utf-8")
        return 3
    except RuntimeError as exc:  # the bindings' load/run failures
        (out / "error.json").write_text(
            json.dumps({"reason": f"the runtime failed: {exc}"}), encoding="utf-8"
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
