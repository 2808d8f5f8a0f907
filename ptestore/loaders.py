"""The old home of the loaders, kept as an import path: see :mod:`ptestore.storage.loaders`."""

from __future__ import annotations

from .storage.loaders import (
    BytesLoader,
    DataLoader,
    FsspecLoader,
    LocalFileLoader,
    S3Source,
    loader_options,
    open_loader,
    split_url,
)

__all__ = [
    "BytesLoader",
    "DataLoader",
    "FsspecLoader",
    "LocalFileLoader",
    "S3Source",
    "loader_options",
    "open_loader",
    "split_url",
]
