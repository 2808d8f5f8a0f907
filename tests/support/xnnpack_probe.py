"""The real runtime in a fresh process, with and without a packed-weight file: the one
probe the XNNPACK tests share (tests/xnnpack, tests/device, tests/fleet).

:func:`fresh_load` runs a new interpreter that loads an artifact through
:func:`ptestore.xnnpack.load` twice, once with the file and once without, runs
``forward`` on the same input and reports whether the outputs are bit-identical, their
dtype and shape, and how many method loads the native piece gave the cache options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["REPO", "env", "flip", "fresh_load", "rewrite_weights"]

REPO = Path(__file__).resolve().parents[2]

FRESH = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ptestore.xnnpack import load
    pte, cache, ptd = sys.argv[1], sys.argv[2], sys.argv[3] or None
    shape = tuple(json.loads(sys.argv[4]))
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    with load(pte, ptd=ptd, cache=cache) as p:
        with_file = p.run("forward", [x])[0]
    with load(pte, ptd=ptd) as p:
        without = p.run("forward", [x])[0]
    from ptestore.xnnpack.loader import _shim
    print(json.dumps({
        "same_bytes": with_file.tobytes() == without.tobytes(),
        "dtype": str(with_file.dtype), "shape": list(with_file.shape),
        "loads_with_options": _shim().ptestore_xnn_count(1),
    }))
    """
)


def env() -> dict[str, str]:
    """This environment with the work tree first on the path, warnings off."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHONWARNINGS"] = "ignore"
    return e


def fresh_load(
    pte: str | os.PathLike[str],
    cache: str | os.PathLike[str],
    *,
    ptd: str | os.PathLike[str] | None = None,
    shape: tuple[int, ...] = (2, 16),
) -> tuple[dict[str, Any], str]:
    """Load ``pte`` (with ``ptd``) with the packed-weight file ``cache`` and without it in
    a fresh process, run ``forward`` on a float32 input of ``shape`` (mlp_xnnpack's by
    default); the report (``same_bytes``, ``dtype``, ``shape``, ``loads_with_options``)
    and the process's stderr (where the runtime logs what it loaded)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            FRESH,
            os.fspath(pte),
            os.fspath(cache),
            "" if ptd is None else os.fspath(ptd),
            json.dumps(list(shape)),
        ],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report, out.stderr


def flip(path: str | os.PathLike[str], offset: int = 100) -> None:
    """Flip one bit of the byte at ``offset`` (inside the first packed region), in place,
    keeping the file read-only."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))
    os.chmod(path, 0o444)


def rewrite_weights(src: Path, dst: Path, *, pte: Path | None = None) -> None:
    """``dst``: ``src`` with every XNNPACK weight's bytes changed and the keys kept, as
    ``write_named_data(key, ...)`` leaves them (the stale-weights hazard). ``src`` is a
    ``.pte``, or the ``.ptd`` of ``pte``."""
    import numpy as np

    from ptestore.testing.named_data import open_named_data

    data = bytearray(src.read_bytes())
    files = (str(src),) if pte is None else (str(pte), str(src))
    with open_named_data(*files) as named:
        for key in named:
            old = bytes(named.get_data(key))
            new = (np.frombuffer(old, dtype=np.float32) * 2).tobytes()
            at = data.find(old)
            assert at >= 0 and data.find(old, at + 1) < 0, key
            data[at : at + len(old)] = new
    dst.write_bytes(bytes(data))
