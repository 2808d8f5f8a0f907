"""The specialization coordinator: run each backend once, lay out, patch, publish.

:func:`initialize_and_save_backend_data` is the whole one-time step:

1. parse the .pte (and .ptd) metadata through their loaders (ranged reads only);
2. call every backend id present in the program that has an implementation exactly
   once, with a context that hands out its unique delegate blobs lazily and the merged
   named data map, validating every replacement as it arrives (existing key, written
   once, power-of-two alignment, unchanged tensor layout); replacement bytes are spooled
   to a temporary file, so memory stays bounded by about one blob;
3. check that every segment shared by several keys or delegates was replaced
   consistently for all of them;
4. lay out each file again: segments keep their order, each starts at an offset aligned
   to the larger of its original (inferred) alignment and the requested one, no bytes
   are left between them but alignment padding;
5. write every byte once at its final location (unchanged segments through
   ``DataWriter.copy_from``, replacements from the spool, the patched metadata last),
   then publish the .ptd (if any) and then the .pte.

Any failure discards every writer: the destinations keep their previous content and
the sources are never written.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._io import pread_all, pwrite_all
from .backends.api import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    DelegateInput,
)
from .backends.registry import BackendLike, load_backend
from .errors import (
    AlreadyExists,
    BackendError,
    ConfigurationError,
    InvalidReplacement,
    NotSupported,
    ObjectNotFound,
    PartialPublish,
    StorageError,
)
from .format.model import Container, Delegate, TensorLayout, inferred_alignment
from .format.patch import PatchResult, align_up, metadata_growth_bound, patch_metadata
from .format.reader import ParsedFile, read_container
from .loaders import DataLoader

__all__ = [
    "MAX_REQUESTED_ALIGNMENT",
    "BackendReport",
    "Event",
    "FileReport",
    "SpecializationReport",
    "choose_base",
    "initialize_and_save_backend_data",
    "layout_file",
    "plan_layout",
    "specialize",
]

#: The largest alignment a backend may ask for.
MAX_REQUESTED_ALIGNMENT = 1 << 20

Buffer = bytes | bytearray | memoryview
PublishMode = Literal["overwrite", "create"]


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Event:
    """A progress event passed to ``event_tracer``.

    ``kind`` is one of ``"parsed"``, ``"backend_start"``, ``"input"`` (a delegate blob
    handed to a backend), ``"replacement"`` (a blob received), ``"backend_end"``,
    ``"write"`` (bytes written to an output; ``done``/``total`` count the run's output
    bytes), ``"publish"``.
    """

    kind: str
    backend: str | None = None
    method: str | None = None
    key: str | None = None
    nbytes: int = 0
    done: int = 0
    total: int = 0
    seconds: float = 0.0
    url: str | None = None
    status: str | None = None


EventTracer = Callable[[Event], None]


# ----------------------------------------------------------------------------- report
@dataclass
class BackendReport:
    """What one backend id did."""

    backend_id: str
    implementation: str | None
    #: ``"specialized"``, ``"not_supported"`` (the backend declined) or
    #: ``"no_implementation"`` (nothing registered for this id).
    status: str
    inputs_seen: int = 0
    keys_replaced: list[str] = field(default_factory=list)
    blobs_replaced: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


@dataclass
class FileReport:
    """What happened to one output file."""

    role: str
    source: str
    destination: str
    size_before: int
    size_after: int
    segments: int
    segments_replaced: int
    segments_moved: int
    redirected_tables: int
    bytes_copied: int
    bytes_replaced: int


@dataclass
class SpecializationReport:
    backends: list[BackendReport]
    files: list[FileReport]
    seconds: float
    #: Backends given explicitly whose id does not occur in the program (a typo?).
    unused_backends: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- spool
class _Spool:
    """Append-only temporary file holding replacement bytes until layout is known."""

    def __init__(self, directory: str | None) -> None:
        try:
            self._file = tempfile.TemporaryFile(prefix="ptestore-spool-", dir=directory)
        except OSError as exc:
            where = directory or tempfile.gettempdir()
            raise StorageError(
                f"cannot create the replacement spool in {where}: {exc.strerror or exc}"
            ) from exc
        self._size = 0
        self.name = f"<replacement spool {self._file.name}>"
        self._lock = threading.Lock()

    def add(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        with self._lock:
            offset = self._size
            try:
                pwrite_all(self._file.fileno(), view, offset)
            except OSError as exc:
                raise StorageError(
                    f"cannot spool {view.nbytes} replacement bytes: {exc.strerror or exc}"
                ) from exc
            self._size += view.nbytes
            return offset

    # DataLoader protocol, so writers can copy_from the spool.
    def size(self) -> int:
        return self._size

    def load(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self._size:
            raise StorageError(f"{self.name}: read of {size} bytes at {offset} out of range")
        out = pread_all(self._file.fileno(), size, offset)
        if len(out) != size:
            raise StorageError(f"{self.name}: short read")
        return out

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()


# ----------------------------------------------------------------------------- state
@dataclass
class _Replacement:
    spool_offset: int
    size: int
    alignment: int
    digest: str
    backend: str
    user: str  # "key 'abc'" or "delegate forward[0]"


@dataclass
class _File:
    role: Literal["pte", "ptd"]
    loader: DataLoader
    writer: Any
    parsed: ParsedFile

    @property
    def container(self) -> Container:
        return self.parsed.container


class _MergedNamedDataMap:
    """The model-wide named data map; .ptd entries win, as in the runtime."""

    def __init__(self, files: Sequence[_File]) -> None:
        self._entries: dict[str, tuple[_File, int, TensorLayout | None]] = {}
        # The runtime merges (first = .ptd, second = .pte) and the .ptd wins.
        for f in sorted(files, key=lambda f: 0 if f.role == "ptd" else 1):
            for e in f.container.named_data:
                self._entries.setdefault(e.key, (f, e.segment_index, e.tensor_layout))

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def where(self, key: str) -> tuple[_File, int, TensorLayout | None]:
        return self._entries[key]

    def get_data(self, key: str) -> Buffer:
        if key not in self._entries:
            raise KeyError(key)
        f, index, _ = self._entries[key]
        seg = f.container.segments[index]
        return f.loader.load(f.container.segment_base_offset + seg.offset, seg.size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        if key not in self._entries:
            raise KeyError(key)
        return self._entries[key][2]


def _as_bytes_view(data: object) -> memoryview | None:
    try:
        return memoryview(data).cast("B")  # type: ignore[arg-type]
    except TypeError:
        return None


class _Run:
    """State shared by all backends of one specialization run."""

    def __init__(self, files: list[_File], spool: _Spool, tracer: EventTracer | None) -> None:
        self.files = files
        self.pte = files[0]
        self.spool = spool
        self.tracer = tracer
        self.named = _MergedNamedDataMap(files)
        # (role, segment index) -> replacements (one per user that replaced it)
        self.replacements: dict[tuple[str, int], list[_Replacement]] = {}
        self.written_keys: dict[str, str] = {}  # key -> backend
        self.replaced_blobs: dict[int, str] = {}  # pte segment -> backend

    def replaced_keys(self) -> frozenset[str]:
        return frozenset(self.written_keys)

    def emit(self, event: Event) -> None:
        if self.tracer is not None:
            self.tracer(event)


class _BackendSession:
    """One backend id's view of the run: its inputs and its pending replacements."""

    def __init__(self, run: _Run, backend_id: str, report: BackendReport) -> None:
        self.run = run
        self.backend_id = backend_id
        self.report = report
        self.named_data_map = _SessionNamedMap(self)
        self._inputs = self._unique_inputs()
        self._pos = 0
        self.current: tuple[str, list[Delegate]] | None = None
        self.last_key: str | None = None
        self.last_method: str | None = None
        self.pending: dict[tuple[str, int], list[_Replacement]] = {}
        self.keys: dict[str, None] = {}
        self.blobs: set[int] = set()

    def _unique_inputs(self) -> list[tuple[tuple[str, int], list[Delegate]]]:
        groups: dict[tuple[str, int], list[Delegate]] = {}
        for d in self.run.pte.container.delegates:
            if d.id == self.backend_id:
                groups.setdefault((d.location, d.index), []).append(d)
        return list(groups.items())

    def next_input(self) -> DelegateInput | None:
        if self._pos >= len(self._inputs):
            self.current = None
            return None
        (location, index), delegates = self._inputs[self._pos]
        self._pos += 1
        self.current = (location, delegates)
        c = self.run.pte.container
        if location == "segment":
            seg = c.segments[index]
            processed = self.run.pte.loader.load(c.segment_base_offset + seg.offset, seg.size)
        else:
            pos, size = c.inline_delegate_data[index]
            processed = self.run.pte.parsed.metadata[pos : pos + size]
        first = delegates[0]
        self.last_method = first.method
        self.report.inputs_seen += 1
        self.report.bytes_in += len(processed)
        self.run.emit(
            Event("input", backend=self.backend_id, method=first.method, nbytes=len(processed))
        )
        return DelegateInput(
            backend_id=self.backend_id,
            method=first.method,
            processed=processed,
            compile_specs=first.compile_specs,
            delegates=tuple(delegates),
        )

    # -- validation -------------------------------------------------------------
    def _error(self, message: str, key: str | None = None) -> InvalidReplacement:
        return InvalidReplacement(
            message, backend=self.backend_id, method=self.last_method, key=key
        )

    def _check_data(self, data: object, what: str, key: str | None) -> tuple[memoryview, int]:
        if not isinstance(data, BackendData):
            raise self._error(
                f"{what}: expected BackendData(data, alignment=None, layout=None), "
                f"got {type(data).__name__}",
                key,
            )
        view = _as_bytes_view(data.data)
        if view is None:
            raise self._error(
                f"{what}: BackendData.data must be bytes-like, got {type(data.data).__name__}",
                key,
            )
        alignment = 1 if data.alignment is None else data.alignment
        if (
            not isinstance(alignment, int)
            or alignment < 1
            or alignment & (alignment - 1)
            or alignment > MAX_REQUESTED_ALIGNMENT
        ):
            raise self._error(
                f"{what}: alignment {data.alignment!r} must be a power of two in "
                f"[1, {MAX_REQUESTED_ALIGNMENT}]",
                key,
            )
        return view, alignment

    def _spool(self, view: memoryview, alignment: int, user: str) -> _Replacement:
        offset = self.run.spool.add(view)
        digest = hashlib.sha256(view).hexdigest()
        self.report.bytes_out += view.nbytes
        return _Replacement(offset, view.nbytes, alignment, digest, self.backend_id, user)

    def replace_named(self, key: object, data: BackendData) -> None:
        if not isinstance(key, str):
            raise self._error(f"named data keys are strings, got {type(key).__name__}")
        self.last_key = key
        if key not in self.run.named:
            raise self._error(
                f"unknown key: backends may only replace existing keys "
                f"({len(self.run.named)} keys in the model); no new keys",
                key,
            )
        first = self.run.written_keys.get(key) or (self.backend_id if key in self.keys else None)
        if first is not None:
            raise self._error(f"key written twice (first by backend {first!r})", key)
        view, alignment = self._check_data(data, "write_named_data", key)
        f, index, layout = self.run.named.where(key)
        if data.layout is not None and data.layout != layout:
            raise self._error(
                f"tensor layout {data.layout} differs from the key's layout {layout}: "
                "layouts cannot change (only segment offsets and sizes do)",
                key,
            )
        rep = self._spool(view, alignment, f"key {key!r}")
        self.pending.setdefault((f.role, index), []).append(rep)
        self.keys[key] = None
        self.run.emit(Event("replacement", backend=self.backend_id, key=key, nbytes=view.nbytes))

    def replace_processed(self, data: BackendData) -> None:
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
        if d.index in self.blobs or d.index in self.run.replaced_blobs:
            raise self._error(f"processed data of {where} written twice")
        view, alignment = self._check_data(data, "write_processed_data", None)
        rep = self._spool(view, alignment, where)
        self.pending.setdefault(("pte", d.index), []).append(rep)
        self.blobs.add(d.index)
        self.run.emit(
            Event("replacement", backend=self.backend_id, method=d.method, nbytes=view.nbytes)
        )

    def commit(self) -> None:
        for k, reps in self.pending.items():
            self.run.replacements.setdefault(k, []).extend(reps)
        for key in self.keys:
            self.run.written_keys[key] = self.backend_id
        for blob in self.blobs:
            self.run.replaced_blobs[blob] = self.backend_id
        self.report.keys_replaced = list(self.keys)
        self.report.blobs_replaced = len(self.blobs)


