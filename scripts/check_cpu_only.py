"""Fail if the environment holds a CUDA build of torch or any nvidia-*/triton package.

scripts/test.sh runs this after installing the extras: the test suite needs the CPU
build of torch only, and a CUDA build drags in ~4 GB of GPU wheels. Exit status 0 when
the environment is CPU-only, 1 (with the offending packages named) otherwise.
"""

from __future__ import annotations

import importlib.metadata
import sys

GPU_PREFIXES = ("nvidia-", "nvidia_", "triton")


def problems() -> list[str]:
    found: list[str] = []
    gpu = sorted(
        {
            name
            for name in (dist.metadata["Name"] or "" for dist in importlib.metadata.distributions())
            if name.lower().startswith(GPU_PREFIXES)
        }
    )
    try:
        import torch
    except ImportError:
        found.append("torch is not installed")
    else:
        cuda = torch.version.cuda
        if cuda is not None or "+cu" in torch.__version__:
            found.append(f"torch {torch.__version__} is a CUDA build (CUDA {cuda})")
    if gpu:
        found.append("GPU packages installed: " + ", ".join(gpu))
    return found


def main() -> int:
    found = problems()
    if found:
        print(
            "scripts/check_cpu_only.py: the environment must hold the CPU build of torch "
            "only:\n  " + "\n  ".join(found) + "\nRemove .venv and rerun scripts/test.sh, "
            "which installs torch on its own first so that pip takes the CPU wheel.",
            file=sys.stderr,
        )
        return 1
    import torch

    print(f"torch {torch.__version__}, CPU only, no nvidia-*/triton packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
