"""Backend API and registry.

Implement :class:`BackendInterface`, register it (``register_backend``, the entry-point
group ``ptestore.backends``, or name it by import path ``package.module:attr``), and
ptestore calls it once per model with a :class:`BackendDataInitContext` and a
:class:`BackendDataWriter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ..errors import NotSupported
    from ..format.tensorinfo import QuantParams, TensorInfo
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


#: Every public name imported on first use (PEP 562): importing the package takes none
#: of its submodules' import locks, so two threads' first imports of the package and of
#: one of its submodules cannot deadlock (:mod:`ptestore._lazy`). The tensor
#: descriptions are the backend API's own re-export of the format package's.
_LAZY = {
    "NotSupported": "..errors",
    **dict.fromkeys(
        (
            "BackendData",
            "BackendDataInitContext",
            "BackendDataWriter",
            "BackendInterface",
            "DelegateInput",
            "NamedDataMap",
            "QuantParams",
            "TensorInfo",
        ),
        "api",
    ),
    "Compatibility": "compat",
    "DeviceProfile": "compat",
    **dict.fromkeys(
        (
            "ENTRY_POINT_GROUP",
            "InstalledBackend",
            "installed_backends",
            "load_backend",
            "register_backend",
            "registered_backends",
            "unregister_backend",
        ),
        "registry",
    ),
}

__getattr__ = lazy_names(__name__, _LAZY)
