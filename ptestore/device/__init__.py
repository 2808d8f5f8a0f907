"""On the device: specialize once, automatically (:func:`ensure`), and manage the cache
(:func:`list_entries`, :func:`prune`, :func:`clear`). See docs/device.md."""

from __future__ import annotations

from .cache import CacheEntry, clear, evict, list_entries, prune
from .ensuring import Artifact, ensure
from .inplace import recover, specialize_in_place

__all__ = [
    "Artifact",
    "CacheEntry",
    "clear",
    "ensure",
    "evict",
    "list_entries",
    "prune",
    "recover",
    "specialize_in_place",
]
