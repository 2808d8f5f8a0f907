"""Transactional writers: staged writes at any offset, one atomic publish.

``open_writer(url, **storage_options)`` picks the writer from the URL:

============================  ==========================================
URL                           writer
============================  ==========================================
plain path, ``file://``       :class:`LocalFileWriter`
``memory://``                 :class:`MemoryWriter`
``s3://``, ``s3a://``         :class:`S3Writer` (needs ``ptestore[s3]``)
any other fsspec protocol     :class:`FsspecWriter` (weaker guarantees)
============================  ==========================================
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._options import check_options
from ..loaders import split_url
from .base import DataWriter, PublishMode, PublishResult, WriterGuarantees, WriterState
from .gc import GcEntry, collect_local, collect_s3, collect_stale
from .generic import FsspecWriter
from .local import LocalFileWriter
from .memory import MemoryWriter

if TYPE_CHECKING:
    from .s3 import S3Writer

__all__ = [
    "DataWriter",
    "FsspecWriter",
    "GcEntry",
    "LocalFileWriter",
    "MemoryWriter",
    "PublishMode",
    "PublishResult",
    "S3Writer",
    "WriterGuarantees",
    "WriterState",
    "collect_local",
    "collect_s3",
    "collect_stale",
    "open_writer",
]


def __getattr__(name: str) -> Any:
    if name == "S3Writer":  # imported lazily: s3fs is an optional dependency
        from .s3 import S3Writer

        return S3Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_writer(url: str | os.PathLike[str], **storage_options: Any) -> DataWriter:
    """Open a transactional writer for ``url`` (see the module docstring for dispatch).

    ``storage_options`` follow fsspec/s3fs conventions (``endpoint_url``, ``key``,
    ``secret``, ``client_kwargs``, ...) plus writer options documented on each class
    (``durable``, ``part_size``, ``metadata``, ``retry_attempts``, ...). Options that do
    not apply to the writer, and values of the wrong type, raise
    :class:`~ptestore.errors.ConfigurationError` before anything is opened.
    """
    protocol, path = split_url(url)
    cls: type[DataWriter]
    if protocol == "file":
        cls, target, applies_to = LocalFileWriter, path, "local files"
    elif protocol == "memory":
        cls, target, applies_to = MemoryWriter, os.fspath(url), "memory://"
    elif protocol == "s3":
        from .s3 import S3Writer

        cls, target, applies_to = S3Writer, os.fspath(url), "s3://"
    else:
        cls, target, applies_to = FsspecWriter, os.fspath(url), f"{protocol}:// (FsspecWriter)"
    check_options(target, storage_options, cls.accepted_options(target), applies_to)
    return cls(target, **storage_options)
