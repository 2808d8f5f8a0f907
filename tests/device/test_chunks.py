"""``BackendDataWriter.write_named_data_chunks``: a replacement given in pieces, each
spooled as it arrives; the declared size is enforced."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import InvalidReplacement

FX = get_fixture("mlp_xnnpack")
assert FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key


class Chunked(BackendInterface):
    """Doubles KEY reading the original in 256-byte pieces and writing each piece as it
    is made (one piece in memory at a time)."""

    name = "XnnpackBackend"

    def __init__(self, declared_extra: int = 0, piece: int = 256) -> None:
        self.declared_extra = declared_extra
        self.piece = piece

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        original = memoryview(context.get_named_data_map().get_data(KEY))

        def pieces() -> Iterator[bytes]:
            for start in range(0, original.nbytes, self.piece):
                part = np.frombuffer(original[start : start + self.piece], dtype=np.float32)
                yield (part * 2).tobytes()

        size = original.nbytes + self.declared_extra
        output.write_named_data_chunks(
            KEY, size, pieces(), allow_size_change=self.declared_extra != 0
        )


class Whole(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = np.frombuffer(context.get_named_data_map().get_data(KEY), dtype=np.float32)
        output.write_named_data(KEY, BackendData((value * 2).tobytes()))


def test_chunks_give_the_same_file_as_one_replacement(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pte", tmp_path / "b.pte"
    r = ptestore.specialize(FX.pte_path, a, backends=[Chunked()], provenance=False)
    ptestore.specialize(FX.pte_path, b, backends=[Whole()], provenance=False)
    assert a.read_bytes() == b.read_bytes()
    assert r.backends[0].keys_replaced == [KEY] and r.backends[0].bytes_out == 2048


def test_chunks_in_place(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pte", tmp_path / "b.pte"
    assert FX.pte_path is not None
    a.write_bytes(FX.pte_path.read_bytes())
    ptestore.specialize(a, a, backends=[Chunked()], in_place=True, provenance=False)
    ptestore.specialize(FX.pte_path, b, backends=[Whole()], provenance=False)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (16, "write_named_data_chunks: 2048 bytes given, 2064 declared"),
        (-16, "write_named_data_chunks: more than the declared 2032 bytes (got 2048 so far)"),
    ],
)
def test_the_declared_size_is_enforced(tmp_path: Path, extra: int, message: str) -> None:
    out = tmp_path / "out.pte"
    with pytest.raises(InvalidReplacement, match=re.escape(message)):
        ptestore.specialize(FX.pte_path, out, backends=[Chunked(declared_extra=extra)])
    assert not out.exists()