class _SessionNamedMap:
    """The merged map as one backend sees it (counts the bytes it reads)."""

    def __init__(self, session: _BackendSession) -> None:
        self._session = session
        self._map = session.run.named

    def keys(self) -> list[str]:
        return self._map.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._map.keys())

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    def get_data(self, key: str) -> Buffer:
        self._session.last_key = key
        data = self._map.get_data(key)
        self._session.report.bytes_in += len(data)
        return data

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        return self._map.get_tensor_layout(key)


# ----------------------------------------------------------------------------- layout
def choose_base(container: Container, metadata_size: int | None = None) -> int:
    """Where segment data starts in the rewritten file.

    The original ``segment_base_offset`` when the new metadata (``metadata_size``,
    default the original's) fits before it, so an unchanged file keeps its layout and
    rewriting is idempotent; else the end of the metadata grown by the patch engine's
    worst case, aligned up to the original base's own alignment.
    """
    original = container.segment_base_offset
    if container.header is None:
        return 0
    size = container.metadata_size if metadata_size is None else metadata_size
    if original and size <= original:
        return original
    alignment = max(16, inferred_alignment(original)) if original else 128
    return align_up(size + metadata_growth_bound(container), alignment)


def layout_file(
    container: Container,
    metadata: bytes | bytearray | memoryview,
    new_sizes: dict[int, tuple[int, int]],
) -> tuple[list[tuple[int, int]], PatchResult]:
    """Plan the new layout and patch the metadata for it.

    Tries the original base first; if the patched metadata no longer fits before it
    (redirected tables grew it), moves the base past the worst case and lays out again.
    """
    base = choose_base(container)
    placements = plan_layout(container, new_sizes, base)
    patched = patch_metadata(container, metadata, placements, segment_base_offset=None)
    if container.header is None or len(patched.metadata) <= base:
        return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)
    base = choose_base(container, len(patched.metadata))
    placements = plan_layout(container, new_sizes, base)
    return placements, patch_metadata(container, metadata, placements, segment_base_offset=base)


