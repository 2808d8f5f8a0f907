"""A large local source is described (its SHA-256) in a thread of its own while the run
goes on: the record is the same as when it is described first, a failure of that read
fails the run with nothing published, and a run that fails otherwise stops the thread
(``ptestore.provenance.stamp._Describing``)."""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import BackendError, StorageError
from ptestore.loaders import LocalFileLoader, open_loader
from ptestore.provenance import read_provenance
from ptestore.provenance import stamp as stamp_module

MLP = get_fixture("mlp_xnnpack")


def _model(tmp_path: Path) -> Path:
    assert MLP.pte_path is not None
    dst = tmp_path / "model.pte"
    shutil.copyfile(MLP.pte_path, dst)
    return dst


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "ptestore-describe-source"]


@pytest.fixture
def described_in_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every local source goes to a thread (the fixture is 6 KiB); the names of the
    sources described so are recorded."""
    monkeypatch.setattr(stamp_module, "CONCURRENT_MIN", 0)
    names: list[str] = []
    real = stamp_module._Describing.__init__

    def record(self: stamp_module._Describing, loader: object) -> None:
        names.append(getattr(loader, "name", "?"))
        real(self, loader)  # type: ignore[arg-type]

    monkeypatch.setattr(stamp_module._Describing, "__init__", record)
    return names


class Reverse(BackendInterface):
    """Replaces the program's first named weight by its bytes reversed (same size)."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named.keys())[0]
        data = bytes(named.get_data(key))[::-1]
        output.write_named_data(key, BackendData(data, alignment=64))


@pytest.mark.parametrize("in_place", [False, True])
def test_the_record_is_the_same_whether_described_first_or_meanwhile(
    tmp_path: Path, described_in_threads: list[str], in_place: bool
) -> None:
    src = _model(tmp_path)
    digest = "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    size = src.stat().st_size
    dst = src if in_place else tmp_path / "out.pte"
    ptestore.specialize(src, dst, backends=[Reverse()], in_place=in_place)
    assert described_in_threads == [str(src)]
    with open_loader(dst) as loader:
        record = read_provenance(loader)
    assert record is not None
    assert (record.source.sha256, record.source.size) == (digest, size)
    assert _threads() == []


def test_a_failed_read_of_the_source_fails_the_run_and_publishes_nothing(
    tmp_path: Path, described_in_threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    real = LocalFileLoader.readinto

    def failing(self: LocalFileLoader, offset: int, buffer: memoryview) -> None:
        if threading.current_thread().name == "ptestore-describe-source":
            raise StorageError(f"{self.name}: the disk failed while it was described")
        real(self, offset, buffer)

    monkeypatch.setattr(LocalFileLoader, "readinto", failing)
    with pytest.raises(StorageError, match="the disk failed while it was described"):
        ptestore.specialize(src, dst, backends=["passthrough"])
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]
    assert _threads() == []


class Failing(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: object, output: object) -> None:
        raise RuntimeError("the backend failed")


def test_a_run_that_fails_stops_the_description(
    tmp_path: Path, described_in_threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend fails while the source is still being described: the run raises the
    backend's error, and the description is cancelled and waited for."""
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    started, go_on = threading.Event(), threading.Event()
    real = LocalFileLoader.readinto

    def slow(self: LocalFileLoader, offset: int, buffer: memoryview) -> None:
        if threading.current_thread().name == "ptestore-describe-source":
            started.set()
            go_on.wait(10)  # until the run has failed and asks the thread to stop
        real(self, offset, buffer)

    cancel = stamp_module._Describing.cancel

    def cancel_and_release(self: stamp_module._Describing) -> None:
        self.cancelled.set()
        go_on.set()
        cancel(self)

    monkeypatch.setattr(LocalFileLoader, "readinto", slow)
    monkeypatch.setattr(stamp_module._Describing, "cancel", cancel_and_release)
    with pytest.raises(BackendError, match="the backend failed"):
        ptestore.specialize(src, dst, backends=[Failing()])
    assert started.is_set() and go_on.is_set()
    assert not dst.exists()
    assert _threads() == []


def test_a_small_or_remote_source_is_described_before_the_run_goes_on(tmp_path: Path) -> None:
    src = _model(tmp_path)
    assert src.stat().st_size < stamp_module.CONCURRENT_MIN
    ptestore.specialize(src, tmp_path / "out.pte", backends=["passthrough"])
    memory = "memory://describe-first/model.pte"
    with ptestore.open_writer(memory) as w:
        w.write(src.read_bytes(), 0)
        w.publish()
    ptestore.specialize(memory, tmp_path / "out2.pte", backends=["passthrough"])
    with open_loader(tmp_path / "out2.pte") as loader:
        record = read_provenance(loader)
    assert record is not None
    assert record.source.sha256 == "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
