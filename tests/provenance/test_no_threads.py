"""Where a helper thread cannot start (out of memory: ``RuntimeError: can't start new
thread``, a process under ``ulimit -v``), its work runs in the calling thread
(``ptestore._background.started``): the source described and the outputs digested when
their results are asked for, a :class:`~ptestore._background.Worker`'s calls in
``submit``, the chunks hashed by the threads that started and the caller. The record is
the same as with threads; nothing raises a bare ``RuntimeError``."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.large import inflate

import ptestore
from ptestore._background import Background, Worker
from ptestore.backends import BackendData, BackendInterface
from ptestore.provenance import ProvenanceRequest, read_provenance
from ptestore.provenance import stamp as stamp_module
from ptestore.provenance.pieces import describe_chunks
from ptestore.storage.loaders import open_loader

MiB = 1 << 20
CREATED = "2026-01-02T03:04:05Z"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32 MiB program: a chunk digest in a worker, chunks hashed a core each."""
    from support.fixtures import get_fixture

    out = tmp_path_factory.mktemp("no-threads") / "m.pte"
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    inflate(fx.pte_path, out, 8 * MiB)
    return out


class Reverse(BackendInterface):
    """Replaces the program's first named weight by its bytes reversed (same size)."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named.keys())[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))


def _refuse_threads(monkeypatch: pytest.MonkeyPatch, after: int = 0) -> list[str]:
    """ptestore's threads fail to start as out of memory makes them fail (the first
    ``after`` start); the names refused are returned."""
    real = threading.Thread.start
    refused: list[str] = []
    started: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name.startswith("ptestore-"):
            if len(started) >= after:
                refused.append(self.name)
                raise RuntimeError("can't start new thread")
            started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return refused


def test_a_background_work_runs_when_its_result_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = _refuse_threads(monkeypatch)
    ran: list[str] = []

    def work(cancelled: threading.Event) -> int:
        ran.append(threading.current_thread().name)
        return 42

    bg = Background("ptestore-test", work)
    assert refused == ["ptestore-test"] and ran == []
    assert bg.result() == 42 and bg.result() == 42
    assert ran == [threading.current_thread().name]  # once, in the caller's thread
    cancelled = Background("ptestore-test", work)
    cancelled.cancel()  # never ran, never runs
    assert ran == [threading.current_thread().name]

    def fail(cancelled: threading.Event) -> int:
        raise ValueError("the work's own error")

    with pytest.raises(ValueError, match="the work's own error"):
        Background("ptestore-test", fail).result()


def test_a_deferred_work_asked_for_by_two_threads_runs_once_and_both_get_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller asking while another thread runs the deferred work waits for it (it got
    None: a source's description missing from the record); a cancel waits for it too."""
    _refuse_threads(monkeypatch)
    running, go_on = threading.Event(), threading.Event()
    ran: list[str] = []

    def work(cancelled: threading.Event) -> str:
        ran.append(threading.current_thread().name)
        running.set()
        assert go_on.wait(120)
        return "described"

    bg = Background("ptestore-describe-source", work)
    got: dict[str, str] = {}
    first = threading.Thread(target=lambda: got.update(first=bg.result()))
    first.start()
    second = threading.Thread(target=lambda: got.update(second=bg.result()))
    try:
        assert running.wait(120)
        assert not bg.done()
        second.start()
        # a chance for the second to ask while the work runs (it then got None at once;
        # on a slow machine it may ask later: the test still holds, it tells less)
        second.join(timeout=0.2)
    finally:
        go_on.set()
        first.join()
        if second.ident is not None:
            second.join()
    assert got == {"first": "described", "second": "described"} and len(ran) == 1
    assert bg.done()


def test_a_worker_runs_each_call_in_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = _refuse_threads(monkeypatch)
    worker = Worker("ptestore-test-worker")
    assert refused == ["ptestore-test-worker"]
    order: list[int] = []
    first = worker.submit(order.append, 1)
    second = worker.submit(lambda: 1 / 0)
    third = worker.submit(order.append, 3)
    assert order == [1, 3] and first.is_set() and second.is_set()
    assert first.result() is None and third.result() is None
    with pytest.raises(ZeroDivisionError):
        second.result()
    worker.close()


@pytest.mark.parametrize("after", [0, 1])
def test_chunks_are_hashed_by_the_threads_that_started(
    monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    import hashlib

    data = bytes(range(256)) * (MiB // 64)
    spans = [(i, [(data, i * MiB, MiB)], True) for i in range(4)]
    refused = _refuse_threads(monkeypatch, after)
    got = describe_chunks(spans, ("CRC32",), 4, None)
    assert refused == ["ptestore-chunks"]  # the first refusal: no further thread tried
    assert {i: d for i, (d, _) in got.items()} == {
        i: hashlib.sha256(data[i * MiB : (i + 1) * MiB]).digest() for i in range(4)
    }


@pytest.mark.parametrize("in_place", [False, True])
def test_a_run_without_threads_makes_the_same_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: Path, in_place: bool
) -> None:
    import shutil

    monkeypatch.setattr(stamp_module, "CONCURRENT_MIN", 0)  # the source in a thread too
    outputs = []
    for refuse in (False, True):
        src = tmp_path / "in.pte"  # the record names it: the same names each time
        shutil.copyfile(model, src)
        dst = src if in_place else tmp_path / "out.pte"
        with monkeypatch.context() as m:
            refused = _refuse_threads(m) if refuse else []
            ptestore.specialize(
                src,
                dst,
                backends=[Reverse()],
                in_place=in_place,
                provenance=ProvenanceRequest(created=CREATED),  # the same second each run
            )
        if refuse:
            assert "ptestore-describe-source" in refused
            assert "ptestore-digest-output" in refused or in_place
        outputs.append(dst.read_bytes())
        loader = open_loader(str(dst))
        assert read_provenance(loader) is not None
        loader.close()
        dst.unlink(missing_ok=True)
    assert outputs[0] == outputs[1]


_UNDER_LIMIT = r"""
import os, resource, sys, threading
import ptestore
model, cache = sys.argv[1], sys.argv[2]
ptestore.ensure(model, cache_dir=cache + "-warm", backends=["passthrough"])  # imports done
failed = []
real = threading.Thread.start
def start(self):
    try:
        real(self)
    except RuntimeError:
        failed.append(self.name)
        raise
threading.Thread.start = start  # only watched: the limit makes them fail
threading.stack_size(256 << 20)  # a thread needs more than the limit leaves
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:"))
limit = (vm << 10) + (160 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
out = ptestore.ensure(model, cache_dir=cache, backends=["passthrough"]).pte
print(sorted(set(failed)))
warm = ptestore.ensure(model, cache_dir=cache + "-warm", backends=["passthrough"]).pte
from ptestore.provenance import read_provenance
from ptestore.storage.loaders import open_loader
records = [read_provenance(open_loader(p)) for p in (out, warm)]
print(records[0].content == records[1].content)  # the same bytes before the trailer
"""


def test_a_run_under_an_address_space_limit_completes(tmp_path: Path, model: Path) -> None:
    """A real limit (``RLIMIT_AS``): no thread can start; ``ensure`` completes, the same
    file as without the limit."""
    r = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(model), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    failed, same = r.stdout.splitlines()
    assert "ptestore-describe-source" in failed, failed  # 32 MiB: described meanwhile
    assert same == "True"
