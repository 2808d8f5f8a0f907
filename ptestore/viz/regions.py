"""The files the layout map draws (:class:`FileMap`); their regions come from
:mod:`ptestore.format.regions` (re-exported here)."""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass, field
from ..format.regions import layout_regions, region_users

__all__ = ["FileMap", "layout_regions", "region_users"]


@dataclass
class FileMap:
    """One file drawn on the page: its name, size, regions and (for a comparison) role."""

    title: str
    url: str
    file_size: int
    regions: list[dict[str, Any]]
    role: str = ""
    notes: list[str] = field(default_factory=list)
