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
    NotSupported,
    ObjectNotFound,
    PreconditionFailed,
    PteStoreError,
    PublishUncertain,
    StorageError,
    WriterStateError,
)
from .loaders import DataLoader, open_loader
from .verification import VerifyReport, verify
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
    "NotSupported",
    "ObjectNotFound",
    "PreconditionFailed",
    "PteStoreError",
    "PublishUncertain",
    "SpecializationReport",
    "StorageError",
    "VerifyReport",
    "WriterStateError",
    "__version__",
    "initialize_and_save_backend_data",
    "open_loader",
    "open_writer",
    "specialize",
    "verify",
]
