"""On the device: specialize once, automatically (:func:`ensure`), manage the cache
(:func:`list_entries`, :func:`prune`, :func:`prune_stale`, :func:`clear`), specialize in place and
:func:`recover`. See docs/device.md.

The in-place machinery (which needs the coordinator) and the removal of entries
(:mod:`.cache`: ``clear``, ``evict``, ``prune``) are imported on first use, so that an
``ensure`` hit does not load them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ..coordinator.inplace import specialize_in_place
    from ..journal import recover
    from .cache import clear, evict, prune
    from .ensuring import Artifact, ensure
    from .layout import CacheEntry, list_entries
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


#: Every public name imported on first use (PEP 562): importing the package takes none
#: of its submodules' import locks, so two threads' first imports of the package and of
#: one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    "Artifact": "ensuring",
    "ensure": "ensuring",
    "CacheEntry": "layout",
    "list_entries": "layout",
    "clear": "cache",
    "evict": "cache",
    "prune": "cache",
    "prune_stale": "stale",
    "recover": "..journal",
    "specialize_in_place": "..coordinator.inplace",
}

__getattr__ = lazy_names(__name__, _LAZY)
