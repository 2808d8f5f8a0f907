"""Read a model's named data outside a backend call: :func:`open_named_data`.

What a backend sees through ``context.get_named_data_map()`` during a run, for a file on
any storage, read-only: keys, bytes, tensor layouts, tensor info (dtype, shape, byte size,
quantization), numpy views and the keys that share stored bytes. For writing a backend
(to see what a model holds) and for checking what it produced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from ..coordinator.named import MergedNamedDataMap, SourceFile
from ..errors import ConfigurationError
from ..format.model import TensorLayout
from ..format.reader import read_container
from ..provenance.trailer import without_trailer
from ..storage.loaders import open_loader
from ..writers.base import DataWriter

if TYPE_CHECKING:
    import numpy as np

    from ..format.tensorinfo import TensorInfo
    from ..storage.types import DataLoader

__all__ = ["NamedData", "open_named_data"]

Buffer = bytes | bytearray | memoryview


class NamedData:
    """The merged, read-only named data map of a ``.pte`` (and its ``.ptd``), as the
    ExecuTorch runtime merges them (``.ptd`` entries win). It follows the
    :class:`~ptestore.backends.NamedDataMap` protocol. Close it (or use ``with``) when
    done; views returned by :meth:`get_data` and :meth:`get_array` stay valid after."""

    def __init__(self, loaders: list[DataLoader]) -> None:
        self._loaders = loaders
        files: list[SourceFile] = []
        for role, loader in zip(("pte", "ptd"), loaders, strict=False):
            hidden = without_trailer(loader)
            parsed = read_container(hidden)
            if parsed.container.kind != role:
                raise ConfigurationError(
                    f"{loader.name}: expected a .{role}, found a .{parsed.container.kind}"
                )
            # A read-only map needs no writer; nothing here writes.
            files.append(SourceFile(role, hidden, cast(DataWriter, None), parsed))
        self._map = MergedNamedDataMap(files)

    def __repr__(self) -> str:
        from .._redact import redacted_url

        names = " + ".join(redacted_url(str(loader.name)) for loader in self._loaders)
        return f"<NamedData {names}: {len(self._map)} keys>"

    def keys(self) -> list[str]:
        return self._map.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._map.keys())

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    def get_data(self, key: str) -> Buffer:
        return self._map.get_data(key)

    def get_data_size(self, key: str) -> int:
        return self._map.get_data_size(key)

    def read_into(self, key: str, buffer: object, offset: int = 0) -> int:
        return self._map.read_into(key, buffer, offset)

    def read_chunks(self, key: str, chunk_size: int) -> Iterator[memoryview]:
        return self._map.read_chunks(key, chunk_size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        return self._map.get_tensor_layout(key)

    def get_tensor_info(self, key: str) -> TensorInfo | None:
        return self._map.get_tensor_info(key)

    def get_array(self, key: str) -> np.ndarray:
        return self._map.get_array(key)

    def get_shared_keys(self, key: str) -> tuple[str, ...]:
        return self._map.get_shared_keys(key)

    def file_of(self, key: str) -> str:
        """``"pte"`` or ``"ptd"``: the file the runtime reads ``key`` from."""
        return self._map.where(key)[0].role

    def close(self) -> None:
        for loader in self._loaders:
            loader.close()

    def __enter__(self) -> NamedData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_named_data(
    url: str | os.PathLike[str],
    ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> NamedData:
    """Open the named data of the ``.pte`` at ``url`` (and of its ``.ptd``) read-only.

    ``url`` and ``ptd`` are local paths or fsspec URLs; ``storage_options`` go to both
    loaders. Only metadata is read up front; values are read when asked for."""
    loaders = [open_loader(url, **storage_options)]
    try:
        if ptd is not None:
            loaders.append(open_loader(ptd, **storage_options))
        return NamedData(loaders)
    except BaseException:
        for loader in loaders:
            loader.close()
        raise
