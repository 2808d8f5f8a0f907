"""Reading an original in pieces: ``NamedDataMap.read_into`` and ``read_chunks`` (no
mapping, one reused buffer), and the lean backends they make possible (one result array,
or pieces both ways). Memory itself is measured by ``benchmarks/bench_chunks.py``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import BackendError, ConfigurationError, WriterStateError
from ptestore.testing import open_named_data

FX = get_fixture("mlp_xnnpack")
assert FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key
EXT = get_fixture("mlp_xnnpack_ext")


def _originals(pte: Path | None, ptd: Path | None = None) -> dict[str, bytes]:
    assert pte is not None
    with open_named_data(pte, ptd) as named:
        return {k: bytes(named.get_data(k)) for k in named}


ORIGINALS = _originals(FX.pte_path)


class Reader(BackendInterface):
    """Reads every value during the run with ``read_chunks`` and ``read_into``; keeps
    what it saw, and the map, for checks after the call."""

    name = "XnnpackBackend"

    def __init__(self, chunk_sizes: tuple[int, ...]) -> None:
        self.chunk_sizes = chunk_sizes
        self.seen: dict[tuple[str, int], bytes] = {}
        self.into: dict[str, bytes] = {}
        self.named: Any = None
        self.pieces: Iterator[memoryview] | None = None

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = self.named = context.get_named_data_map()
        for key in named:
            for size in self.chunk_sizes:
                self.seen[key, size] = b"".join(bytes(p) for p in named.read_chunks(key, size))
            array = np.zeros(named.get_data_size(key), dtype=np.uint8)
            assert named.read_into(key, array) == array.size
            self.into[key] = array.tobytes()
        self.pieces = named.read_chunks(KEY, 64)
        next(self.pieces)  # resumed after the call: refused
        output.write_named_data(KEY, BackendData(bytes(ORIGINALS[KEY])))


def test_a_backend_reads_every_value_in_pieces_exactly(tmp_path: Path) -> None:
    sizes = (1, 3, 64, 1000, 2048, 4096)
    reader = Reader(sizes)
    report = ptestore.specialize(FX.pte_path, tmp_path / "out.pte", backends=[reader])
    for key, value in ORIGINALS.items():
        assert reader.into[key] == value
        for size in sizes:
            assert reader.seen[key, size] == value, (key, size)
    # every byte read is counted (each value once per chunk size and once by read_into,
    # and the one piece read before the end); get_data_size reads nothing
    total = sum(map(len, ORIGINALS.values()))
    assert report.backends[0].bytes_in == (len(sizes) + 1) * total + 64


def test_the_map_refuses_reads_after_the_call(tmp_path: Path) -> None:
    reader = Reader((256,))
    ptestore.specialize(FX.pte_path, tmp_path / "out.pte", backends=[reader])
    after = "used after initialize_backend_data returned"
    with pytest.raises(WriterStateError, match=re.escape(f"named_data_map.read_into {after}")):
        reader.named.read_into(KEY, bytearray(16))
    with pytest.raises(WriterStateError, match=re.escape(f"named_data_map.read_chunks {after}")):
        reader.named.read_chunks(KEY, 16)
    with pytest.raises(WriterStateError, match=re.escape(f"named_data_map.get_data_size {after}")):
        reader.named.get_data_size(KEY)
    assert reader.pieces is not None
    with pytest.raises(WriterStateError, match=re.escape(f"named_data_map.read_into {after}")):
        next(reader.pieces)  # a generator made during the call reads no more after it


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_size=st.integers(1, 2100), key=st.sampled_from(sorted(ORIGINALS)))
def test_read_chunks_joins_to_the_original(chunk_size: int, key: str) -> None:
    value = ORIGINALS[key]
    with open_named_data(FX.pte_path) as named:
        assert named.get_data_size(key) == len(value)
        pieces = [bytes(p) for p in named.read_chunks(key, chunk_size)]
    assert b"".join(pieces) == value
    assert all(len(p) == chunk_size for p in pieces[:-1])
    assert 0 < len(pieces[-1]) <= chunk_size
    assert len(pieces) == -(-len(value) // chunk_size)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), key=st.sampled_from(sorted(ORIGINALS)))
def test_read_into_reads_what_fits_from_the_offset(data: st.DataObject, key: str) -> None:
    value = ORIGINALS[key]
    offset = data.draw(st.integers(0, len(value)))
    room = data.draw(st.integers(0, len(value) + 8))
    buffer = bytearray(b"\xee" * room)
    with open_named_data(FX.pte_path) as named:
        n = named.read_into(key, buffer, offset)
    assert n == min(room, len(value) - offset)
    assert bytes(buffer[:n]) == value[offset : offset + n]
    assert buffer[n:] == b"\xee" * (room - n)  # nothing past what was read is touched


def test_pieces_are_read_only_views_of_one_reused_buffer() -> None:
    with open_named_data(FX.pte_path) as named:
        pieces = named.read_chunks(KEY, 512)
        first = next(pieces)
        kept = bytes(first)
        second = next(pieces)
        assert first.readonly and second.readonly
        assert kept == ORIGINALS[KEY][:512]
        assert bytes(first) == ORIGINALS[KEY][512:1024]  # overwritten by the next piece
        assert first.obj is second.obj  # one buffer for every piece


def test_reads_from_a_ptd_from_memory_and_behind_a_trailer(tmp_path: Path) -> None:
    # .ptd values (local), the same through fsspec's memory store (no readinto: load),
    # and a stamped artifact whose trailer a ContentView hides.
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    ext = _originals(EXT.pte_path, EXT.ptd_path)
    with open_named_data(EXT.pte_path, EXT.ptd_path) as named:
        for key, value in ext.items():
            assert b"".join(bytes(p) for p in named.read_chunks(key, 100)) == value
    import fsspec

    mem = fsspec.filesystem("memory")
    assert FX.pte_path is not None
    mem.pipe_file("/read-chunks/model.pte", FX.pte_path.read_bytes())
    with open_named_data("memory://read-chunks/model.pte") as named:
        for key, value in ORIGINALS.items():
            assert b"".join(bytes(p) for p in named.read_chunks(key, 100)) == value
    mem.rm("/read-chunks/model.pte")
    stamped = tmp_path / "stamped.pte"
    ptestore.specialize(FX.pte_path, stamped, backends=[LeanChunks()], provenance=True)
    with open_named_data(stamped) as named:
        assert named.get_data(KEY) is not None
        doubled = b"".join(bytes(p) for p in named.read_chunks(KEY, 300))
        buffer = bytearray(len(doubled))
        assert named.read_into(KEY, buffer) == len(doubled)
    expected = (np.frombuffer(ORIGINALS[KEY], dtype=np.float32) * 2).tobytes()
    assert doubled == bytes(buffer) == expected


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda n: n.read_chunks("nope", 8), KeyError, "'nope'"),
        (lambda n: n.get_data_size("nope"), KeyError, "'nope'"),
        (lambda n: n.read_into("nope", bytearray(8)), KeyError, "'nope'"),
        (
            lambda n: n.read_chunks(KEY, 0),
            ConfigurationError,
            f"read_chunks({KEY!r}): chunk_size 0 must be an int >= 1 (bytes)",
        ),
        (
            lambda n: n.read_chunks(KEY, True),
            ConfigurationError,
            f"read_chunks({KEY!r}): chunk_size True must be an int >= 1 (bytes)",
        ),
        (
            lambda n: n.read_chunks(KEY, 8.0),
            ConfigurationError,
            f"read_chunks({KEY!r}): chunk_size 8.0 must be an int >= 1 (bytes)",
        ),
        (
            lambda n: n.read_into(KEY, b"\0" * 8),
            ConfigurationError,
            f"read_into({KEY!r}): the buffer (bytes) is read-only; pass a writable one "
            "(bytearray, numpy.empty(...))",
        ),
        (
            lambda n: n.read_into(KEY, np.zeros((4, 4), dtype=np.uint8)[:, 0]),
            ConfigurationError,
            f"read_into({KEY!r}): the buffer must be a writable, C-contiguous bytes-like "
            "object (bytearray, memoryview, numpy array), got ndarray",
        ),
        (
            lambda n: n.read_into(KEY, "text"),
            ConfigurationError,
            f"read_into({KEY!r}): the buffer must be a writable, C-contiguous bytes-like "
            "object (bytearray, memoryview, numpy array), got str",
        ),
        (
            lambda n: n.read_into(KEY, bytearray(8), 2049),
            ConfigurationError,
            f"read_into({KEY!r}): offset 2049 must be an int in [0, 2048] (the value's size)",
        ),
        (
            lambda n: n.read_into(KEY, bytearray(8), -1),
            ConfigurationError,
            f"read_into({KEY!r}): offset -1 must be an int in [0, 2048] (the value's size)",
        ),
    ],
)
def test_bad_reads_are_refused_at_the_call(call: Any, error: type, message: str) -> None:
    with open_named_data(FX.pte_path) as named, pytest.raises(error, match=re.escape(message)):
        call(named)


def test_a_bad_read_in_a_run_fails_the_backend_naming_it(tmp_path: Path) -> None:
    class Bad(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            context.get_named_data_map().read_chunks(KEY, 0)

    out = tmp_path / "out.pte"
    with pytest.raises(BackendError, match=re.escape("chunk_size 0 must be an int >= 1")):
        ptestore.specialize(FX.pte_path, out, backends=[Bad()])
    assert not out.exists()


class LeanChunks(BackendInterface):
    """Doubles KEY with chunks both ways: pieces of the original in, one reused output
    array out (the writer is done with a piece when the generator is resumed)."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        out = np.empty(96, dtype=np.float32)

        def pieces() -> Iterator[np.ndarray]:
            for piece in named.read_chunks(KEY, out.nbytes):
                part = np.frombuffer(piece, dtype=np.float32)
                yield np.multiply(part, 2, out=out[: part.size])

        output.write_named_data_chunks(KEY, named.get_data_size(KEY), pieces())


