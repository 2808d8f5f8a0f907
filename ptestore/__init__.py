"""ptestore: one-time, per-device specialization of ExecuTorch models, published atomically."""

from __future__ import annotations

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

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "BackendError",
    "ConfigurationError",
    "DataLoader",
    "FormatError",
    "InvalidReplacement",
    "NotSupported",
    "ObjectNotFound",
    "PreconditionFailed",
    "PteStoreError",
    "PublishUncertain",
    "StorageError",
    "WriterStateError",
    "__version__",
    "open_loader",
]
