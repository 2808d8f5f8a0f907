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

from ..errors import ConfigurationError
from ..loaders import split_url
from .base import DataWriter, PublishMode, PublishResult, WriterState
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
    "WriterState",
    "collect_local",
    "collect_s3",
    "collect_stale",
    "open_writer",
]

_LOCAL_OPTIONS = frozenset({"durable", "auto_mkdir"})


def __getattr__(name: str) -> Any:
    if name == "S3Writer":  # imported lazily: boto3 is an optional dependency
        from .s3 import S3Writer

        return S3Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_writer(url: str | os.PathLike[str], **storage_options: Any) -> DataWriter:
    """Open a transactional writer for ``url`` (see the module docstring for dispatch).

    ``storage_options`` follow fsspec/s3fs conventions (``endpoint_url``, ``key``,
    ``secret``, ``client_kwargs``, ...) plus writer options documented on each class
    (``durable``, ``part_size``, ``metadata``, ...). Options a writer would ignore raise
    :class:`~ptestore.errors.ConfigurationError`.
    """
    protocol, path = split_url(url)
    if protocol == "file":
        unknown = set(storage_options) - _LOCAL_OPTIONS
        if unknown:
            raise ConfigurationError(
                f"{path}: options {sorted(unknown)} do not apply to local files "
                f"(accepted: {sorted(_LOCAL_OPTIONS)})"
            )
        return LocalFileWriter(path, **storage_options)
    if protocol == "memory":
        return MemoryWriter(os.fspath(url), **storage_options)
    if protocol == "s3":
        from .s3 import S3Writer

        return S3Writer(os.fspath(url), **storage_options)
    return FsspecWriter(os.fspath(url), **storage_options)
