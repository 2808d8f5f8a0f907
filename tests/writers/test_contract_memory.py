"""The writer contract on MemoryWriter (fsspec memory://)."""

from __future__ import annotations

import uuid
import weakref

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from ptestore.errors import PreconditionFailed, StorageError
from ptestore.testing.writer_contract import WriterContract
from ptestore.writers import DataWriter, MemoryWriter, WriterState, open_writer
from ptestore.writers.versions import read_versioned


class TestMemoryContract(WriterContract):
    large_size = 3 * (1 << 20) + 12345

    @pytest.fixture(autouse=True)
    def _made(self) -> None:
        # weak: the garbage-collection test must be able to drop its writer
        self.made: weakref.WeakSet[MemoryWriter] = weakref.WeakSet()

    def new_dest(self) -> str:
        return f"memory://contract/{uuid.uuid4().hex}/model.pte"

    def make_writer(self, dest: str) -> DataWriter:
        w = open_writer(dest)
        assert isinstance(w, MemoryWriter)
        self.made.add(w)
        return w

    def get(self, dest: str) -> bytes | None:
        path = MemoryFileSystem._strip_protocol(dest)
        obj = MemoryFileSystem.store.get(path)
        return None if obj is None else bytes(obj.getvalue())

    def put(self, dest: str, data: bytes) -> None:
        MemoryFileSystem().pipe_file(MemoryFileSystem._strip_protocol(dest), data)

    def leftovers(self, dest: str) -> list[str]:
        """The staging buffers of this test's writers for ``dest`` that still hold bytes
        (the store itself never sees staging)."""
        return [
            f"{w.url}: {w.staged_size} staged bytes"
            for w in self.made
            if w.url == dest and w.staged_size
        ]


def test_a_write_too_large_for_memory_is_a_storage_error() -> None:
    w = open_writer("memory://contract/huge.pte")
    with pytest.raises(
        StorageError,
        match=r"memory://contract/huge.pte: cannot hold 1099511627777 bytes in memory "
        r"\(write of 1 bytes at offset 1099511627776\)",
    ):
        w.write(b"x", 1 << 40)
    assert w.state is WriterState.DISCARDED


@pytest.mark.parametrize("how", ["ab", "r+b"])
def test_a_change_made_in_place_is_a_new_version(how: str) -> None:
    """fsspec's own ``open(path, "ab")`` and ``"r+b"`` change the stored ``MemoryFile``
    itself: the token is the content's, so it changes, and a stale if-match is refused
    (it would drop that change)."""
    url = f"memory://contract/{uuid.uuid4().hex}/index.json"
    path = MemoryFileSystem._strip_protocol(url)
    w = open_writer(url)
    w.write(b"v0", 0)
    w.publish()
    read = read_versioned(url)
    with MemoryFileSystem().open(path, how) as f:
        if how == "r+b":
            f.seek(1)
        f.write(b"+theirs")
    changed = read_versioned(url)
    assert changed.version not in (None, read.version)
    stale = open_writer(url)
    stale.write(read.data + b"+mine", 0)
    with pytest.raises(PreconditionFailed) as info:
        stale.publish("if-match", expected=read.version)
    assert (info.value.expected, info.value.found) == (read.version, changed.version)
    assert read_versioned(url).data == changed.data


def test_a_scheme_in_upper_case_is_the_same_object() -> None:
    """``MEMORY://x/m.pte`` is the object a loader reads at that URL, ``/x/m.pte``
    (before, the writer stored it under the literal key ``MEMORY://x/m.pte``, where no
    loader looks and ``create`` did not see an existing object)."""
    from ptestore.errors import AlreadyExists
    from ptestore.storage.loaders import open_loader

    base = f"upper/{uuid.uuid4().hex}"
    w = open_writer(f"MEMORY://{base}/m.pte")
    w.write(b"first", 0)
    w.publish("create")
    assert bytes(MemoryFileSystem.store[f"/{base}/m.pte"].getvalue()) == b"first"
    assert not any(k.startswith("MEMORY") for k in MemoryFileSystem.store)
    for url in (f"MEMORY://{base}/m.pte", f"memory://{base}/m.pte"):
        loader = open_loader(url)
        try:
            assert bytes(loader.load(0, 5)) == b"first"
        finally:
            loader.close()
    again = open_writer(f"Memory:///{base}/m.pte")
    again.write(b"second", 0)
    with pytest.raises(AlreadyExists):
        again.publish("create")
    assert read_versioned(f"MEMORY://{base}/m.pte").data == b"first"
