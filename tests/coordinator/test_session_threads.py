"""A backend's session and the threads a backend runs (docs/backends.md):

- a chunked write holds the session's lock per chunk, never while the backend's iterator
  makes the next one: a Ctrl-C while a worker thread pulls a chunk iterator ends the run
  at once (it waited for the iterator's whole run, for ever if it never ended), and the
  write in flight fails at its next chunk;
- a submission made from inside a chunk iterator (re-entrant) is refused, naming the
  backend and the key (it was the internal "spool not contiguous");
- another thread's submission during a chunked write waits for it and is kept;
- a submission from another thread once the call returned is refused, also while the
  provenance still reads the context (``compatibility_info``): it was committed;
- a chunk iterator that never stops (empty chunks for ever: the classic EOF bug) is
  refused after ``MAX_EMPTY_CHUNKS`` of them in a row, naming backend and key (the run
  hung at 100% CPU); a few empty chunks (a trailing one) are accepted.

Every wait is on an event; the 120 s ceilings are only for a hang.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.coordinator import Event
from ptestore.coordinator.session import MAX_EMPTY_CHUNKS
from ptestore.errors import InvalidReplacement, WriterStateError
from ptestore.format import parse

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
KEYS = [e["key"] for e in MLP.facts["pte"]["named_data"]]
KEY_SEGMENT = {e["key"]: e["segment_index"] for e in MLP.facts["pte"]["named_data"]}
CEILING = 120  # seconds: only for a hang


class Calls(BackendInterface):
    """Serves XnnpackBackend: ``initialize_backend_data`` runs ``action(context, output)``,
    ``compatibility_info`` runs ``info(context)`` if given."""

    name = "XnnpackBackend"

    def __init__(self, action: Any, info: Any = None) -> None:
        self.action = action
        self.info = info

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        self.action(context, output)

    def compatibility_info(self, context: Any) -> str:
        if self.info is not None:
            self.info(context)
        return "calls"


SPEC = f"{Calls.__module__}:{Calls.__qualname__}"


def dead(what: str) -> str:
    return (
        f"backend 'XnnpackBackend': {what} used after initialize_backend_data returned; the "
        "context, writer and named data map a backend gets are valid only during that call"
    )


def segment(data: bytes, key: str) -> bytes:
    c = parse(data, len(data), "x")
    s = c.segments[KEY_SEGMENT[key]]
    return data[c.segment_base_offset + s.offset :][: s.size]


def test_ctrl_c_does_not_wait_for_a_thread_pulling_chunks(src: Path, tmp_path: Path) -> None:
    """The backend's call is interrupted while its worker thread's chunk iterator is
    blocked: the run ends at once; released afterwards, the write fails at its next
    chunk with the session-closed error and nothing is published."""
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    workers: list[threading.Thread] = []

    def action(ctx: Any, out: Any) -> None:
        size = ctx.get_named_data_map().get_data_size(KEYS[0])

        def chunks() -> Iterator[bytes]:
            yield b"\1" * 4
            inside.set()
            release.wait(CEILING)  # until the run has ended (an event)
            yield b"\1" * (size - 4)

        def work() -> None:
            try:
                out.write_named_data_chunks(KEYS[0], size, chunks())
            except BaseException as exc:
                errors.append(exc)

        workers.append(threading.Thread(target=work))
        workers[0].start()
        assert inside.wait(CEILING)
        raise KeyboardInterrupt  # what a Ctrl-C does to the main thread

    dst = tmp_path / "out.pte"
    try:
        with pytest.raises(KeyboardInterrupt):
            ptestore.specialize(src, dst, backends=[Calls(action)], provenance=False)
        # The run ended while the iterator was still blocked.
        assert not release.is_set() and workers[0].is_alive()
    finally:
        release.set()
        workers[0].join(CEILING)
    assert [type(e) for e in errors] == [WriterStateError]
    assert str(errors[0]) == dead("write_named_data_chunks")
    assert not dst.exists()


def test_a_submission_from_inside_a_chunk_iterator_is_refused(src: Path, tmp_path: Path) -> None:
    caught: list[BaseException] = []

    def action(ctx: Any, out: Any) -> None:
        named = ctx.get_named_data_map()
        size = named.get_data_size(KEYS[0])

        def chunks() -> Iterator[bytes]:
            yield b"\1" * 4
            try:
                out.write_named_data(KEYS[1], BackendData(bytes(named.get_data(KEYS[1]))))
            except InvalidReplacement as exc:
                caught.append(exc)
                raise
            yield b"\1" * (size - 4)

        out.write_named_data_chunks(KEYS[0], size, chunks())

    with pytest.raises(InvalidReplacement) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[Calls(action)], provenance=False)
    assert caught == [err.value]
    assert (err.value.backend, err.value.spec, err.value.key) == ("XnnpackBackend", SPEC, KEYS[0])
    assert str(err.value) == (
        f"backend 'XnnpackBackend' ({SPEC}), key '{KEYS[0]}': write_named_data (key "
        f"'{KEYS[1]}') called while write_named_data_chunks of this key is reading its "
        "chunks (from inside its chunk iterator?): one submission at a time; submit it "
        "after write_named_data_chunks returns"
    )
    assert not (tmp_path / "o.pte").exists()


def test_another_threads_write_during_a_chunked_write_waits_and_is_kept(
    src: Path, tmp_path: Path
) -> None:
    inside, release = threading.Event(), threading.Event()
    replaced: list[str | None] = []
    sizes: dict[str, int] = {}

    def action(ctx: Any, out: Any) -> None:
        named = ctx.get_named_data_map()
        sizes.update((k, named.get_data_size(k)) for k in KEYS[:2])

        def other() -> None:  # started while the chunked write is in progress
            out.write_named_data(KEYS[1], BackendData(b"\2" * sizes[KEYS[1]]))

        def chunks() -> Iterator[bytes]:
            yield b"\1" * 4
            inside.set()
            assert release.wait(CEILING)
            yield b"\1" * (sizes[KEYS[0]] - 4)

        def starter() -> None:
            assert inside.wait(CEILING)
            t = threading.Thread(target=other)
            t.start()
            release.set()
            t.join(CEILING)

        s = threading.Thread(target=starter)
        s.start()
        out.write_named_data_chunks(KEYS[0], sizes[KEYS[0]], chunks())
        s.join(CEILING)

    def tracer(event: Event) -> None:
        if event.kind == "replacement":
            replaced.append(event.key)

    dst = tmp_path / "o.pte"
    report = ptestore.specialize(
        src, dst, backends=[Calls(action)], provenance=False, event_tracer=tracer
    )
    assert replaced == [KEYS[0], KEYS[1]]  # the other write waited for the chunked one
    assert sorted(report.backends[0].keys_replaced) == sorted(KEYS[:2])
    out = dst.read_bytes()
    assert segment(out, KEYS[0]) == b"\1" * sizes[KEYS[0]]
    assert segment(out, KEYS[1]) == b"\2" * sizes[KEYS[1]]


def test_a_write_after_the_return_is_refused_while_provenance_reads_the_context(
    src: Path, tmp_path: Path
) -> None:
    """Between the call's return and the session's end the provenance calls
    ``compatibility_info`` (the context still readable): a write another thread makes
    then is refused, not committed."""
    errors: list[BaseException] = []
    kept: dict[str, Any] = {}

    def action(ctx: Any, out: Any) -> None:
        kept["out"] = out
        out.write_named_data(
            KEYS[3], BackendData(b"\5" * ctx.get_named_data_map().get_data_size(KEYS[3]))
        )

    def info(ctx: Any) -> None:
        size = ctx.get_named_data_map().get_data_size(KEYS[1])  # reading still works

        def late() -> None:
            try:
                kept["out"].write_named_data(KEYS[1], BackendData(b"\x09" * size))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=late)
        t.start()
        t.join(CEILING)

    dst = tmp_path / "o.pte"
    report = ptestore.specialize(src, dst, backends=[Calls(action, info)], provenance=True)
    assert [str(e) for e in errors] == [dead("write_named_data")]
    assert [type(e) for e in errors] == [WriterStateError]
    assert report.backends[0].keys_replaced == [KEYS[3]]
    out, before = dst.read_bytes(), src.read_bytes()
    assert segment(out, KEYS[1]) == segment(before, KEYS[1])


PULL_CEILING = 100_000  # empty chunks the test's iterator yields before it gives up


@pytest.mark.parametrize("short", [0, 8], ids=["after-the-size", "short-source"])
def test_a_chunk_iterator_yielding_empty_chunks_for_ever_is_refused(
    src: Path, tmp_path: Path, short: int
) -> None:
    """``while True: n = f.readinto(buf); yield buf[:n]`` with no return at ``n == 0``:
    after the data (or a source ``short`` bytes shorter than declared) it yields empty
    chunks for ever. The run pulled them for ever; now it stops after MAX_EMPTY_CHUNKS
    in a row (this iterator gives up after PULL_CEILING, so the old code fails, not
    hangs)."""
    pulled: list[int] = []

    def action(ctx: Any, out: Any) -> None:
        named = ctx.get_named_data_map()
        size = named.get_data_size(KEYS[0])
        f = io.BytesIO(bytes(named.get_data(KEYS[0]))[: size - short])
        buf = bytearray(64)

        def chunks() -> Iterator[memoryview]:
            for _ in range(PULL_CEILING):  # the bug: `while True`, no stop at n == 0
                n = f.readinto(buf)
                pulled.append(n)
                yield memoryview(buf)[:n]
            raise AssertionError(f"the run pulled {PULL_CEILING} chunks")

        out.write_named_data_chunks(KEYS[0], size, chunks())

    with pytest.raises(InvalidReplacement) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[Calls(action)], provenance=False)
    size = len(segment(src.read_bytes(), KEYS[0]))
    assert (err.value.backend, err.value.key) == ("XnnpackBackend", KEYS[0])
    assert str(err.value) == (
        f"backend 'XnnpackBackend' ({SPEC}), key '{KEYS[0]}': write_named_data_chunks: "
        f"more than {MAX_EMPTY_CHUNKS} empty chunks in a row ({size - short} of the declared "
        f"{size} bytes given): a chunk iterator must stop at the end of its data (return "
        "when a read gives 0 bytes)"
    )
    # Refused at the first empty chunk past the limit: the data, then exactly that many.
    assert sum(pulled) == size - short and pulled[-MAX_EMPTY_CHUNKS - 2] > 0
    assert pulled[-MAX_EMPTY_CHUNKS - 1 :] == [0] * (MAX_EMPTY_CHUNKS + 1)
    assert not (tmp_path / "o.pte").exists()


def test_a_few_empty_chunks_are_accepted(src: Path, tmp_path: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        size = ctx.get_named_data_map().get_data_size(KEYS[0])
        empties = [b""] * MAX_EMPTY_CHUNKS
        out.write_named_data_chunks(KEYS[0], size, [*empties, b"\1" * size, *empties])

    dst = tmp_path / "o.pte"
    ptestore.specialize(src, dst, backends=[Calls(action)], provenance=False)
    assert segment(dst.read_bytes(), KEYS[0]) == b"\1" * len(segment(src.read_bytes(), KEYS[0]))
