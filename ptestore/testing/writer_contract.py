"""The DataWriter contract as a reusable pytest mixin (needs ``pytest`` and ``hypothesis``).

Usage, for any writer::

    class TestMyWriter(WriterContract):
        def new_dest(self) -> str: ...            # a fresh, unused destination URL
        def make_writer(self, dest: str) -> DataWriter: ...
        def get(self, dest: str) -> bytes | None: ...   # backdoor read, None if absent
        def put(self, dest: str, data: bytes) -> None: ...  # backdoor write
        def leftovers(self, dest: str) -> list[str]: ...  # staging artefacts left behind

Writers whose guarantees include ``conditional_update`` also run the compare-and-swap
tests (:class:`~ptestore.testing.writer_races.WriterCompareAndSwap`), which read versions
through the ``read_versioned(dest)`` hook (override it to pass storage options).

The backdoor hooks must not use ptestore's writers or loaders, so that the writer's own
behaviour is what is tested. ``leftovers`` must see what a live writer has staged (its
staging file, its multipart upload, its buffer): the discard tests assert that it was
there before they assert that it is gone. The race tests run only for what the writer promises
(``type(w).guarantees``, a :class:`~ptestore.writers.WriterGuarantees`). Per-test state
(servers, buckets) goes in autouse fixtures: pytest makes a new instance per test.
"""

from __future__ import annotations

import gc
import random
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..errors import AlreadyExists, ConfigurationError, WriterStateError
from ..storage.loaders import BytesLoader
from ..writers.base import PublishResult, WriterState
from .writer_races import WriterCompareAndSwap, WriterRaces, pattern

__all__ = ["WriterContract"]


