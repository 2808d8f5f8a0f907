"""The writer contract's hooks and its race tests (forced interleavings and threads).

See :mod:`ptestore.testing.writer_contract`: :class:`WriterContract` inherits these.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from ..errors import AlreadyExists
from ..writers.base import DataWriter, PublishResult, WriterGuarantees, WriterState

__all__ = ["WriterHooks", "WriterRaces", "pattern"]

MiB = 1 << 20


def pattern(size: int, seed: int) -> bytes:
    """``size`` pseudo-random bytes, the same for the same seed."""
    return random.Random(seed).randbytes(size)


class WriterHooks:
    """The hooks and knobs of the writer contract (override in the test class)."""

    #: Size of the "large output" test (several parts for chunked writers).
    large_size: ClassVar[int] = 3 * MiB + 12345
    #: Examples of the random write-sequence model test.
    model_examples: ClassVar[int] = 25
    #: Concurrent publishers in the race tests.
    racers: ClassVar[int] = 6
    #: Size of the discarded output and of the large create refused over an existing
    #: object: big enough that the writer stages it in storage (for S3: several parts,
    #: so that a multipart upload exists and discard must abort it).
    staged_size: ClassVar[int] = 200_000
    #: Largest offset of the random write-sequence model test.
    model_span: ClassVar[int] = 40_000
    #: The model test aims writes at multiples of this (chunked writers: the part size,
    #: with ``model_span`` a few parts, so that writes straddle part boundaries).
    model_boundary: ClassVar[int] = 10_000
    #: Largest single write of the model test.
    model_write: ClassVar[int] = 3_000

    # -- hooks ------------------------------------------------------------------------

    def new_dest(self) -> str:
        raise NotImplementedError

    def make_writer(self, dest: str) -> DataWriter:
        raise NotImplementedError

    def get(self, dest: str) -> bytes | None:
        raise NotImplementedError

    def put(self, dest: str, data: bytes) -> None:
        raise NotImplementedError

    def leftovers(self, dest: str) -> list[str]:
        raise NotImplementedError

    @pytest.fixture
    def dest(self) -> str:
        return self.new_dest()

    def at_commit_operation(
        self, writer: DataWriter, action: Callable[[], None]
    ) -> contextlib.AbstractContextManager[None]:
        """While inside, run ``action`` once at the last moment before ``writer``'s commit
        operation reaches storage: after every check the writer makes, so a create made
        of "check, then plain rename or write" loses the race it is tested for.

        The default runs it from the writer's ``commit_hook`` (its commit point), which
        is enough for a writer whose checks and commit are one atomic step after it (the
        memory writer: under one lock). Override it where the commit operation can be
        intercepted (local files: the ``link``/``rename`` system call; S3: the
        ``PutObject``/``CompleteMultipartUpload`` request)."""

        @contextlib.contextmanager
        def hooked() -> Iterator[None]:
            writer.commit_hook = lambda w: action()
            try:
                yield
            finally:
                writer.commit_hook = None

        return hooked()

    def guarantees(self, dest: str) -> WriterGuarantees:
        """What the writer under test promises (read from the writer, then discarded)."""
        w = self.make_writer(dest)
        w.discard()
        assert isinstance(type(w).guarantees, WriterGuarantees), type(w)
        return type(w).guarantees


class WriterRaces(WriterHooks):
    """Races made deterministic, then real threads (run for what the writer promises)."""

    @pytest.mark.parametrize("large", [False, True], ids=["small", "staged"])
    def test_create_race_forced_interleaving(self, dest: str, large: bool) -> None:
        """Writer A makes every check it makes, then pauses right before its commit
        operation (:meth:`at_commit_operation`) while writer B publishes completely; A's
        commit must then refuse. A create made of a
        check followed by a plain write or rename fails this every time."""
        if not self.guarantees(dest).exclusive_create:
            pytest.skip("this writer's create mode is not exclusive between publishers")
        size = self.staged_size if large else 1000
        a, b = self.make_writer(dest), self.make_writer(dest)
        a.write(pattern(size, 12), 0)
        payload_b = pattern(size, 13)
        b.write(payload_b, 0)
        paused: list[bool] = []

        def let_b_win() -> None:
            paused.append(True)
            assert self.get(dest) is None
            b.publish("create")

        with (
            self.at_commit_operation(a, let_b_win),
            pytest.raises(AlreadyExists, match=r"already exists; publish\(mode='create'\)"),
        ):
            a.publish("create")
        assert paused == [True], "the writer never reached its commit operation"
        assert b.state is WriterState.PUBLISHED
        assert a.state is WriterState.DISCARDED
        assert self.get(dest) == payload_b
        assert self.leftovers(dest) == []

    def test_overwrite_forced_interleaving_last_commit_wins(self, dest: str) -> None:
        """Overwrite paused at its commit step while another overwrite completes: the
        paused one commits afterwards and its output is what remains, whole."""
        a, b = self.make_writer(dest), self.make_writer(dest)
        payload_a, payload_b = pattern(self.staged_size, 14), pattern(2000, 15)
        a.write(payload_a, 0)
        b.write(payload_b, 0)
        a.commit_hook = lambda w: (b.publish("overwrite"), None)[1]
        a.publish("overwrite")
        assert self.get(dest) == payload_a
        assert self.leftovers(dest) == []

    def _race(self, dest: str, mode: str, payloads: list[bytes]) -> list[object]:
        writers = [self.make_writer(dest) for _ in payloads]
        for w, data in zip(writers, payloads, strict=True):
            w.write(data, 0)
        barrier = threading.Barrier(len(writers))
        results: list[object] = [None] * len(writers)

        def run(i: int) -> None:
            barrier.wait()
            try:
                results[i] = writers[i].publish(mode)  # type: ignore[arg-type]
            except Exception as exc:
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def test_concurrent_create_has_one_winner(self, dest: str) -> None:
        if not self.guarantees(dest).exclusive_create:
            pytest.skip("this writer's create mode is not exclusive between publishers")
        payloads = [bytes([65 + i]) * (1000 + i) for i in range(self.racers)]
        results = self._race(dest, "create", payloads)
        winners = [i for i, r in enumerate(results) if isinstance(r, PublishResult)]
        losers = [r for r in results if not isinstance(r, PublishResult)]
        assert len(winners) == 1, results
        assert all(isinstance(r, AlreadyExists) for r in losers), losers
        assert self.get(dest) == payloads[winners[0]]
        assert self.leftovers(dest) == []

    def test_concurrent_overwrite_is_old_or_new(self, dest: str) -> None:
        if not self.guarantees(dest).atomic_publish:
            pytest.skip("this writer's overwrite is not atomic")
        old = b"0" * 5000
        self.put(dest, old)
        payloads = [bytes([65 + i]) * (3000 + 700 * i) for i in range(self.racers)]
        valid = {old, *payloads}
        seen: list[bytes | None] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                seen.append(self.get(dest))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            results = self._race(dest, "overwrite", payloads)
        finally:
            stop.set()
            reader.join()
        assert all(isinstance(r, PublishResult) for r in results), results
        assert self.get(dest) in payloads
        assert all(s in valid for s in seen), "a reader saw a partial or mixed object"
        assert self.leftovers(dest) == []
