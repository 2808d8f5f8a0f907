"""The version of ptestore, in a module of its own.

The one place it is written: ``pyproject.toml`` reads it from here when the package is
built (``[tool.setuptools.dynamic]``), so the installed distribution's metadata says the
same (a test checks). Reading it costs nothing: no :mod:`importlib.metadata` (which
imports email, zipfile and csv: tens of milliseconds at start-up), also for the version
a provenance record gives ptestore's own backends.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
