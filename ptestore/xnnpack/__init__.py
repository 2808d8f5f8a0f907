"""XNNPACK packed weights for the stock ExecuTorch runtime: made once, bound, verified.

Install with the ``xnnpack`` extra. The core never imports this package. See
docs/xnnpack.md.

- :func:`make_cache` makes (or finds) the verified file for an artifact, this runtime
  and this CPU in a directory, under an ``flock``; :func:`find_cache` and
  :func:`verify_cache` check one before it is handed out;
- :func:`adopt_cache` installs a file made elsewhere (a fleet's worker) after the same
  checks;
- :func:`load` runs an artifact in this process with a verified file;
- :func:`build_shim` builds the native piece (``python -m ptestore.xnnpack build``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .adopt import adopt_cache
    from .cache import CacheFile, artifact_keys, find_cache, make_cache, verify_cache
    from .identity import Identity, cpu_fingerprint
    from .loader import XnnpackProgram, load
    from .native import build_shim, executorch_build

__all__ = [
    "CacheFile",
    "Identity",
    "XnnpackProgram",
    "adopt_cache",
    "artifact_keys",
    "build_shim",
    "cpu_fingerprint",
    "executorch_build",
    "find_cache",
    "load",
    "make_cache",
    "verify_cache",
]

_WHERE = {
    "adopt_cache": "adopt",
    "CacheFile": "cache",
    "artifact_keys": "cache",
    "find_cache": "cache",
    "make_cache": "cache",
    "verify_cache": "cache",
    "Identity": "identity",
    "cpu_fingerprint": "identity",
    "XnnpackProgram": "loader",
    "load": "loader",
    "build_shim": "native",
    "executorch_build": "native",
}


__getattr__ = lazy_names(__name__, _WHERE)
