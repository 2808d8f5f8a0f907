"""The model-wide named data map, built from the files of one run."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal, NoReturn

from .._dataclass import dataclass
from ..errors import ConfigurationError, FormatError, MissingNamedData
from ..format.model import Container, TensorLayout
from ..provenance.trailer import ContentView
from ..storage.loaders import DataLoader, LocalFileLoader
from ..storage.types import load_into
from .report import SPECIALIZE_PTD, pass_ptd
from .spool import Buffer

if TYPE_CHECKING:
    import numpy as np

    from ..format.reader import ParsedFile
    from ..format.tensorinfo import TensorInfo
    from ..format.tensors import TensorIndex
    from ..writers.base import DataWriter

__all__ = ["MergedNamedDataMap", "SourceFile", "read_chunks", "read_view"]


def read_view(loader: DataLoader, offset: int, size: int) -> Buffer:
    """Bytes a backend reads: a zero-copy, read-only view of a local file's mapping
    (a loader with ``view``: a local file, with or without the trailer it hides), else
    what the loader returns."""
    if isinstance(loader, (LocalFileLoader, ContentView)):
        return loader.view(offset, size)
    return loader.load(offset, size)


def _writable_bytes(buffer: object, key: str) -> memoryview:
    """``buffer`` as a writable, flat view of bytes (what ``read_into`` fills)."""
    try:
        view = memoryview(buffer).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(
            f"read_into({key!r}): the buffer must be a writable, C-contiguous bytes-like "
            f"object (bytearray, memoryview, numpy array), got {type(buffer).__name__}"
        ) from None
    if view.readonly:
        raise ConfigurationError(
            f"read_into({key!r}): the buffer ({type(buffer).__name__}) is read-only; pass "
            "a writable one (bytearray, numpy.empty(...))"
        )
    return view


def _check_offset(key: str, offset: object, size: int) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= size:
        raise ConfigurationError(
            f"read_into({key!r}): offset {offset!r} must be an int in [0, {size}] (the "
            "value's size)"
        )
    return offset


def read_chunks(
    read_into: Callable[[str, memoryview, int], int], key: str, size: int, chunk_size: object
) -> Iterator[memoryview]:
    """The value of ``key`` (``size`` bytes) in pieces of ``chunk_size`` bytes, each read
    by ``read_into`` into one buffer that the next piece reuses. ``chunk_size`` is
    checked now, not when the first piece is asked for."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ConfigurationError(
            f"read_chunks({key!r}): chunk_size {chunk_size!r} must be an int >= 1 (bytes)"
        )
    return _pieces(read_into, key, size, chunk_size)


def _pieces(
    read_into: Callable[[str, memoryview, int], int], key: str, size: int, chunk_size: int
) -> Iterator[memoryview]:
    buffer = memoryview(bytearray(min(chunk_size, size)))
    for offset in range(0, size, chunk_size):
        n = read_into(key, buffer[: min(chunk_size, size - offset)], offset)
        yield buffer[:n].toreadonly()


@dataclass
class SourceFile:
    """One container of the run: where it is read from, parsed, and where it goes."""

    role: Literal["pte", "ptd"]
    loader: DataLoader
    writer: DataWriter
    parsed: ParsedFile

    @property
    def container(self) -> Container:
        return self.parsed.container


