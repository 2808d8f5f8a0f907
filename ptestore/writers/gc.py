"""The old home of gc, kept as an import path: see :mod:`ptestore.gc`."""

from __future__ import annotations

from ..gc import DEFAULT_OLDER_THAN, GcEntry, collect_local, collect_s3, collect_stale

__all__ = ["DEFAULT_OLDER_THAN", "GcEntry", "collect_local", "collect_s3", "collect_stale"]
