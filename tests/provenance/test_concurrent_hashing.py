"""Hashing while the run goes on (``ptestore._background``):

- a large local source is described (its SHA-256) in a thread of its own while backends
  run (``ptestore.provenance.stamp.CONCURRENT_MIN``);
- an output whose writer keeps no object metadata (local files, memory) is digested from
  its sources and the spool while it is written.

The record is the same as when they are hashed one after the other, a failure of either
read fails the run with nothing published, and a run that fails otherwise stops them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import copy_pte

import ptestore
from ptestore._background import Background
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import BackendError, StorageError
from ptestore.provenance import read_provenance
from ptestore.provenance import stamp as stamp_module
from ptestore.storage.loaders import LocalFileLoader, open_loader


def _model(tmp_path: Path) -> Path:
    return copy_pte(tmp_path / "model.pte")


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "ptestore-describe-source"]


@pytest.fixture
def described_in_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every local source goes to a thread (the fixture is 6 KiB); the names of the
    sources described there are recorded."""
    monkeypatch.setattr(stamp_module, "CONCURRENT_MIN", 0)
    names: list[str] = []
    real = stamp_module._describe_cancellable

    def record(loader: Any, like: str | None, cancelled: threading.Event) -> Any:
        assert threading.current_thread().name == "ptestore-describe-source"
        names.append(loader.name)
        return real(loader, like, cancelled)

    monkeypatch.setattr(stamp_module, "_describe_cancellable", record)
    return names


def _release_on_cancel(monkeypatch: pytest.MonkeyPatch, go_on: threading.Event) -> None:
    """Cancelling background work also releases the test's hold on it (``go_on``)."""
    cancel = Background.cancel

    def cancel_and_release(self: Background[Any]) -> None:
        self.cancelled.set()
        go_on.set()
        cancel(self)

    monkeypatch.setattr(Background, "cancel", cancel_and_release)


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
    digest = tree(src.read_bytes())
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

    def __init__(self, after: threading.Event | None = None) -> None:
        self.after = after

    def initialize_backend_data(self, context: object, output: object) -> None:
        if self.after is not None:  # fail once the description is reading (an event)
            assert self.after.wait(120)
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
            go_on.wait(120)  # until the run has failed and asks the thread to stop (an event)
        real(self, offset, buffer)

    monkeypatch.setattr(LocalFileLoader, "readinto", slow)
    _release_on_cancel(monkeypatch, go_on)
    with pytest.raises(BackendError, match="the backend failed"):
        ptestore.specialize(src, dst, backends=[Failing(after=started)])
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
    assert record.source.sha256 == tree(src.read_bytes())


# ------------------------------------------------------------------ the output's digest
def _digest_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import ptestore.coordinator.digest as digest_module

    names: list[str] = []
    real = digest_module.planned_digest

    def record(*args: Any) -> Any:
        names.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(digest_module, "planned_digest", record)
    return names


def test_an_output_is_digested_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _digest_threads(monkeypatch)
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    ptestore.specialize(src, dst, backends=[Reverse()])
    assert names == ["ptestore-digest-output"]
    report = ptestore.verify(str(dst), source=str(src), backends=[Reverse()])
    assert report.status == "current", report
    with open_loader(dst) as loader:
        record = read_provenance(loader)
    assert record is not None and record.content is not None
    content = dst.read_bytes()[: record.content.size]
    assert record.content.sha256 == tree(content)
    assert [t.name for t in threading.enumerate() if t.name.startswith("ptestore-")] == []


def test_a_writer_that_keeps_object_metadata_gets_the_digest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 sends the object metadata (which names the content's SHA-256) with its first
    request: its digest is made before anything is written, in the run's own thread."""
    from ptestore.writers import LocalFileWriter

    seen: dict[str, str] = {}

    class Keeping(LocalFileWriter):
        def add_object_metadata(self, metadata: Any) -> bool:
            assert self.size == 0  # before the first write
            seen.update(metadata)
            return True

    assert Keeping(tmp_path / "x").keeps_object_metadata is True
    assert LocalFileWriter(tmp_path / "y").keeps_object_metadata is False
    names = _digest_threads(monkeypatch)
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    with open_loader(src) as loader:
        writer = Keeping(dst)
        ptestore.initialize_and_save_backend_data(loader, writer, backends=[Reverse()])
    assert names == [threading.main_thread().name]
    assert seen["ptestore-content-sha256"].startswith("sha256-tree:")


def test_a_failed_digest_fails_the_run_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ptestore.coordinator.digest as digest_module

    def failing(*args: Any) -> Any:
        raise StorageError("the spool could not be read for the digest")

    monkeypatch.setattr(digest_module, "planned_digest", failing)
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    with pytest.raises(StorageError, match="the spool could not be read for the digest"):
        ptestore.specialize(src, dst, backends=[Reverse()])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]


def test_a_failed_write_stops_the_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, described_in_threads: list[str]
) -> None:
    """The source's digest held in its thread while the write fails: the run's failure
    cancels it (the fixture's 6 KiB source was described in the caller's thread, so the
    hold waited out its 120 s ceiling in every run and nothing was cancelled)."""
    from ptestore.provenance.digest import ContentHasher
    from ptestore.writers import LocalFileWriter

    started, go_on = threading.Event(), threading.Event()
    real_read = ContentHasher.read

    def slow(self: ContentHasher, *args: Any) -> None:
        started.set()
        go_on.wait(120)  # until the run has failed and cancels the digest (an event)
        real_read(self, *args)

    def failing_copy(self: LocalFileWriter, *args: Any) -> None:
        assert started.wait(120)
        raise StorageError("the disk is full")

    monkeypatch.setattr(ContentHasher, "read", slow)
    monkeypatch.setattr(LocalFileWriter, "_copy_from", failing_copy)
    _release_on_cancel(monkeypatch, go_on)
    src, dst = _model(tmp_path), tmp_path / "out.pte"
    with pytest.raises(StorageError, match="the disk is full"):
        ptestore.specialize(src, dst, backends=[Reverse()])
    assert go_on.is_set() and described_in_threads == [str(src)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]
    assert [t.name for t in threading.enumerate() if t.name.startswith("ptestore-")] == []


def test_a_worker_runs_calls_in_order_and_hands_back_their_errors() -> None:
    """``Worker``: the chunk digests' second thread (``ContentHasher.update``)."""
    from ptestore._background import Worker

    seen: list[int] = []
    worker = Worker("ptestore-test-worker")
    pending = [worker.submit(seen.append, i) for i in range(50)]
    failed = worker.submit(int, "not a number")
    assert [p.result() for p in pending] == [None] * 50
    assert seen == list(range(50))
    with pytest.raises(ValueError, match="not a number"):
        failed.result()
    assert worker.submit(len, b"abc").result() == 3
    worker.close()
    assert "ptestore-test-worker" not in [t.name for t in threading.enumerate()]


def test_an_abandoned_worker_s_thread_ends() -> None:
    """A hasher dropped without its digest (its run failed) leaves no thread behind."""
    import gc

    from ptestore._background import Worker

    worker = Worker("ptestore-test-abandoned")
    thread = worker._thread
    assert worker.submit(len, b"ab").result() == 2
    del worker
    gc.collect()
    thread.join(timeout=60)
    assert not thread.is_alive()
