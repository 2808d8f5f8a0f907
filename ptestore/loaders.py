"""Deprecated import path of the loaders: use :mod:`ptestore.storage.loaders`.

``from ptestore.loaders import X`` still works for every name it always offered, with a
:class:`DeprecationWarning` naming the new path; nothing inside ptestore imports it
(``tests/ci/test_house_imports.py`` checks that).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: The names this path offered, all of them in :mod:`ptestore.storage.loaders`.
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

NEW_HOME = "ptestore.storage.loaders"


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"ptestore.loaders is deprecated: import {name} from {NEW_HOME}",
        DeprecationWarning,
        stacklevel=2,
    )
    from .storage import loaders

    return getattr(loaders, name)
