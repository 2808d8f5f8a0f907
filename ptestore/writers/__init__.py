"""Transactional writers: staged writes at any offset, one atomic publish.

``open_writer(url, **storage_options)`` picks the writer from the URL, by the scheme
table (:mod:`ptestore.storage.schemes`, which also says what to install for a missing
one):

============================  ==========================================
URL                           writer
============================  ==========================================
plain path, ``file://``       :class:`LocalFileWriter`
``memory://``                 :class:`MemoryWriter`
``s3://``, ``s3a://``         :class:`S3Writer` (needs ``ptestore[s3]``)
any other fsspec protocol     :class:`FsspecWriter` (weaker guarantees)
============================  ==========================================

:class:`MemoryWriter` and :class:`FsspecWriter` (fsspec) and :class:`S3Writer` (s3fs)
are imported on first use, so that writing local files loads none of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ..storage.types import StorageURL
    from .base import DataWriter, PublishMode, PublishResult, WriterGuarantees, WriterState
    from .generic import FsspecWriter
    from .local import LocalFileWriter
    from .memory import MemoryWriter
    from .s3 import S3Writer

__all__ = [
    "DataWriter",
    "FsspecWriter",
    "LocalFileWriter",
    "MemoryWriter",
    "PublishMode",
    "PublishResult",
    "S3Writer",
    "WriterGuarantees",
    "WriterState",
    "open_writer",
    "writer_options",
]


#: Every public name imported on first use (PEP 562): importing the package takes none
#: of its submodules' import locks, so two threads' first imports of the package and of
#: one of its submodules cannot deadlock (:mod:`ptestore._lazy`); and fsspec (with
#: asyncio) for the generic and memory writers, s3fs (an optional dependency) for the
#: S3 one: a local run needs none of them.
_LAZY = {
    **dict.fromkeys(
        ("DataWriter", "PublishMode", "PublishResult", "WriterGuarantees", "WriterState"), "base"
    ),
    "LocalFileWriter": "local",
    "FsspecWriter": "generic",
    "MemoryWriter": "memory",
    "S3Writer": "s3",
}

__getattr__ = lazy_names(__name__, _LAZY)


def _writer_class(url: StorageURL) -> tuple[type[DataWriter], str, str]:
    """The writer class for ``url`` (the scheme table's row,
    :mod:`ptestore.storage.schemes`), the target it is constructed with, and what the
    options apply to (for messages)."""
    from ..storage.schemes import scheme_of

    row = scheme_of(url)
    cls: type[DataWriter] = row.writer_class(url)
    return cls, row.target(url), row.writer_applies_to or row.applies_to


def writer_options(url: str | os.PathLike[str] | StorageURL) -> frozenset[str]:
    """The names of the storage options :func:`open_writer` accepts for ``url``."""
    from ..storage.schemes import writer_options as names

    return names(url)


def open_writer(url: str | os.PathLike[str] | StorageURL, **storage_options: Any) -> DataWriter:
    """Open a transactional writer for ``url`` (see the module docstring for dispatch).

    Args:
        url: a local path, ``file://``, ``memory://``, ``s3://`` or any fsspec URL (or
            a :class:`~ptestore.storage.types.StorageURL`, split already).
        **storage_options: fsspec/s3fs options (``endpoint_url``, ``key``, ``secret``,
            ``client_kwargs``, ...) plus the writer options documented on each class
            (``durable``, ``part_size``, ``metadata``, ``retry_attempts``, ...).

    Returns:
        A :class:`DataWriter`: nothing is visible at ``url`` until ``publish(mode)``
        succeeds; ``discard()`` drops what was staged.

    Raises:
        ConfigurationError: an unknown protocol, options that do not apply to the writer
            (the message lists the accepted ones) or values of the wrong type, all
            before anything is opened.
        PermissionDenied: access refused.
        StorageError: the staging area cannot be created.
    """
    from ..storage._options import check_options
    from ..storage.types import StorageURL

    cls, target, applies_to = _writer_class(StorageURL.of(url))
    check_options(target, storage_options, cls.accepted_options(target), applies_to)
    return cls(target, **storage_options)