def plan_layout(
    container: Container,
    new_sizes: dict[int, tuple[int, int]],
    segment_base_offset: int | None = None,
) -> list[tuple[int, int]]:
    """Place every segment again, after the new base (default :func:`choose_base`).

    ``new_sizes`` maps a segment index to ``(size, requested_alignment)`` for replaced
    segments. Returns the ``(offset relative to the new base, size)`` of every segment,
    by index.

    Segments keep their physical order; each starts at an *absolute* offset aligned to
    the larger of its original alignment (the largest power of two dividing its
    original absolute offset, capped) and the requested one; nothing but padding lies
    between them. An unchanged file keeps every segment where it was.
    """
    base = choose_base(container) if segment_base_offset is None else segment_base_offset
    if container.header is None:
        # No extended header: no segment data can exist; keep every offset as it is.
        return [(s.offset, new_sizes.get(s.index, (s.size, 1))[0]) for s in container.segments]
    old_base = container.segment_base_offset
    order = sorted(container.segments, key=lambda s: (s.offset, s.index))
    placements: list[tuple[int, int]] = [(0, 0)] * len(container.segments)
    cursor = base
    for seg in order:
        size, requested = new_sizes.get(seg.index, (seg.size, 1))
        original = inferred_alignment(old_base + seg.offset) if old_base else 1
        absolute = align_up(cursor, max(original, requested))
        placements[seg.index] = (absolute - base, size)
        cursor = absolute + size
    return placements


