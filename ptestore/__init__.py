"""ptestore: one-time, per-device specialization of ExecuTorch models, published atomically."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _installed_version

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
from .loaders import DataLoader, open_loader
from .verification import VerifyReport, verify
from .writers import DataWriter, open_writer

try:
    __version__ = _installed_version("ptestore")
except _NotInstalled:  # run from a source tree that was never installed
    __version__ = "0+unknown"

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
    "initialize_and_save_backend_data",
    "open_loader",
    "open_writer",
    "specialize",
    "verify",
]
