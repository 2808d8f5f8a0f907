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
    BackendError,
    ConfigurationError,
    FormatError,
    IntegrityError,
    InvalidReplacement,
    NothingSpecialized,
    NotSupported,
    ObjectNotFound,
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
    )
    from .inspection import describe
    from .loaders import DataLoader, open_loader
    from .verification import VerifyReport, verify
    from .writers import DataWriter, open_writer

    __version__: str

__all__ = [
    "AlreadyExists",
    "BackendError",
    "ConfigurationError",
    "DataLoader",
    "DataWriter",
    "Event",
    "FormatError",
    "IntegrityError",
    "InvalidReplacement",
    "NothingSpecialized",
    "NotSupported",
    "ObjectNotFound",
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
    "initialize_and_save_backend_data",
    "open_loader",
    "open_writer",
    "select",
    "fetch",
    "specialize",
    "verify",
]

#: Public names imported on first use, and the module each comes from.
_LAZY = {
    "Event": ".coordinator",
    "SpecializationReport": ".coordinator",
    "initialize_and_save_backend_data": ".coordinator",
    "specialize": ".coordinator",
    "describe": ".inspection",
    "DataLoader": ".loaders",
    "open_loader": ".loaders",
    "DataWriter": ".writers",
    "open_writer": ".writers",
    "VerifyReport": ".verification",
    "verify": ".verification",
    "select": ".fleet.select",
    "fetch": ".fleet.fetch",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ptestore")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