# ----------------------------------------------------------------------------- main
def _resolve_backends(
    backends: Iterable[BackendLike] | None, ids: list[str]
) -> tuple[dict[str, BackendInterface], list[str]]:
    from .backends.registry import registered_backends

    chosen: dict[str, BackendInterface] = {}
    wildcard: BackendInterface | None = None
    if backends is None:
        registry = registered_backends()
        for bid in ids:
            if bid in registry:
                chosen[bid] = load_backend(bid)
        return chosen, []
    for spec in backends:
        impl = load_backend(spec)
        name = getattr(impl, "name", "*")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"backend {impl!r} has no usable name: {name!r}")
        if name == "*":
            if wildcard is not None:
                raise ConfigurationError(
                    f"two generic backends given ({wildcard!r} and {impl!r}); "
                    "use NAME@BACKEND_ID to choose which id each serves"
                )
            wildcard = impl
        elif name in chosen:
            raise ConfigurationError(
                f"two implementations given for backend id {name!r}: {chosen[name]!r} and {impl!r}"
            )
        else:
            chosen[name] = impl
    unused = sorted(name for name in chosen if name not in ids)
    if wildcard is not None:
        for bid in ids:
            chosen.setdefault(bid, wildcard)
    return chosen, unused


def _check_aliases(run: _Run) -> None:
    """Every segment shared by several keys/delegates must be replaced consistently."""
    for (role, index), reps in sorted(run.replacements.items()):
        f = next(f for f in run.files if f.role == role)
        c = f.container
        users: list[str] = []
        for e in c.named_data:
            if e.segment_index != index:
                continue
            where = run.named.where(e.key) if e.key in run.named else None
            if where is not None and where[0].role != role:
                continue  # shadowed by the .ptd: not what the runtime reads
            users.append(f"key {e.key!r}")
        delegate_users = [
            f"delegate {d.method}[{d.position}]"
            for d in c.delegates
            if role == "pte" and d.location == "segment" and d.index == index
        ]
        users += delegate_users
        replaced = {r.user for r in reps}
        # A shared delegate blob is one input: its replacement covers every delegate.
        if any(u.startswith("delegate ") for u in replaced):
            replaced.update(delegate_users)
        missing = [u for u in users if u not in replaced]
        digests = {r.digest for r in reps}
        backends = sorted({r.backend for r in reps})
        if missing or len(digests) > 1:
            problem = (
                f"{', '.join(missing)} not replaced" if missing else "replaced with different bytes"
            )
            key_users = [u for u in (missing or users) if u.startswith("key ")]
            first_key = key_users[0][5:-1] if key_users else None
            raise InvalidReplacement(
                f"segment {index} of {c.source} is shared by {', '.join(users)}; "
                f"{problem}: replace every alias with identical bytes",
                backend=", ".join(backends),
                key=first_key,
            )


