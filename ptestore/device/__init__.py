"""On the device: specialize once, automatically (:func:`ensure`), manage the cache
(:func:`list_entries`, :func:`prune`, :func:`prune_stale`, :func:`clear`), specialize in place and
:func:`recover`. See docs/device.md.

The in-place machinery (which needs the coordinator) and the removal of entries
(:mod:`.cache`: ``clear``, ``evict``, ``prune``) are imported on first use, so that an
``ensure`` hit does not load them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..journal import recover
from .ensuring import Artifact, ensure
from .layout import CacheEntry, list_entries

if TYPE_CHECKING:
    from ..coordinator.inplace import specialize_in_place
    from .cache import clear, evict, prune
    from .stale import prune_stale

__all__ = [
    "Artifact",
    "CacheEntry",
    "clear",
    "ensure",
    "evict",
    "list_entries",
    "prune",
    "prune_stale",
    "recover",
    "specialize_in_place",
]


def __getattr__(name: str) -> Any:
    if name in ("clear", "evict", "prune"):
        from . import cache

        found = getattr(cache, name)
        globals()[name] = found
        return found
    if name == "prune_stale":
        from .stale import prune_stale

        globals()[name] = prune_stale
        return prune_stale
    if name == "specialize_in_place":
        from ..coordinator.inplace import specialize_in_place

        globals()[name] = specialize_in_place
        return specialize_in_place
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
