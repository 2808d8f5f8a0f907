"""ptestore: one-time, per-device specialization of ExecuTorch models, published atomically."""

from __future__ import annotations

from .coordinator import (
    Event,
    SpecializationReport,
    initialize_and_save_backend_data,
    specialize,
)
from .errors import (
    AlreadyExists,
    BackendError,
    ConfigurationError,
    FormatError,
    InvalidReplacement,
    NothingSpecialized,
    NotSupported,
    ObjectNotFound,
    PreconditionFailed,
    PteStoreError,
    PublishUncertain,
    StorageError,
    WriterStateError,
)
from .loaders import DataLoader, open_loader
from .writers import DataWriter, open_writer

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "BackendError",
    "ConfigurationError",
    "DataLoader",
    "DataWriter",
    "Event",
    "FormatError",
    "InvalidReplacement",
    "NothingSpecialized",
    "NotSupported",
    "ObjectNotFound",
    "PreconditionFailed",
    "PteStoreError",
    "PublishUncertain",
    "SpecializationReport",
    "StorageError",
    "WriterStateError",
    "__version__",
    "initialize_and_save_backend_data",
    "open_loader",
    "open_writer",
    "specialize",
]