def _write_zeros(writer: Any, offset: int, size: int) -> None:
    zeros = memoryview(bytes(min(size, 1 << 20)))
    done = 0
    while done < size:
        n = min(zeros.nbytes, size - done)
        writer.write(zeros[:n], offset + done)
        done += n


def _write_file(
    run: _Run,
    f: _File,
    progress: list[int],
    total: int,
    layout: tuple[list[tuple[int, int]], PatchResult],
) -> FileReport:
    c = f.container
    placements, patched = layout
    base = patched.segment_base_offset
    copied = replaced_bytes = moved = replaced_count = 0

    def note(n: int) -> None:
        progress[0] += n
        run.emit(Event("write", nbytes=n, done=progress[0], total=total, url=f.writer.url))

    # Padding is written as zeros too, so every byte of the output is written exactly
    # once (a writer that uploads fixed parts can then ship each part as soon as it is
    # complete, instead of holding parts with unwritten gaps until publish).
    spans = sorted(
        [(0, len(patched.metadata))]
        + [(base + off, base + off + size) for off, size in placements if size]
    )
    cursor = 0
    for start, end in [*spans, (patched.file_size, patched.file_size)]:
        if start > cursor:
            _write_zeros(f.writer, cursor, start - cursor)
            note(start - cursor)
        cursor = max(cursor, end)

    for seg in c.segments:
        new_off, size = placements[seg.index]
        if new_off != seg.offset or size != seg.size:
            moved += 1
        if size == 0:
            continue
        reps = run.replacements.get((f.role, seg.index))
        if reps:
            rep = reps[0]
            f.writer.copy_from(run.spool, rep.spool_offset, rep.size, base + new_off)
            replaced_bytes += rep.size
            replaced_count += 1
        else:
            f.writer.copy_from(f.loader, c.segment_base_offset + seg.offset, size, base + new_off)
            copied += size
        note(size)
    f.writer.write(patched.metadata, 0)
    note(len(patched.metadata))
    return FileReport(
        role=f.role,
        source=f.loader.name,
        destination=f.writer.url,
        size_before=c.file_size,
        size_after=patched.file_size,
        segments=len(c.segments),
        segments_replaced=replaced_count,
        segments_moved=moved,
        redirected_tables=len(patched.redirected),
        bytes_copied=copied,
        bytes_replaced=replaced_bytes,
    )


