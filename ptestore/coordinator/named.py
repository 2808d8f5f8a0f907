"""The model-wide named data map, built from the files of one run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from ..format.model import Container, TensorLayout
from ..format.reader import ParsedFile
from ..loaders import DataLoader
from ..writers.base import DataWriter
from .spool import Buffer

__all__ = ["MergedNamedDataMap", "SourceFile"]


@dataclass
class SourceFile:
    """One container of the run: where it is read from, parsed, and where it goes."""

    role: Literal["pte", "ptd"]
    loader: DataLoader
    writer: DataWriter
    parsed: ParsedFile

    @property
    def container(self) -> Container:
        return self.parsed.container


class MergedNamedDataMap:
    """The model-wide named data map; .ptd entries win, as in the runtime."""

    def __init__(self, files: Sequence[SourceFile]) -> None:
        self._entries: dict[str, tuple[SourceFile, int, TensorLayout | None]] = {}
        # The runtime merges (first = .ptd, second = .pte) and the .ptd wins.
        for f in sorted(files, key=lambda f: 0 if f.role == "ptd" else 1):
            for e in f.container.named_data:
                self._entries.setdefault(e.key, (f, e.segment_index, e.tensor_layout))

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def where(self, key: str) -> tuple[SourceFile, int, TensorLayout | None]:
        """The file, segment index and layout the runtime would read ``key`` from."""
        return self._entries[key]

    def get_data(self, key: str) -> Buffer:
        if key not in self._entries:
            raise KeyError(key)
        f, index, _ = self._entries[key]
        seg = f.container.segments[index]
        return f.loader.load(f.container.absolute(seg), seg.size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        if key not in self._entries:
            raise KeyError(key)
        return self._entries[key][2]