class MergedNamedDataMap:
    """The model-wide named data map; .ptd entries win, as in the runtime."""

    def __init__(
        self, files: Sequence[SourceFile], ptd_spelling: tuple[str, str] = SPECIALIZE_PTD
    ) -> None:
        """``ptd_spelling``: how the caller is given the model's .ptd, as a missing
        key's hint names it (:func:`~.report.pass_ptd`; the run's)."""
        self._files = list(files)
        self._spelling = ptd_spelling
        self._index: TensorIndex | None = None
        self._entries: dict[str, tuple[SourceFile, int, TensorLayout | None]] = {}
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

    def where(self, key: str) -> tuple[SourceFile, int, TensorLayout | None]:
        """The file, segment index and layout the runtime would read ``key`` from."""
        if key not in self._entries:
            self.missing(key)
        return self._entries[key]

    def missing(self, key: str) -> NoReturn:
        """Raise :class:`MissingNamedData` for ``key``, naming the files looked in and,
        when there is no .ptd, the one that is missing."""
        names = tuple(str(f.container.source) for f in self._files)
        looked = " or ".join(names) or "the model"
        if any(f.role == "ptd" for f in self._files):
            hint = "neither file holds it"
        elif key in self._expected_from_ptd():
            hint = (
                "no .ptd was given, and a key the .pte does not hold is in the model's .ptd "
                f"(its external weights): {pass_ptd(self._spelling)}"
            )
        else:  # not a key of the model at all: a .ptd would not help
            expected = len(self._expected_from_ptd())
            hint = (
                f"the model has no such key (the .pte holds {len(self._entries)} and reads "
                f"{expected or 'none'} from a .ptd; ptestore inspect lists them)"
            )
        raise MissingNamedData(
            f"named data key {key!r} is not in {looked}: {hint}", key=key, files=names
        )

    def _expected_from_ptd(self) -> frozenset[str]:
        """The keys the .pte reads that it does not hold (an error path: parsed each time)."""
        from ..format.tensors import unheld_keys

        pte = next(f for f in self._files if f.role == "pte")
        return frozenset(k for k, _ in unheld_keys(pte.parsed, pte.loader))

    def get_data(self, key: str) -> Buffer:
        if key not in self._entries:
            self.missing(key)
        f, index, _ = self._entries[key]
        seg = f.container.segments[index]
        return read_view(f.loader, f.container.absolute(seg), seg.size)

    def get_data_size(self, key: str) -> int:
        """The stored byte size of ``key``'s value (from the metadata)."""
        return self.stored_size(key)

    def read_into(self, key: str, buffer: object, offset: int = 0) -> int:
        """Fill ``buffer`` with the value of ``key`` from ``offset`` on (as much as fits,
        up to the value's end); returns the number of bytes read. A local file is read
        straight into ``buffer`` (``preadv``): nothing is mapped, so the original's pages
        never count in the process's memory."""
        if key not in self._entries:
            self.missing(key)
        view = _writable_bytes(buffer, key)
        f, index, _ = self._entries[key]
        seg = f.container.segments[index]
        offset = _check_offset(key, offset, seg.size)
        n = min(view.nbytes, seg.size - offset)
        if n:
            load_into(f.loader, f.container.absolute(seg) + offset, view[:n])
        return n

    def read_chunks(self, key: str, chunk_size: int) -> Iterator[memoryview]:
        """The value of ``key`` in pieces of ``chunk_size`` bytes (the last one shorter):
        read-only views of one buffer that each next piece overwrites."""
        return read_chunks(self.read_into, key, self.stored_size(key), chunk_size)

    def get_tensor_layout(self, key: str) -> TensorLayout | None:
        if key not in self._entries:
            self.missing(key)
        return self._entries[key][2]

    # -- tensor info ---------------------------------------------------------------
    def tensor_index(self) -> TensorIndex:
        """Every description of every key, read once (on first use) for the whole run."""
        if self._index is None:
            from ..format.tensors import describe_tensors  # only when a backend asks

            pte = next(f for f in self._files if f.role == "pte")
            ptd = next((f for f in self._files if f.role == "ptd"), None)
            self._index = describe_tensors(pte.parsed, pte.loader, ptd.parsed if ptd else None)
        return self._index

    def get_tensor_info(self, key: str) -> TensorInfo | None:
        """dtype, shape, byte size and quantization of ``key``; None when nothing in the
        files describes it."""
        if key not in self._entries:
            self.missing(key)
        return self.tensor_index().get(key)

    def get_array(self, key: str) -> np.ndarray:
        """The value of ``key`` as a zero-copy, read-only numpy array (see ``TensorInfo``)."""
        f, _, _ = self.where(key)
        from ..format.tensorinfo import array_view

        return array_view(self.get_data(key), self.get_tensor_info(key), key, f.container.source)

    def get_shared_keys(self, key: str) -> tuple[str, ...]:
        """The other keys whose value is the same stored segment as ``key``'s (they can
        only be replaced together, with identical bytes)."""
        f, index, _ = self.where(key)
        return tuple(
            k for k, (g, i, _) in self._entries.items() if k != key and g is f and i == index
        )

    def stored_size(self, key: str) -> int:
        f, index, _ = self.where(key)
        return f.container.segments[index].size

    def describe(self, key: str) -> str:
        """``'float32 [32, 16], 2048 bytes'`` for error messages; never raises."""
        size = self.stored_size(key)
        try:
            info = self.get_tensor_info(key)
        except FormatError as exc:
            return f"{size} bytes; tensor info unavailable: {exc}"
        if info is None:
            return f"{size} bytes; no dtype or shape is recorded for this key"
        return f"{info.dtype} {list(info.shape)}, {size} bytes (from {info.source} {info.where})"
