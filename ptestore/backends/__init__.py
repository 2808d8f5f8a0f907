"""Backend API and registry.

Implement :class:`BackendInterface`, register it (``register_backend``, the entry-point
group ``ptestore.backends``, or name it by import path ``package.module:attr``), and
ptestore calls it once per model with a :class:`BackendDataInitContext` and a
:class:`BackendDataWriter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import NotSupported
from .api import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    DelegateInput,
    NamedDataMap,
)
from .compat import Compatibility, DeviceProfile
from .registry import (
    ENTRY_POINT_GROUP,
    InstalledBackend,
    installed_backends,
    load_backend,
    register_backend,
    registered_backends,
    unregister_backend,
)

if TYPE_CHECKING:
    from ..format.tensorinfo import QuantParams, TensorInfo

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendData",
    "BackendDataInitContext",
    "BackendDataWriter",
    "BackendInterface",
    "Compatibility",
    "DelegateInput",
    "DeviceProfile",
    "InstalledBackend",
    "NamedDataMap",
    "NotSupported",
    "QuantParams",
    "TensorInfo",
    "installed_backends",
    "load_backend",
    "register_backend",
    "registered_backends",
    "unregister_backend",
]


def __getattr__(name: str) -> Any:
    # The tensor descriptions come from the format package, imported on first use.
    if name in ("QuantParams", "TensorInfo"):
        from . import api

        value = getattr(api, name)  # api's own lazy re-export
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
