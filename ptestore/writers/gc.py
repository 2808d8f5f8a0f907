"""Deprecated import path of gc: use :mod:`ptestore.gc` (gc is not a writer).

``from ptestore.writers.gc import X`` still works for every name it always offered, with
a :class:`DeprecationWarning` naming the new path; nothing inside ptestore imports it
(``tests/ci/test_house_imports.py`` checks that).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..gc import DEFAULT_OLDER_THAN, GcEntry, collect_local, collect_s3, collect_stale

#: The names this path offered, all of them in :mod:`ptestore.gc`.
__all__ = ["DEFAULT_OLDER_THAN", "GcEntry", "collect_local", "collect_s3", "collect_stale"]

NEW_HOME = "ptestore.gc"


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"ptestore.writers.gc is deprecated: import {name} from {NEW_HOME}",
        DeprecationWarning,
        stacklevel=2,
    )
    from .. import gc  # upward, on purpose: only a user of this old path runs it

    return getattr(gc, name)