def initialize_and_save_backend_data(
    pte_loader: DataLoader,
    pte_writer: Any,
    *,
    ptd_loader: DataLoader | None = None,
    ptd_writer: Any | None = None,
    backends: Iterable[BackendLike] | None = None,
    event_tracer: EventTracer | None = None,
    mode: PublishMode = "overwrite",
    spool_dir: str | None = None,
) -> SpecializationReport:
    """Specialize a model once and publish the result through the given writers.

    ``backends`` lists implementations (instances, classes or SPEC strings, see
    :mod:`ptestore.backends.registry`); None uses every registered backend whose name
    is a backend id in the program. Returns a :class:`SpecializationReport`.

    On any failure every writer is discarded and the exception propagates: backend
    failures as :class:`~ptestore.errors.BackendError` naming the backend, method and
    key; storage failures as :class:`~ptestore.errors.StorageError`.
    """
    if (ptd_loader is None) != (ptd_writer is None):
        raise ConfigurationError("ptd_loader and ptd_writer must be given together")
    if mode not in ("overwrite", "create"):
        raise ConfigurationError(f"mode must be 'overwrite' or 'create', got {mode!r}")
    writers = [w for w in (pte_writer, ptd_writer) if w is not None]
    started = time.perf_counter()
    spool: _Spool | None = None
    try:
        files = [_File("pte", pte_loader, pte_writer, read_container(pte_loader))]
        if files[0].container.kind != "pte":
            raise ConfigurationError(f"{pte_loader.name}: expected a .pte, found a .ptd")
        if ptd_loader is not None:
            files.append(_File("ptd", ptd_loader, ptd_writer, read_container(ptd_loader)))
            if files[1].container.kind != "ptd":
                raise ConfigurationError(f"{ptd_loader.name}: expected a .ptd, found a .pte")
        spool = _Spool(spool_dir)
        run = _Run(files, spool, event_tracer)
        run.emit(Event("parsed", url=pte_loader.name))

        ids = list(dict.fromkeys(d.id for d in files[0].container.delegates))
        impls, unused = _resolve_backends(backends, ids)
        reports: list[BackendReport] = []
        for bid in ids:
            impl = impls.get(bid)
            report = BackendReport(bid, None if impl is None else repr(impl), "no_implementation")
            reports.append(report)
            if impl is None:
                continue
            _run_backend(run, impl, bid, report)

        _check_aliases(run)

        layouts = []
        for f in files:
            new_sizes = {
                index: (reps[0].size, max(r.alignment for r in reps))
                for (role, index), reps in run.replacements.items()
                if role == f.role
            }
            layouts.append(layout_file(f.container, f.parsed.metadata, new_sizes))
        total = sum(p.file_size for _, p in layouts)
        progress = [0]
        file_reports = [
            _write_file(run, f, progress, total, lay) for f, lay in zip(files, layouts, strict=True)
        ]
        # A source replaced while we read it would mix two versions: check first.
        for f in files:
            check = getattr(f.loader, "check_unchanged", None)
            if check is not None:
                check()
        # The .ptd first: a crash between the two publishes leaves the old .pte, which
        # a rerun from the original sources replaces (see docs/concepts.md).
        published: list[str] = []
        for f in reversed(files):
            t0 = time.perf_counter()
            try:
                f.writer.publish(mode)
            except Exception as exc:
                if published:
                    raise PartialPublish(
                        f"{', '.join(published)} was published, but publishing "
                        f"{f.writer.url} failed: {exc}; rerun from the original sources",
                        published=tuple(published),
                    ) from exc
                raise
            published.append(f.writer.url)
            run.emit(Event("publish", url=f.writer.url, seconds=time.perf_counter() - t0))
        return SpecializationReport(
            reports, file_reports, time.perf_counter() - started, unused_backends=unused
        )
    except BaseException:
        for w in writers:
            try:
                w.discard()
            except Exception:  # the original error matters more
                pass
        raise
    finally:
        if spool is not None:
            spool.close()


