"""Memory: named data of local files reaches backends as zero-copy, read-only views of
a mapping; the mapping outlives close() while views exist; replacements are spooled
and copied into the output without passing through Python again."""

from __future__ import annotations

import gc
import mmap
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import StorageError
from ptestore.storage.loaders import LocalFileLoader

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
DATA = MLP.pte_path.read_bytes()


def test_view_is_a_read_only_mapping(tmp_path: Path) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    with LocalFileLoader(p) as loader:
        view = loader.view(8, 4)
        assert isinstance(view, memoryview) and view.readonly
        assert bytes(view) == DATA[8:12]
        with pytest.raises(TypeError):
            view[0] = 0  # type: ignore[index]
        assert loader.view(100, 0) == b""
        with pytest.raises(StorageError, match=re.escape("is outside the object (size 6048)")):
            loader.view(6040, 10)
    # close() with a live view neither raises nor invalidates the view.
    assert bytes(view) == DATA[8:12]
    del view
    gc.collect()


def test_view_of_a_file_that_shrank(tmp_path: Path) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)
    with LocalFileLoader(p) as loader:
        loader.view(0, 16)  # mapped
        p.write_bytes(DATA[:100])  # truncated in place by someone else
        with pytest.raises(StorageError) as info:
            loader.view(0, 1000)
        assert str(info.value) == (
            f"{p}: file shrank while reading: wanted 1000 bytes at offset 0, the file now "
            "has 100 bytes"
        )


def test_view_of_an_unmappable_file_falls_back_to_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "m.pte"
    p.write_bytes(DATA)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")  # a file system that cannot map

    monkeypatch.setattr(mmap, "mmap", refuse)
    with LocalFileLoader(p) as loader:
        data = loader.view(8, 4)
        assert isinstance(data, bytes) and data == DATA[8:12]
        assert loader.view(0, 16) == DATA[:16]


class Inspecting(BackendInterface):
    """Records the type of what it reads and replaces one key with a numpy array
    (its own buffer, no bytes() copy)."""

    def __init__(self, key: str) -> None:
        self.name = "XnnpackBackend"
        self.key = key
        self.seen: list[Any] = []
        self.blob_types: list[type] = []

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for item in context:
            self.blob_types.append(type(item.processed))
        data = context.get_named_data_map().get_data(self.key)
        self.seen.append((type(data), memoryview(data).readonly))
        doubled = np.frombuffer(data, dtype=np.float32) * 2
        output.write_named_data(self.key, BackendData(doubled))


def test_backends_read_views_and_replacements_come_from_their_buffer(tmp_path: Path) -> None:
    assert MLP.doubled is not None and MLP.doubled.key is not None and MLP.pte_path is not None
    key = MLP.doubled.key
    backend = Inspecting(key)
    dst = tmp_path / "out.pte"
    report = ptestore.specialize(MLP.pte_path, dst, backends=[backend], provenance=False)
    assert backend.seen == [(memoryview, True)]
    assert backend.blob_types and all(t is memoryview for t in backend.blob_types)
    assert report.files[0].segments_replaced == 1
    expected = tmp_path / "expected.pte"
    ptestore.specialize(MLP.pte_path, expected, backends=[_Doubling(key)], provenance=False)
    assert dst.read_bytes() == expected.read_bytes()
    # The spool lives beside the destination by default and leaves nothing behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expected.pte", "out.pte"]


class _Doubling(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, key: str) -> None:
        self.key = key

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = bytes(context.get_named_data_map().get_data(self.key))
        doubled = (np.frombuffer(value, dtype=np.float32) * 2).tobytes()
        output.write_named_data(self.key, BackendData(doubled))
