"""Names a package imports on first use (PEP 562): one ``__getattr__`` for every
package whose public names live in submodules it should not import up front (start-up
is measured on devices)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name of ``homes`` imported from
    its submodule (``{name: submodule}``; a name starting with a dot is relative to the
    package, ``"..journal"``) when first asked for, then kept in the package's
    namespace; any other name an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib
        import sys

        module = home if home.startswith(".") else f"{package}.{home}"
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
