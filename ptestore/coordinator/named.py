"""The model-wide named data map, built from the files of one run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import FormatError
from ..format.model import Container, TensorLayout
from ..format.tensorinfo import TensorInfo, array_view
from ..format.tensors import TensorIndex, describe_tensors
from ..storage.loaders import DataLoader, LocalFileLoader
from .spool import Buffer

if TYPE_CHECKING:
    import numpy as np

    from ..format.reader import ParsedFile
    from ..writers.base import DataWriter

__all__ = ["MergedNamedDataMap", "SourceFile", "read_view"]


def read_view(loader: DataLoader, offset: int, size: int) -> Buffer:
    """Bytes a backend reads: a zero-copy, read-only view of a local file's mapping,
    else what the loader returns."""
    if isinstance(loader, LocalFileLoader):
        return loader.view(offset, size)
    return loader.load(offset, size)


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
        self._files = list(files)
        self._index: TensorIndex | None = None
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
        return read_view(f.loader, f.container.absolute(seg), seg.size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        if key not in self._entries:
            raise KeyError(key)
        return self._entries[key][2]

    # -- tensor info ---------------------------------------------------------------
    def tensor_index(self) -> TensorIndex:
        """Every description of every key, read once (on first use) for the whole run."""
        if self._index is None:
            pte = next(f for f in self._files if f.role == "pte")
            ptd = next((f for f in self._files if f.role == "ptd"), None)
            self._index = describe_tensors(pte.parsed, pte.loader, ptd.parsed if ptd else None)
        return self._index

    def get_tensor_info(self, key: str) -> TensorInfo | None:
        """dtype, shape, byte size and quantization of ``key``; None when nothing in the
        files describes it."""
        if key not in self._entries:
            raise KeyError(key)
        return self.tensor_index().get(key)

    def get_array(self, key: str) -> np.ndarray:
        """The value of ``key`` as a zero-copy, read-only numpy array (see ``TensorInfo``)."""
        f, _, _ = self.where(key)
        return array_view(self.get_data(key), self.get_tensor_info(key), key, f.container.source)

    def get_shared_keys(self, key: str) -> tuple[str, ...]:
        """The other keys whose value is the same stored segment as ``key``'s (they can
        only be replaced together, with identical bytes)."""
        f, index, _ = self.where(key)
        return tuple(
            k for k, (g, i, _) in self._entries.items() if k != key and g is f and i == index
        )

    def stored_size(self, key: str) -> int:
        f, index, _ = self.where(key)
        return f.container.segments[index].size

    def describe(self, key: str) -> str:
        """``'float32 [32, 16], 2048 bytes'`` for error messages; never raises."""
        size = self.stored_size(key)
        try:
            info = self.get_tensor_info(key)
        except FormatError as exc:
            return f"{size} bytes; tensor info unavailable: {exc}"
        if info is None:
            return f"{size} bytes; no dtype or shape is recorded for this key"
        return f"{info.dtype} {list(info.shape)}, {size} bytes (from {info.source} {info.where})"