class LeanWhole(BackendInterface):
    """Doubles KEY into one result array, the original read in pieces into one buffer."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        result = np.empty(named.get_data_size(KEY) // 4, dtype=np.float32)
        piece = np.empty(100, dtype=np.float32)
        for at in range(0, result.size, piece.size):
            n = named.read_into(KEY, piece, at * 4) // 4
            np.multiply(piece[:n], 2, out=result[at : at + n])
        output.write_named_data(KEY, BackendData(result))


class Whole(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = np.frombuffer(context.get_named_data_map().get_data(KEY), dtype=np.float32)
        output.write_named_data(KEY, BackendData(value * 2))


@pytest.mark.parametrize("lean", [LeanChunks, LeanWhole])
def test_lean_backends_give_the_file_of_the_whole_one(tmp_path: Path, lean: type) -> None:
    a, b, c = tmp_path / "a.pte", tmp_path / "b.pte", tmp_path / "c.pte"
    # The container's bytes (a provenance record would name each backend and its time).
    report = ptestore.specialize(FX.pte_path, a, backends=[lean()], provenance=False)
    ptestore.specialize(FX.pte_path, b, backends=[Whole()], provenance=False)
    assert a.read_bytes() == b.read_bytes()
    assert report.backends[0].keys_replaced == [KEY]
    assert FX.pte_path is not None
    c.write_bytes(FX.pte_path.read_bytes())
    ptestore.specialize(c, c, backends=[lean()], in_place=True, provenance=False)
    assert c.read_bytes() == b.read_bytes()


def test_local_and_trailer_hiding_loaders_read_into_a_buffer(tmp_path: Path) -> None:
    from ptestore.errors import StorageError
    from ptestore.provenance.trailer import ContentView
    from ptestore.storage.loaders import LocalFileLoader

    p = tmp_path / "data.bin"
    p.write_bytes(bytes(range(200)))
    with LocalFileLoader(p) as loader:
        buffer = bytearray(50)
        loader.readinto(100, memoryview(buffer))
        assert bytes(buffer) == bytes(range(100, 150))
        with pytest.raises(
            StorageError,
            match=re.escape(
                f"{p}: read of 50 bytes at offset 160 is outside the object (size 200)"
            ),
        ):
            loader.readinto(160, memoryview(buffer))
        view = ContentView(loader, 120)
        view.readinto(60, memoryview(buffer))
        assert bytes(buffer) == bytes(range(60, 110))
        with pytest.raises(
            StorageError,
            match=re.escape(
                f"{p}: read of 50 bytes at offset 100 is outside the container (size 120, "
                "without its provenance trailer)"
            ),
        ):
            view.readinto(100, memoryview(buffer))
        with open(p, "r+b") as f:
            f.truncate(120)
        with pytest.raises(
            StorageError,
            match=re.escape(
                f"{p}: file shrank while reading: wanted 50 bytes at offset 100, got 20"
            ),
        ):
            loader.readinto(100, memoryview(buffer))


def test_a_named_data_map_s_repr_names_its_files_and_keys() -> None:
    with open_named_data(EXT.pte_path, EXT.ptd_path) as named:
        assert repr(named) == f"<NamedData {EXT.pte_path} + {EXT.ptd_path}: {len(named)} keys>"
