"""Backend API and registry.

Implement :class:`BackendInterface`, register it (``register_backend``, the entry-point
group ``ptestore.backends``, or name it by import path ``package.module:attr``), and
ptestore calls it once per model with a :class:`BackendDataInitContext` and a
:class:`BackendDataWriter`.
"""

from __future__ import annotations

from ..errors import NotSupported
from .api import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    DelegateInput,
    NamedDataMap,
    QuantParams,
    TensorInfo,
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