def _run_backend(run: _Run, impl: BackendInterface, bid: str, report: BackendReport) -> None:
    session = _BackendSession(run, bid, report)
    run.emit(Event("backend_start", backend=bid))
    t0 = time.perf_counter()
    try:
        impl.initialize_backend_data(BackendDataInitContext(session), BackendDataWriter(session))
    except NotSupported:
        report.status = "not_supported"
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(
            f"initialize_backend_data failed: {type(exc).__name__}: {exc}",
            backend=bid,
            method=session.last_method,
            key=session.last_key,
        ) from exc
    else:
        session.commit()
        report.status = "specialized"
    finally:
        report.seconds = time.perf_counter() - t0
    run.emit(Event("backend_end", backend=bid, seconds=report.seconds, status=report.status))


def _same_target(a: str, b: str) -> bool:
    from .loaders import split_url

    pa, pb = split_url(a), split_url(b)
    if pa[0] == pb[0] == "file":
        return os.path.realpath(pa[1]) == os.path.realpath(pb[1])
    return pa == pb


def specialize(
    src_url: str | os.PathLike[str],
    dst_url: str | os.PathLike[str],
    *,
    ptd: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    backends: Iterable[BackendLike] | None = None,
    mode: PublishMode = "overwrite",
    event_tracer: EventTracer | None = None,
    storage_options: dict[str, Any] | None = None,
    src_storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    spool_dir: str | None = None,
) -> SpecializationReport:
    """Specialize the model at ``src_url`` and publish it at ``dst_url``.

    URLs are local paths or fsspec URLs (``file://``, ``memory://``, ``s3://``, ...).
    ``dst_url`` may equal ``src_url``: the original is then replaced atomically.
    ``ptd=(src_ptd_url, dst_ptd_url)`` rewrites the model's external weights too (the
    two files cannot be replaced in place together: a crash between the two publishes
    would leave a mismatched pair, so in-place is refused for pairs).
    ``storage_options`` apply to every remote URL; ``src_``/``dst_storage_options``
    override them for the sources or the destinations.
    """
    from .loaders import open_loader, split_url
    from .writers import open_writer

    src, dst = os.fspath(src_url), os.fspath(dst_url)
    common = dict(storage_options or {})
    src_opts = {**common, **(src_storage_options or {})}
    dst_opts = {**common, **(dst_storage_options or {})}

    def opts(url: str, options: dict[str, Any]) -> dict[str, Any]:
        return {} if split_url(url)[0] == "file" else options

    pairs = [(src, dst)]
    if ptd is not None:
        pairs.append((os.fspath(ptd[0]), os.fspath(ptd[1])))
        for s, d in pairs:
            if _same_target(s, d):
                raise ConfigurationError(
                    f"in-place specialization of a .pte/.ptd pair is refused ({s} -> {d}): "
                    "the two files cannot be published in one atomic step; write the pair "
                    "to new names"
                )
    if mode == "create":
        # Fail before any work (and before a .ptd is published) when a destination
        # exists; the writers' no-clobber publish still guards against races.
        for _, d in pairs:
            try:
                probe = open_loader(d, **opts(d, dst_opts))
            except ObjectNotFound:
                continue
            probe.close()
            raise AlreadyExists(f"{d}: already exists (create mode refuses to replace it)")
    loaders: list[DataLoader] = []
    writers: list[Any] = []
    try:
        for s, d in pairs:
            loaders.append(open_loader(s, **opts(s, src_opts)))
            writer_opts = opts(d, dst_opts)
            if split_url(d)[0] == "s3":
                # Every byte is written exactly once: no part is ever rewritten, so the
                # S3 writer needs no local spool of uploaded parts.
                writer_opts.setdefault("spool", False)
            writers.append(open_writer(d, **writer_opts))
        return initialize_and_save_backend_data(
            loaders[0],
            writers[0],
            ptd_loader=loaders[1] if ptd is not None else None,
            ptd_writer=writers[1] if ptd is not None else None,
            backends=backends,
            event_tracer=event_tracer,
            mode=mode,
            spool_dir=spool_dir,
        )
    finally:
        for w in writers:
            try:
                w.discard()  # no-op after publish; never publishes
            except Exception:
                pass
        for loader in loaders:
            loader.close()
