"""The installed version of ptestore, in a module of its own.

Imported on first use (by ``ptestore.__version__``, the provenance stamp and
``ptestore --version``), never by the package root at import time: reading the
distribution's metadata costs milliseconds that ``import ptestore`` does not spend.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]


def _version() -> str:
    try:
        return version("ptestore")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


__version__ = _version()
