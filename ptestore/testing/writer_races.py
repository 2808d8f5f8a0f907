"""The writer contract's hooks and its race tests (forced interleavings and threads),
and the compare-and-swap tests of ``publish(mode="if-match")``.

See :mod:`ptestore.testing.writer_contract`: :class:`WriterContract` inherits these.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from ..errors import AlreadyExists, ConfigurationError, PreconditionFailed
from ..writers.base import DataWriter, PublishResult, Versioned, WriterGuarantees, WriterState

__all__ = ["WriterCompareAndSwap", "WriterHooks", "WriterRaces", "pattern"]

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
    #: Increments each racer makes in the read-modify-write race (``racers`` of them).
    increments: ClassVar[int] = 5
    #: Attempts one increment may take before the race test fails (a bound, not a wait).
    increment_attempts: ClassVar[int] = 400
    #: Whether the writer's version tokens are derived from the bytes (equal bytes, one
    #: token: local files, memory, S3's ETag), so that an ``if-match`` on a token read
    #: before an identical republish still succeeds; False for a store whose versions
    #: are generation numbers (a republish is a new version, the old token conflicts).
    content_versions: ClassVar[bool] = True

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

    def read_versioned(self, dest: str) -> Versioned:
        """The object's bytes and version token through ptestore
        (:func:`~ptestore.writers.versions.read_versioned`; override to pass the
        storage options the writers get)."""
        from ..writers.versions import read_versioned

        return read_versioned(dest)

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


def _conflict_text(url: str, expected: str, found: str | None) -> str:
    now = f"found version {found}" if found is not None else "found no object there"
    return (
        f"{url}: publish(mode='if-match') expected version {expected}, {now}; nothing was "
        "published (read it again, redo the change and retry)"
    )


class WriterCompareAndSwap(WriterHooks):
    """``publish(mode="if-match", expected=V)``: replaces version ``V`` only; conflicts
    are one :class:`~ptestore.errors.PreconditionFailed` naming both versions; N racers
    x K read-modify-write increments lose no update."""

    def _needs_cas(self, dest: str) -> None:
        if not self.guarantees(dest).conditional_update:
            pytest.skip("this writer offers no compare-and-swap (mode='if-match')")

    def test_if_match_refused_where_not_offered(self, dest: str) -> None:
        if self.guarantees(dest).conditional_update:
            pytest.skip("this writer offers compare-and-swap")
        w = self.make_writer(dest)
        w.write(b"x", 0)
        with pytest.raises(ConfigurationError, match=r"cannot publish conditionally"):
            w.publish("if-match", expected="v1")
        assert w.state is WriterState.OPEN  # a bad argument: nothing changed
        w.discard()

    def test_if_match_needs_a_token(self, dest: str) -> None:
        self._needs_cas(dest)
        w = self.make_writer(dest)
        w.write(b"x", 0)
        with pytest.raises(ConfigurationError) as info:
            w.publish("if-match")
        assert str(info.value) == (
            f"{w.url}: publish(mode='if-match') needs expected=<version token> (a non-empty "
            "str), got None; for 'must not exist' use mode='create'"
        )
        with pytest.raises(ConfigurationError, match=r"expected='v' is only for mode='if-match'"):
            w.publish("overwrite", expected="v")
        assert w.state is WriterState.OPEN
        w.discard()
        assert self.get(dest) is None

    def test_if_match_replaces_the_version_read(self, dest: str) -> None:
        self._needs_cas(dest)
        assert self.read_versioned(dest) == Versioned(b"", None)
        self.put(dest, b"old")
        read = self.read_versioned(dest)
        assert read.data == b"old" and read.version and read.mode == "if-match"
        w = self.make_writer(dest)
        w.write(b"new", 0)
        assert w.publish("if-match", expected=read.version).size == 3
        assert self.get(dest) == b"new"
        assert self.read_versioned(dest).version not in (None, read.version)
        assert self.leftovers(dest) == []

    def _conflict(self, dest: str, size: int) -> None:
        self._needs_cas(dest)
        self.put(dest, b"old")
        read = self.read_versioned(dest)
        self.put(dest, b"changed by another writer")
        found = self.read_versioned(dest).version
        assert read.version is not None and found is not None and found != read.version
        w = self.make_writer(dest)
        w.write(pattern(size, 21), 0)
        with pytest.raises(PreconditionFailed) as info:
            w.publish("if-match", expected=read.version)
        assert str(info.value) == _conflict_text(w.url, read.version, found)
        assert (info.value.url, info.value.expected, info.value.found) == (
            w.url,
            read.version,
            found,
        )
        assert w.state is WriterState.DISCARDED
        assert self.get(dest) == b"changed by another writer"
        assert self.leftovers(dest) == []

    def test_if_match_conflict_names_both_versions(self, dest: str) -> None:
        self._conflict(dest, 1000)

    def test_if_match_conflict_staged(self, dest: str) -> None:
        """The same with an output staged in storage (S3: a multipart upload, the
        condition on CompleteMultipartUpload)."""
        self._conflict(dest, self.staged_size)

    def test_if_match_on_a_missing_object(self, dest: str) -> None:
        """A token of an object that is gone (or never was here) matches nothing: the
        publish is refused, found is None, and nothing is created."""
        self._needs_cas(dest)
        other = self.new_dest()
        self.put(other, b"elsewhere")
        token = self.read_versioned(other).version
        assert token is not None
        w = self.make_writer(dest)
        w.write(b"new", 0)
        with pytest.raises(PreconditionFailed) as info:
            w.publish("if-match", expected=token)
        assert str(info.value) == _conflict_text(w.url, token, None)
        assert info.value.found is None
        assert self.get(dest) is None
        assert self.leftovers(dest) == []

    def test_if_match_after_an_identical_republish(self, dest: str) -> None:
        """The same bytes published again: with content tokens (:attr:`content_versions`)
        it is the same version, and an ``if-match`` on the token read before succeeds;
        otherwise it is a new version, and that ``if-match`` is refused."""
        self._needs_cas(dest)
        self.put(dest, b"same")
        read = self.read_versioned(dest)
        again = self.make_writer(dest)
        again.write(b"same", 0)
        again.publish()
        assert self.get(dest) == b"same"
        w = self.make_writer(dest)
        w.write(b"next", 0)
        if self.content_versions:
            assert self.read_versioned(dest).version == read.version
            w.publish("if-match", expected=read.version)
            assert self.get(dest) == b"next"
        else:
            assert self.read_versioned(dest).version != read.version
            with pytest.raises(PreconditionFailed):
                w.publish("if-match", expected=read.version)
            assert self.get(dest) == b"same"
        assert self.leftovers(dest) == []

    def test_if_match_forced_interleaving(self, dest: str) -> None:
        """A and B read the same version; A pauses at its commit point while B publishes
        on that version; A must then be refused (a check made before the commit point,
        followed by a blind replace, loses B's update here every time)."""
        self._needs_cas(dest)
        self.put(dest, b"0")
        read = self.read_versioned(dest)
        assert read.version is not None
        a, b = self.make_writer(dest), self.make_writer(dest)
        a.write(b"1 from a", 0)
        b.write(b"1 from b", 0)
        paused: list[bool] = []

        def let_b_win(_: DataWriter) -> None:
            paused.append(True)
            b.publish("if-match", expected=read.version)

        a.commit_hook = let_b_win
        with pytest.raises(PreconditionFailed, match=re.escape(f"expected version {read.version}")):
            a.publish("if-match", expected=read.version)
        assert paused == [True]
        assert self.get(dest) == b"1 from b"
        assert a.state is WriterState.DISCARDED and b.state is WriterState.PUBLISHED
        assert self.leftovers(dest) == []

    def test_read_modify_write_race_loses_no_update(self, dest: str) -> None:
        """``racers`` threads x ``increments`` increments of a counter object, each a
        read, +1 and an if-match publish retried on every conflict: the final count is
        the number of increments (no lost update), each racer's attempts bounded."""
        self._needs_cas(dest)
        racers, k = self.racers, self.increments
        barrier = threading.Barrier(racers)
        errors: list[BaseException] = []
        conflicts = [0] * racers

        def increment(i: int) -> None:
            for _ in range(self.increment_attempts):
                read = self.read_versioned(dest)
                w = self.make_writer(dest)
                w.write(str(int(read.data or b"0") + 1).encode(), 0)
                try:
                    w.publish(read.mode, expected=read.version)
                    return
                except (PreconditionFailed, AlreadyExists):
                    conflicts[i] += 1
            raise AssertionError(f"racer {i}: no increment in {self.increment_attempts} tries")

        def run(i: int) -> None:
            try:
                barrier.wait()
                for _ in range(k):
                    increment(i)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert self.get(dest) == str(racers * k).encode()
        assert self.leftovers(dest) == []
