"""One backend's session: its delegate inputs, and every replacement validated as it
arrives (existing key, written once, power-of-two alignment, unchanged tensor layout).

Replacements are spooled immediately and become part of the run only when the
backend's call returns normally (:meth:`Session.commit`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..backends.api import BackendData, DelegateInput, NamedDataMap
from ..errors import InvalidReplacement, WriterStateError
from ..format.header import is_power_of_two
from ..format.model import Delegate
from .buffers import byte_view, declared_dtype, holds_pointers, pointers_refused
from .named import SourceFile, read_view
from .report import BackendReport, Event
from .run import Replacement, Run, SegmentKey
from .session_map import SessionNamedMap
from .spool import Buffer

# ``Run``, ``Replacement`` and ``SegmentKey`` live in :mod:`.run` (also importable here).
__all__ = ["MAX_REQUESTED_ALIGNMENT", "Replacement", "Run", "Session", "SegmentKey"]

#: The largest alignment a backend may ask for.
MAX_REQUESTED_ALIGNMENT = 1 << 20

#: Empty chunks a chunked write accepts in a row: one more is refused. A chunk iterator
#: that never stops (``while True: n = f.readinto(buf); yield buf[:n]`` without a return
#: at ``n == 0``) yields empty chunks for ever, before or after the declared size; a
#: non-empty chunk adds at least one byte of at most ``size``, so the write always ends.
MAX_EMPTY_CHUNKS = 16


class Session:
    """One backend id's view of the run (the ``BackendSession`` of the backend API)."""

    def __init__(self, run: Run, backend_id: str, report: BackendReport) -> None:
        self.run = run
        self._backend_id = backend_id
        self.report = report
        self._named = SessionNamedMap(self)
        self._inputs = self._unique_inputs()
        self._pos = 0
        self.current: tuple[str, list[Delegate]] | None = None
        self.last_key: str | None = None
        self.last_method: str | None = None
        self.pending: dict[SegmentKey, list[Replacement]] = {}
        self.keys: dict[str, None] = {}
        self.blobs: set[int] = set()
        # Held by each submission while it is checked and spooled (by a chunked write,
        # chunk by chunk: never while the backend's own iterator runs). close() takes it
        # to wait for a chunk being spooled, never for the backend's code: a writer in
        # flight fails at its next step.
        self._lock = threading.Condition(threading.RLock())
        self._closed = False
        self._writes_closed = False
        #: ``(thread id, key)`` of a chunked write in progress: its chunks must be
        #: contiguous in the spool, so other submissions wait for it to end.
        self._chunking: tuple[int, str] | None = None
        #: The first rule a submission broke (raised to the backend): the run stops at
        #: the call's end even if the backend caught it and went on.
        self.refused: InvalidReplacement | None = None

    def end_writes(self) -> None:
        """The backend's call returned: every later submission raises
        :class:`WriterStateError` (the context stays readable for the provenance's
        ``compatibility_info``, until :meth:`close`)."""
        with self._lock:  # a chunk being spooled at most: never the backend's iterator
            self._writes_closed = True
            self._lock.notify_all()

    def close(self) -> None:
        """End of the backend's call: every later use of its context, writer or named
        data map raises :class:`WriterStateError`. Not waiting for a writer in flight
        (a chunked write pulling the backend's iterator, on a thread of its own): that
        write fails at its next chunk. It waits for a chunk being spooled, at most (the
        lock is never held while the backend's code runs): once it returns, nothing of
        this session writes to the run's spool, which the run may then close."""
        with self._lock:
            self._writes_closed = self._closed = True
            self._lock.notify_all()

    def check_open(self, what: str, *, write: bool = False) -> None:
        if self._closed or (write and self._writes_closed):
            raise WriterStateError(
                f"backend {self._backend_id!r}: {what} used after initialize_backend_data "
                "returned; the context, writer and named data map a backend gets are "
                "valid only during that call"
            )

    # -- BackendSession protocol -------------------------------------------------
    @property
    def backend_id(self) -> str:
        self.check_open("context.backend_id")
        return self._backend_id

    @property
    def named_data_map(self) -> NamedDataMap:
        self.check_open("get_named_data_map")
        return self._named

    @property
    def replaced_keys(self) -> frozenset[str]:
        self.check_open("context.replaced_keys")
        return self.run.replaced_keys()

    def _unique_inputs(self) -> list[tuple[tuple[str, int], list[Delegate]]]:
        groups: dict[tuple[str, int], list[Delegate]] = {}
        for d in self.run.pte.container.delegates:
            if d.id == self._backend_id:
                groups.setdefault((d.location, d.index), []).append(d)
        return list(groups.items())

    def next_input(self) -> DelegateInput | None:
        with self._lock:
            self.check_open("next_backend_data")
            return self._next_input()

    def _next_input(self) -> DelegateInput | None:
        if self._pos >= len(self._inputs):
            self.current = None
            return None
        (location, index), delegates = self._inputs[self._pos]
        self._pos += 1
        self.current = (location, delegates)
        pte = self.run.pte
        c = pte.container
        if location == "segment":
            seg = c.segments[index]
            processed = read_view(pte.loader, c.absolute(seg), seg.size)
        else:
            pos, size = c.inline_delegate_data[index]
            processed = pte.parsed.metadata[pos : pos + size]
        first = delegates[0]
        self.last_method = first.method
        self.report.inputs_seen += 1
        self.report.bytes_in += len(processed)
        self.run.emit(
            Event("input", backend=self._backend_id, method=first.method, nbytes=len(processed))
        )
        return DelegateInput(
            backend_id=self._backend_id,
            method=first.method,
            processed=processed,
            compile_specs=first.compile_specs,
            delegates=tuple(delegates),
        )

    # -- validation --------------------------------------------------------------
    def _error(self, message: str, key: str | None = None) -> InvalidReplacement:
        error = InvalidReplacement(
            message,
            backend=self._backend_id,
            method=self.last_method,
            key=key,
            spec=self.report.implementation,
        )
        if self.refused is None:
            self.refused = error
        return error

    def _check_data(self, data: object, what: str, key: str | None) -> tuple[memoryview, int]:
        if not isinstance(data, BackendData):
            raise self._error(
                f"{what}: expected BackendData(data, alignment=None, layout=None), "
                f"got {type(data).__name__}",
                key,
            )
        view, fmt = byte_view(data.data)
        if holds_pointers(fmt):
            raise self._error(pointers_refused(what, "BackendData.data", fmt), key)
        if view is None:
            flags = getattr(data.data, "flags", None)
            if type(data.data).__module__ == "numpy" and flags is not None:
                raise self._error(
                    f"{what}: BackendData.data is a numpy array that is not C-contiguous "
                    f"(shape {list(getattr(data.data, 'shape', ()))}, a transposed or strided "
                    "view?): pass numpy.ascontiguousarray(array) (one copy) or array.tobytes()",
                    key,
                )
            raise self._error(
                f"{what}: BackendData.data must be bytes-like (bytes, bytearray, memoryview "
                f"or a C-contiguous numpy array), got {type(data.data).__name__}",
                key,
            )
        alignment = 1 if data.alignment is None else data.alignment
        if isinstance(alignment, bool) or not isinstance(alignment, int):
            # As every integer argument of the API: an int, not a bool (True is not 1)
            # nor a numpy integer.
            kind = type(alignment)
            name = kind.__qualname__
            if kind.__module__ != "builtins":
                name = f"{kind.__module__}.{name}"
            fix = (
                "pass int(alignment),"
                if hasattr(kind, "__index__") and kind is not bool
                else "give"
            )
            raise self._error(
                f"{what}: alignment {data.alignment!r} is a {name}, not an int: {fix} a power "
                f"of two in [1, {MAX_REQUESTED_ALIGNMENT}]",
                key,
            )
        if not is_power_of_two(alignment) or alignment > MAX_REQUESTED_ALIGNMENT:
            raise self._error(
                f"{what}: alignment {data.alignment!r} must be a power of two in "
                f"[1, {MAX_REQUESTED_ALIGNMENT}]",
                key,
            )
        return view, alignment

    def _spool(self, view: memoryview, alignment: int, user: str) -> Replacement:
        offset = self.run.spool.add(view)
        self.report.bytes_out += view.nbytes
        return Replacement(offset, view.nbytes, alignment, self._backend_id, user)

    def _take_turn(self, what: str, key: object) -> None:
        """Under the lock: refuse a submission after the call returned, or one made by a
        chunked write's own iterator (its chunks must be contiguous in the spool); wait
        while another thread's chunked write is in progress."""
        while True:
            self.check_open(what, write=True)
            if self._chunking is None:
                return
            owner, chunk_key = self._chunking
            if owner == threading.get_ident():
                asked = f" (key {key!r})" if isinstance(key, str) else ""
                raise self._error(
                    f"{what}{asked} called while write_named_data_chunks of this key is "
                    "reading its chunks (from inside its chunk iterator?): one submission "
                    "at a time; submit it after write_named_data_chunks returns",
                    chunk_key,
                )
            self._lock.wait()

    def replace_named(self, key: object, data: BackendData) -> None:
        with self._lock:
            self._take_turn("write_named_data", key)
            self._replace_named(key, data)

    def _replace_named(self, key: object, data: BackendData) -> None:
        key = self._check_key(key)
        view, alignment = self._check_data(data, "write_named_data", key)
        f, index = self._check_layout(key, data)
        self._check_size(key, view.nbytes, data.allow_size_change)
        fmt = memoryview(data.data).format  # a buffer: _check_data took it
        self._check_dtype(
            key, data.data, data.allow_size_change, "write_named_data: the replacement", fmt
        )
        rep = self._spool(view, alignment, f"key {key!r}")
        self.pending.setdefault((f.role, index), []).append(rep)
        self.keys[key] = None
        self.run.emit(Event("replacement", backend=self._backend_id, key=key, nbytes=view.nbytes))

    def _check_key(self, key: object) -> str:
        if not isinstance(key, str):
            raise self._error(f"named data keys are strings, got {type(key).__name__}")
        self.last_key = key
        if key not in self.run.named:
            raise self._error(
                f"unknown key: backends may only replace existing keys "
                f"({len(self.run.named)} keys in the model); no new keys",
                key,
            )
        first = self.run.written_keys.get(key) or (self._backend_id if key in self.keys else None)
        if first is not None:
            raise self._error(f"key written twice (first by backend {first!r})", key)
        return key

    def _check_layout(self, key: str, data: BackendData) -> tuple[SourceFile, int]:
        f, index, layout = self.run.named.where(key)
        if data.layout is not None and data.layout != layout:
            raise self._error(
                f"tensor layout {data.layout} differs from the key's layout {layout}: "
                "layouts cannot change (only segment offsets and sizes do)",
                key,
            )
        return f, index

    def replace_named_chunks(
        self, key: object, size: int, chunks: Iterable[Buffer], template: BackendData
    ) -> None:
        """Replace ``key`` with ``size`` bytes given in pieces, each spooled as it comes
        (``template`` carries alignment, layout and ``allow_size_change``). The lock is
        held per chunk, never while the backend's iterator makes the next one."""
        what = "write_named_data_chunks"
        with self._lock:
            self._take_turn(what, key)
            key = self._check_key(key)
            _, alignment = self._check_data(template, what, key)
            f, index = self._check_layout(key, template)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise self._error(f"{what}: size {size!r} must be an int >= 0", key)
            self._check_size(key, size, template.allow_size_change)
            start = self.run.spool.size()
            self._chunking = (threading.get_ident(), key)
        try:
            total = empty = 0
            for chunk in chunks:  # the backend's code: not under the lock
                with self._lock:
                    self.check_open(what, write=True)
                    n = self._spool_chunk(
                        key, size, chunk, total, start + total, template.allow_size_change
                    )
                    total += n
                    empty = 0 if n else empty + 1
                    if empty > MAX_EMPTY_CHUNKS:
                        raise self._error(
                            f"{what}: more than {MAX_EMPTY_CHUNKS} empty chunks in a row "
                            f"({total} of the declared {size} bytes given): a chunk "
                            "iterator must stop at the end of its data (return when a "
                            "read gives 0 bytes)",
                            key,
                        )
            with self._lock:
                self.check_open(what, write=True)
                if total != size:
                    raise self._error(f"{what}: {total} bytes given, {size} declared", key)
                self.report.bytes_out += size
                rep = Replacement(start, size, alignment, self._backend_id, f"key {key!r}")
                self.pending.setdefault((f.role, index), []).append(rep)
                self.keys[key] = None
                self.run.emit(Event("replacement", backend=self._backend_id, key=key, nbytes=size))
        finally:
            with self._lock:
                self._chunking = None
                self._lock.notify_all()

    def _spool_chunk(
        self, key: str, size: int, chunk: object, done: int, at: int, allowed: bool
    ) -> int:
        """Spool one chunk (after ``done`` bytes of ``size``) at spool offset ``at``;
        its size."""
        what = "write_named_data_chunks"
        view, fmt = byte_view(chunk)
        if holds_pointers(fmt):
            raise self._error(pointers_refused(what, "a chunk", fmt), key)
        self._check_dtype(key, chunk, allowed, f"{what}: a chunk", fmt)
        if view is None:
            raise self._error(
                f"{what}: a chunk must be bytes-like, got {type(chunk).__name__}", key
            )
        if done + view.nbytes > size:
            raise self._error(
                f"{what}: more than the declared {size} bytes (got {done + view.nbytes} so far)",
                key,
            )
        if self.run.spool.add(view) != at:  # pragma: no cover - _take_turn keeps it so
            raise self._error(f"{what}: spool not contiguous", key)
        return view.nbytes

    def _check_dtype(
        self, key: str, value: object, allowed: object, what: str, fmt: str | None
    ) -> None:
        """A numpy array or a typed buffer (``value``: a replacement, or a chunk of one;
        ``fmt``: its buffer format) of another dtype than the key's tensor info is a
        mistake (float64 values for float32 weights are the wrong bytes even at the same
        size), unless the size change is declared (``allowed``: the runtime's own format)."""
        found = None if allowed else declared_dtype(value, fmt)
        info = None if found is None else self.run.named.get_tensor_info(key)
        if found is None or info is None or "uint8" in (info.array_dtype, found[0]):
            return  # no description, or raw bytes: nothing to compare
        if found[0] != info.array_dtype:
            how = "array.astype" if found[1].startswith("a numpy") else "numpy.asarray(...).astype"
            raise self._error(
                f"{what} is {found[1]}, the key holds {self.run.named.describe(key)}: convert "
                f"it ({how}(numpy.{info.array_dtype})), or pass "
                "BackendData(..., allow_size_change=True) if it is your runtime's own format",
                key,
            )

    def _check_size(self, key: str, size: int, allowed: object) -> None:
        if not isinstance(allowed, bool):
            raise self._error(
                f"BackendData.allow_size_change must be True or False, got {allowed!r}", key
            )
        old = self.run.named.stored_size(key)
        if size != old and not allowed:
            raise self._error(
                f"size change refused: the value is {self.run.named.describe(key)}, the "
                f"replacement {size} bytes; pass BackendData(..., allow_size_change=True) "
                "if the change is deliberate (packed or compiled data your runtime reads in "
                "its own format)",
                key,
            )

    def replace_processed(self, data: BackendData) -> None:
        with self._lock:
            self._take_turn("write_processed_data", None)
            self._replace_processed(data)

    def _replace_processed(self, data: BackendData) -> None:
        if self.current is None:
            raise self._error(
                "write_processed_data called with no current delegate input "
                "(call next_backend_data first)"
            )
        location, delegates = self.current
        d = delegates[0]
        where = f"delegate {d.method}[{d.position}]"
        if location != "segment":
            raise self._error(
                f"{where} keeps its processed data inline in the FlatBuffer, which cannot be "
                "replaced without rewriting the program; export with "
                "extract_delegate_segments=True"
            )
        if d.index in self.blobs:
            raise self._error(f"processed data of {where} written twice")
        if d.index in self.run.replaced_blobs:
            raise self._error(
                f"processed data of {where} is shared with delegates of backend "
                f"{self.run.replaced_blobs[d.index]!r}, which already replaced it: a blob "
                "used by delegates of different backends cannot be replaced"
            )
        view, alignment = self._check_data(data, "write_processed_data", None)
        rep = self._spool(view, alignment, where)
        self.pending.setdefault(("pte", d.index), []).append(rep)
        self.blobs.add(d.index)
        self.run.emit(
            Event("replacement", backend=self._backend_id, method=d.method, nbytes=view.nbytes)
        )

    def commit(self) -> None:
        """Make this backend's replacements part of the run (its call returned; a
        submission still being spooled by another thread is waited for)."""
        with self._lock:
            self._commit()

    def _commit(self) -> None:
        for k, reps in self.pending.items():
            self.run.replacements.setdefault(k, []).extend(reps)
        for key in self.keys:
            self.run.written_keys[key] = self._backend_id
        for blob in self.blobs:
            self.run.replaced_blobs[blob] = self._backend_id
        self.report.keys_replaced = list(self.keys)
        self.report.blobs_replaced = len(self.blobs)