class WriterContract(WriterRaces, WriterCompareAndSwap):
    """Contract tests every :class:`~ptestore.writers.DataWriter` must pass (the hooks and
    the race tests are in :mod:`ptestore.testing.writer_races`)."""

    def test_declares_its_guarantees(self, dest: str) -> None:
        promised = self.guarantees(dest)
        assert promised.isolated, "a DataWriter stages privately until publish"
        w = self.make_writer(dest)
        w.write(b"checked", 0)
        result = w.publish()
        # a writer that promises verification reports the checksum it verified
        assert (result.checksum is not None) is promised.verified, result

    # -- writing ----------------------------------------------------------------------

    def test_invisible_until_publish(self, dest: str) -> None:
        w = self.make_writer(dest)
        w.write(b"hello world", 0)
        assert self.get(dest) is None
        result = w.publish()
        assert isinstance(result, PublishResult)
        assert result.size == 11
        assert self.get(dest) == b"hello world"
        assert w.state is WriterState.PUBLISHED
        assert self.leftovers(dest) == []

    def test_out_of_order_writes(self, dest: str) -> None:
        data = pattern(100_000, 1)
        chunks = [(o, data[o : o + 7_000]) for o in range(0, len(data), 7_000)]
        random.Random(2).shuffle(chunks)
        with self.make_writer(dest) as w:
            for off, chunk in chunks:
                w.write(chunk, off)
            assert w.size == len(data)
            w.publish()
        assert self.get(dest) == data

    def test_overlapping_writes_later_wins(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            w.write(b"a" * 100, 0)
            w.write(b"b" * 50, 25)
            w.write(memoryview(b"c" * 10), 90)
            w.write(bytearray(b"d" * 5), 20)
            w.publish()
        assert self.get(dest) == b"a" * 20 + b"d" * 5 + b"b" * 50 + b"a" * 15 + b"c" * 10

    def test_gaps_read_as_zeros(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            w.write(b"xy", 10)
            w.write(b"z", 100)
            w.publish()
        assert self.get(dest) == bytes(10) + b"xy" + bytes(88) + b"z"

    def test_empty_output(self, dest: str) -> None:
        w = self.make_writer(dest)
        assert w.publish().size == 0
        assert self.get(dest) == b""

    def test_zero_length_write_does_not_extend(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            w.write(b"ab", 0)
            w.write(b"", 1000)
            assert w.size == 2
            w.publish()
        assert self.get(dest) == b"ab"

    def test_caller_buffer_is_copied(self, dest: str) -> None:
        buf = bytearray(b"original")
        with self.make_writer(dest) as w:
            w.write(buf, 0)
            buf[:] = b"mutated!"
            w.publish()
        assert self.get(dest) == b"original"

    def test_large_output(self, dest: str) -> None:
        data = pattern(self.large_size, 3)
        step = 256 * 1024 + 11
        offsets = list(range(0, len(data), step))
        random.Random(4).shuffle(offsets)
        with self.make_writer(dest) as w:
            for off in offsets:
                w.write(data[off : off + step], off)
            w.publish()
        assert self.get(dest) == data
        assert self.leftovers(dest) == []

    def test_copy_from(self, dest: str) -> None:
        src = pattern(50_000, 5)
        loader = BytesLoader(src, name="<src>")
        with self.make_writer(dest) as w:
            w.copy_from(loader, 1000, 20_000, 0)
            w.write(b"!" * 10, 5)
            w.copy_from(loader, 0, 100, 30_000)
            w.publish()
        assert self.get(dest) == (
            src[1000:1005] + b"!" * 10 + src[1015:21000] + bytes(10_000) + src[:100]
        )

    def test_copy_from_out_of_range(self, dest: str) -> None:
        loader = BytesLoader(b"0123456789", name="<src>")
        with self.make_writer(dest) as w:
            with pytest.raises(ConfigurationError, match=r"range \[5, 15\) is outside the source"):
                w.copy_from(loader, 5, 10, 0)
            assert w.state is WriterState.OPEN  # a bad argument does not discard
            w.copy_from(loader, 5, 5, 0)
            w.publish()
        assert self.get(dest) == b"56789"

    def test_random_writes_match_model(self) -> None:
        span, most, step = self.model_span, self.model_write, self.model_boundary
        # Half the offsets sit within one write of a multiple of model_boundary.
        boundary = st.builds(
            lambda k, d: max(0, k * step + d),
            st.integers(0, span // step),
            st.integers(-most, most),
        )
        ops = st.lists(
            st.tuples(
                st.one_of(st.integers(0, span), boundary), st.binary(min_size=0, max_size=most)
            ),
            max_size=12,
        )

        @settings(
            max_examples=self.model_examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(ops)
        def check(writes: list[tuple[int, bytes]]) -> None:
            dest = self.new_dest()
            model = bytearray()
            with self.make_writer(dest) as w:
                for off, data in writes:
                    if data:
                        end = off + len(data)
                        if end > len(model):
                            model.extend(bytes(end - len(model)))
                        model[off:end] = data
                    w.write(data, off)
                w.publish()
            assert self.get(dest) == bytes(model)

        check()

    # -- publish modes ----------------------------------------------------------------

    def test_overwrite_replaces_existing(self, dest: str) -> None:
        self.put(dest, b"old content that is longer")
        with self.make_writer(dest) as w:
            w.write(b"new", 0)
            assert self.get(dest) == b"old content that is longer"
            w.publish("overwrite")
        assert self.get(dest) == b"new"

    def test_create_when_absent(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            w.write(b"first", 0)
            w.publish(mode="create")
        assert self.get(dest) == b"first"

    def test_create_refuses_existing(self, dest: str) -> None:
        self.put(dest, b"keep me")
        w = self.make_writer(dest)
        w.write(b"intruder", 0)
        with pytest.raises(AlreadyExists, match=r"already exists; publish\(mode='create'\)"):
            w.publish(mode="create")
        assert self.get(dest) == b"keep me"
        assert w.state is WriterState.DISCARDED
        assert self.leftovers(dest) == []
        with pytest.raises(WriterStateError, match=r"was discarded \(publish failed: "):
            w.write(b"x", 0)

    def test_create_refuses_existing_large(self, dest: str) -> None:
        """Create over an existing object with an output the writer stages in storage
        (S3: a multipart upload, refused at CompleteMultipartUpload)."""
        self.put(dest, b"keep me")
        w = self.make_writer(dest)
        w.write(pattern(self.staged_size, 8), 0)
        assert self.leftovers(dest) != [], "leftovers() must see what a live writer has staged"
        with pytest.raises(AlreadyExists, match=r"already exists; publish\(mode='create'\)"):
            w.publish(mode="create")
        assert self.get(dest) == b"keep me"
        assert self.leftovers(dest) == []

    def test_create_refuses_existing_empty(self, dest: str) -> None:
        self.put(dest, b"keep me")
        w = self.make_writer(dest)
        with pytest.raises(AlreadyExists):
            w.publish(mode="create")
        assert self.get(dest) == b"keep me"

    def test_bad_mode(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            with pytest.raises(
                ConfigurationError,
                match=r"publish mode must be 'overwrite', 'create' or 'if-match', got 'x'",
            ):
                w.publish("x")  # type: ignore[arg-type]
            assert w.state is WriterState.OPEN

    def test_huge_offset_is_refused_and_keeps_the_writer(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            with pytest.raises(
                ConfigurationError,
                match=r"write of 1 bytes at offset 9223372036854775808 ends at byte "
                r"9223372036854775809, beyond the largest object size 9223372036854775807",
            ):
                w.write(b"x", 2**63)
            with pytest.raises(ConfigurationError, match=r"copy_from of 3 bytes at offset"):
                w.copy_from(BytesLoader(b"abc"), 0, 3, 2**63 - 2)
            w.write(b"ok", 0)  # still open
            w.publish()
        assert self.get(dest) == b"ok"

    def test_bad_arguments(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            with pytest.raises(ConfigurationError, match="offset must be a non-negative int"):
                w.write(b"x", -1)
            with pytest.raises(ConfigurationError, match="needs a bytes-like object, got str"):
                w.write("text", 0)  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError, match="src_offset must be a non-negative"):
                w.copy_from(BytesLoader(b"abc"), -2, 1, 0)
            assert w.state is WriterState.OPEN

    # -- life cycle -------------------------------------------------------------------

    def test_write_after_publish_raises(self, dest: str) -> None:
        w = self.make_writer(dest)
        w.write(b"done", 0)
        w.publish()
        msg = "the writer was already published"
        with pytest.raises(WriterStateError, match=f"cannot write: {msg}"):
            w.write(b"more", 4)
        with pytest.raises(WriterStateError, match=f"cannot copy_from: {msg}"):
            w.copy_from(BytesLoader(b"abc"), 0, 3, 0)
        with pytest.raises(WriterStateError, match=f"cannot publish: {msg}"):
            w.publish()
        w.discard()  # a no-op after publish
        assert self.get(dest) == b"done"

    def test_discard(self, dest: str) -> None:
        w = self.make_writer(dest)
        w.write(pattern(self.staged_size, 6), 0)
        staged = self.leftovers(dest)
        assert staged != [], "leftovers() must see what a live writer has staged"
        w.discard()
        w.discard()  # idempotent
        assert w.state is WriterState.DISCARDED
        assert self.get(dest) is None
        assert self.leftovers(dest) == []
        with pytest.raises(WriterStateError, match=r"was discarded \(discard\(\) was called\)"):
            w.write(b"x", 0)
        with pytest.raises(WriterStateError, match="cannot publish"):
            w.publish()

    def test_discard_keeps_existing(self, dest: str) -> None:
        self.put(dest, b"previous")
        w = self.make_writer(dest)
        w.write(b"replacement", 0)
        w.discard()
        assert self.get(dest) == b"previous"

    def test_with_block_without_publish_discards(self, dest: str) -> None:
        with self.make_writer(dest) as w:
            w.write(pattern(self.staged_size, 9), 0)
            assert self.leftovers(dest) != []
        assert w.state is WriterState.DISCARDED
        assert self.get(dest) is None
        assert self.leftovers(dest) == []

    def test_exception_in_with_block_discards(self, dest: str) -> None:
        w = self.make_writer(dest)

        def fail() -> None:
            with w:
                w.write(pattern(self.staged_size, 10), 0)
                assert self.leftovers(dest) != []
                raise KeyError("boom")

        with pytest.raises(KeyError):
            fail()
        assert w.state is WriterState.DISCARDED
        assert self.get(dest) is None
        assert self.leftovers(dest) == []

    def test_garbage_collection_discards(self, dest: str) -> None:
        def abandon() -> None:
            w = self.make_writer(dest)
            w.write(pattern(self.staged_size, 11), 0)
            assert self.leftovers(dest) != []

        def warned(seen: list[warnings.WarningMessage]) -> bool:
            return any(
                issubclass(m.category, ResourceWarning)
                and "destroyed without publish" in str(m.message)
                for m in seen
            )

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            abandon()
            # Uploads still in flight keep the writer alive until they finish; the last
            # one then runs the finalizer in its thread.
            deadline = time.monotonic() + 30
            while not warned(seen) and time.monotonic() < deadline:
                gc.collect()
                time.sleep(0.02)
        assert warned(seen), [str(m.message) for m in seen]
        assert self.get(dest) is None
        assert self.leftovers(dest) == []

    def test_unused_writer_collects_silently(self, dest: str) -> None:
        w = self.make_writer(dest)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            del w
            gc.collect()
        assert self.leftovers(dest) == []
