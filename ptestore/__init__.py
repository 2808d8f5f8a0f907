"""ptestore: one-time, per-device specialization of ExecuTorch models, published atomically.

``import ptestore`` loads only :mod:`ptestore.errors`; every other public name (the
coordinator, loaders and writers, which need fsspec and numpy) is imported on first use
through the module ``__getattr__`` (PEP 562). ``from ptestore import specialize`` and
``ptestore.specialize`` work as for any attribute.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    AlreadyExists,
    AlreadySpecialized,
    BackendError,
    ConfigurationError,
    FormatError,
    IntegrityError,
    InvalidReplacement,
    LockTimeout,
    MissingNamedData,
    ModelRetired,
    NothingSpecialized,
    NotSupported,
    ObjectNotFound,
    PackedWeightsRefused,
    PartialPublish,
    PermissionDenied,
    PreconditionFailed,
    PteStoreError,
    PublishUncertain,
    StorageError,
    WriterStateError,
)

if TYPE_CHECKING:
    from .coordinator import (
        Event,
        SpecializationReport,
        initialize_and_save_backend_data,
        specialize,
        specialize_pair,
    )
    from .device import Artifact, ensure
    from .fleet.fetch import FetchResult, fetch
    from .fleet.select import Choice, select
    from .inspection import describe
    from .journal import recover
    from .storage.loaders import DataLoader, open_loader
    from .verification import VerifyReport, verify
    from .writers import DataWriter, open_writer

    __version__: str

__all__ = [
    "AlreadyExists",
    "AlreadySpecialized",
    "Artifact",
    "BackendError",
    "Choice",
    "ConfigurationError",
    "DataLoader",
    "DataWriter",
    "Event",
    "FetchResult",
    "FormatError",
    "IntegrityError",
    "InvalidReplacement",
    "LockTimeout",
    "MissingNamedData",
    "ModelRetired",
    "NothingSpecialized",
    "NotSupported",
    "ObjectNotFound",
    "PackedWeightsRefused",
    "PartialPublish",
    "PermissionDenied",
    "PreconditionFailed",
    "PteStoreError",
    "PublishUncertain",
    "SpecializationReport",
    "StorageError",
    "VerifyReport",
    "WriterStateError",
    "__version__",
    "describe",
    "ensure",
    "initialize_and_save_backend_data",
    "open_loader",
    "open_writer",
    "recover",
    "select",
    "fetch",
    "specialize",
    "specialize_pair",
    "verify",
]

#: Public names imported on first use, and the module each comes from.
_LAZY = {
    "Event": ".coordinator",
    "SpecializationReport": ".coordinator",
    "initialize_and_save_backend_data": ".coordinator",
    "specialize": ".coordinator",
    "specialize_pair": ".coordinator",
    "describe": ".inspection",
    "Artifact": ".device",
    "ensure": ".device",
    "recover": ".journal",
    "DataLoader": ".storage.loaders",
    "open_loader": ".storage.loaders",
    "DataWriter": ".writers",
    "open_writer": ".writers",
    "VerifyReport": ".verification",
    "verify": ".verification",
    "select": ".fleet.select",
    "Choice": ".fleet.select",
    "fetch": ".fleet.fetch",
    "FetchResult": ".fleet.fetch",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from ._version import __version__

        value: Any = __version__
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
