"""The named data map as one backend's session hands it out: every use checks that the
backend's call has not returned, and the bytes it reads are counted in its report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from .named import read_chunks

if TYPE_CHECKING:
    import numpy as np

    from ..format.model import TensorLayout
    from ..format.tensorinfo import TensorInfo
    from .report import BackendReport
    from .run import Run
    from .spool import Buffer

__all__ = ["MapOwner", "SessionNamedMap"]


class MapOwner(Protocol):
    """What the map needs of its session (:class:`~.session.Session`)."""

    run: Run
    report: BackendReport
    last_key: str | None

    def check_open(self, what: str, *, write: bool = False) -> None: ...


class SessionNamedMap:
    """The merged map as one backend sees it (counts the bytes it reads)."""

    def __init__(self, session: MapOwner) -> None:
        self._session = session
        self._map = session.run.named

    def keys(self) -> list[str]:
        self._session.check_open("named_data_map.keys")
        return self._map.keys()

    def __iter__(self) -> Iterator[str]:
        self._session.check_open("iterating the named data map")
        return iter(self._map.keys())

    def __contains__(self, key: object) -> bool:
        self._session.check_open("'in' on the named data map")
        return key in self._map

    def __len__(self) -> int:
        self._session.check_open("len() of the named data map")
        return len(self._map)

    def get_data(self, key: str) -> Buffer:
        self._session.check_open("named_data_map.get_data")
        self._session.last_key = key
        data = self._map.get_data(key)
        self._session.report.bytes_in += len(data)
        return data

    def get_data_size(self, key: str) -> int:
        self._session.check_open("named_data_map.get_data_size")
        return self._map.stored_size(key)

    def read_into(self, key: str, buffer: object, offset: int = 0) -> int:
        self._session.check_open("named_data_map.read_into")
        self._session.last_key = key
        n = self._map.read_into(key, buffer, offset)
        self._session.report.bytes_in += n
        return n

    def read_chunks(self, key: str, chunk_size: int) -> Iterator[memoryview]:
        # Every piece is read through read_into: a generator resumed after the call
        # returned raises there, and the bytes are counted as they are read.
        self._session.check_open("named_data_map.read_chunks")
        self._session.last_key = key
        return read_chunks(self.read_into, key, self._map.stored_size(key), chunk_size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        self._session.check_open("named_data_map.get_tensor_layout")
        return self._map.get_tensor_layout(key)

    def get_tensor_info(self, key: str) -> TensorInfo | None:
        self._session.check_open("named_data_map.get_tensor_info")
        self._session.last_key = key
        return self._map.get_tensor_info(key)

    def get_array(self, key: str) -> np.ndarray:
        self._session.last_key = key
        f, _, _ = self._map.where(key)
        data = self.get_data(key)
        from ..format.tensorinfo import array_view

        return array_view(data, self._map.get_tensor_info(key), key, f.container.source)

    def get_shared_keys(self, key: str) -> tuple[str, ...]:
        self._session.check_open("named_data_map.get_shared_keys")
        return self._map.get_shared_keys(key)
