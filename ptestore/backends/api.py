"""The backend API: what a backend implementation sees and how it submits replacements.

A backend is called once per model, with a :class:`BackendDataInitContext` that hands
out its delegate inputs one at a time and the model-wide named data map, and a
:class:`BackendDataWriter` that takes replacement bytes for *existing* keys and for the
current delegate's processed blob. Nothing a backend does touches storage: the
coordinator validates every replacement as it arrives, lays out the new container and
publishes it only when every backend has finished.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._dataclass import dataclass, field
from ..errors import NotSupported
from ..storage.types import Buffer
from .compat import Compatibility, DeviceProfile, distribution_version

if TYPE_CHECKING:
    import numpy as np

    from ..format.model import CompileSpec, Delegate, TensorLayout
    from ..format.tensorinfo import QuantParams, TensorInfo

__all__ = [
    "BackendData",
    "BackendDataInitContext",
    "BackendDataWriter",
    "BackendInterface",
    "BackendSession",
    "Compatibility",
    "DelegateInput",
    "DeviceProfile",
    "NamedDataMap",
    "QuantParams",
    "TensorInfo",
]


def __getattr__(name: str) -> Any:
    # Re-exported from the format package on first use: loading a backend (an
    # ``ensure`` cache hit) does not need the container model.
    if name in ("QuantParams", "TensorInfo"):
        from ..format import tensorinfo

        value = getattr(tensorinfo, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class BackendData:
    """Replacement bytes submitted by a backend.

    ``alignment`` (a power of two) asks for the data to start at an offset aligned to
    it; the final alignment is the larger of this and the original segment's alignment,
    which is never weakened. ``layout`` must be None or equal to the key's existing
    tensor layout: only segment offsets and sizes change in the metadata.

    A named-data value keeps its byte size unless ``allow_size_change=True`` says the
    change is deliberate (packed or compiled data that the backend's runtime side reads
    in its own format). Processed delegate blobs may change size freely.
    """

    data: Buffer
    alignment: int | None = None
    layout: TensorLayout | None = None
    allow_size_change: bool = False


@dataclass(frozen=True)
class DelegateInput:
    """One unique delegate blob of a backend (a blob shared by several delegates is
    handed out once, listing every delegate that uses it)."""

    backend_id: str
    #: The method of the first delegate using this blob.
    method: str
    processed: Buffer
    compile_specs: tuple[CompileSpec, ...]
    #: Every delegate (across methods) that shares this blob.
    delegates: tuple[Delegate, ...] = field(default=())

    @property
    def methods(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for d in self.delegates:
            seen.setdefault(d.method)
        return tuple(seen)

    def compile_spec(self, key: str) -> bytes | None:
        """The value of compile spec ``key``, or None."""
        for spec in self.compile_specs:
            if spec.key == key:
                return spec.value
        return None


class NamedDataMap(Protocol):
    """The model-wide, read-only named data map (.ptd entries win over .pte ones, as
    in the runtime's merged map)."""

    def keys(self) -> list[str]: ...

    def get_data(self, key: str) -> Buffer: ...

    def get_data_size(self, key: str) -> int:
        """The stored byte size of ``key``'s value, from the metadata (nothing is read).
        KeyError for a key not in the map."""
        ...

    def read_into(self, key: str, buffer: object, offset: int = 0) -> int:
        """Fill the writable ``buffer`` (a bytearray, a writable memoryview, a C-contiguous
        numpy array) with the value of ``key`` from byte ``offset`` on, as much as fits
        before the value ends; returns the number of bytes read. Nothing is mapped: a
        local file is read straight into ``buffer`` (``preadv``), so the original's pages
        never count in the process's memory (unlike a view from :meth:`get_data`).
        KeyError for a key not in the map; ConfigurationError for a read-only or
        non-contiguous buffer or an offset outside ``[0, size]``."""
        ...

    def read_chunks(self, key: str, chunk_size: int) -> Iterator[memoryview]:
        """The value of ``key`` in pieces of ``chunk_size`` bytes (the last one may be
        shorter; none for an empty value), each read by :meth:`read_into` into one
        buffer of ``chunk_size`` bytes: a piece is a read-only view that the next piece
        overwrites (``bytes(piece)`` to keep one). KeyError for a key not in the map,
        ConfigurationError for a ``chunk_size`` that is not an int >= 1, both at the
        call."""
        ...

    def get_tensor_layout(self, key: str) -> TensorLayout | None: ...

    def get_tensor_info(self, key: str) -> TensorInfo | None:
        """dtype, shape, byte size and quantization of ``key`` from the model's own
        descriptions (XNNPACK graphs, EXTERNAL program tensors, .ptd layouts); None when
        nothing in the files describes it. KeyError for a key not in the map."""
        ...

    def get_array(self, key: str) -> np.ndarray:
        """The value as a zero-copy, read-only numpy array of ``info.array_dtype`` and
        ``info.array_shape`` (flat ``uint8`` when there is no info)."""
        ...

    def get_shared_keys(self, key: str) -> tuple[str, ...]:
        """Other keys stored in the same segment (replace them together, identically)."""
        ...

    def __contains__(self, key: object) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...

    def __len__(self) -> int: ...


class BackendSession(Protocol):
    """What the context and writer a backend gets need from the run that calls it.

    The coordinator implements it; the backend API depends on nothing else.
    """

    @property
    def backend_id(self) -> str: ...

    @property
    def named_data_map(self) -> NamedDataMap: ...

    @property
    def replaced_keys(self) -> frozenset[str]: ...

    def next_input(self) -> DelegateInput | None: ...

    def replace_named(self, key: object, data: BackendData) -> None: ...

    def replace_processed(self, data: BackendData) -> None: ...

    def replace_named_chunks(
        self, key: object, size: int, chunks: Iterable[Buffer], template: BackendData
    ) -> None: ...


class BackendDataInitContext:
    """What one backend sees during :meth:`BackendInterface.initialize_backend_data`."""

    def __init__(self, session: BackendSession, device: DeviceProfile | None = None) -> None:
        self._session = session
        self._device = device

    @property
    def backend_id(self) -> str:
        """The ``BackendDelegate.id`` being initialized."""
        return self._session.backend_id

    @property
    def device(self) -> DeviceProfile | None:
        """The device profile this run specializes for (None when the caller named
        none): its ``name`` and ``options`` mapping."""
        return self._device

    def next_backend_data(self) -> DelegateInput | None:
        """The next unique delegate input of this backend, or None at the end.

        Inputs are loaded lazily, one at a time; the previous input's memory may be
        reclaimed when the next one is requested.
        """
        return self._session.next_input()

    def __iter__(self) -> Iterator[DelegateInput]:
        while True:
            item = self.next_backend_data()
            if item is None:
                return
            yield item

    def get_named_data_map(self) -> NamedDataMap:
        """The merged named data map of the model (.pte + .ptd)."""
        return self._session.named_data_map

    @property
    def replaced_keys(self) -> frozenset[str]:
        """Keys already replaced by backends that ran earlier in this run (a key may be
        written once per run)."""
        return self._session.replaced_keys


class BackendDataWriter:
    """Where a backend submits replacements. Validated as they arrive."""

    def __init__(self, session: BackendSession) -> None:
        self._session = session

    def write_named_data(
        self,
        key: str | Mapping[str, BackendData] | Iterable[tuple[str, BackendData]],
        data: BackendData | None = None,
    ) -> None:
        """Replace the value of an existing key (or of several at once).

        No new, removed or renamed keys; each key may be written once. Keys that share
        a segment must all be written, with identical bytes.
        """
        plain = (str, bytes, bytearray, memoryview)
        many = isinstance(key, (Mapping, Iterable)) and not isinstance(key, plain)
        if not many:  # one key: the session refuses one that is not a string, naming it
            if data is None:
                raise TypeError("write_named_data(key, data): data is required")
            self._session.replace_named(key, data)
            return
        if data is not None:
            raise TypeError("write_named_data(items): pass a mapping or pairs, not data")
        items = key.items() if isinstance(key, Mapping) else key
        for item in items:
            pair = None if isinstance(item, plain) else _pair(item)
            if pair is None:
                raise TypeError(
                    "write_named_data(items): each item must be a (key, BackendData) pair, "
                    f"got {_shown(item)}"
                )
            self._session.replace_named(*pair)

    def write_processed_data(self, data: BackendData) -> None:
        """Replace the processed blob of the current delegate input (the one last
        returned by ``next_backend_data``)."""
        self._session.replace_processed(data)

    def write_named_data_chunks(
        self,
        key: str,
        size: int,
        chunks: Iterable[Buffer],
        *,
        alignment: int | None = None,
        layout: TensorLayout | None = None,
        allow_size_change: bool = False,
    ) -> None:
        """Replace the value of an existing key with ``size`` bytes given in pieces
        (any iterable of bytes-like chunks, a generator included): each piece is spooled
        as it arrives, so a backend never holds the whole replacement. The same rules as
        :meth:`write_named_data`; fewer or more bytes than ``size`` is an
        :class:`~ptestore.errors.InvalidReplacement`."""
        template = BackendData(
            b"", alignment=alignment, layout=layout, allow_size_change=allow_size_change
        )
        self._session.replace_named_chunks(key, size, chunks, template)


def _pair(item: object) -> tuple[object, Any] | None:
    """``item`` as a ``(key, data)`` pair, or None when it is not one."""
    pair: Any = item
    try:
        k, d = pair
    except (TypeError, ValueError):
        return None
    return k, d


def _shown(value: object) -> str:
    """A wrong argument in a message: its type and its repr, cut to 60 characters."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__: the type says enough
        text = "(unprintable)"
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class BackendInterface(abc.ABC):
    """Base class of backend implementations.

    ``name`` is the ``BackendDelegate.id`` the implementation serves (for example
    ``"XnnpackBackend"``), or ``"*"`` for a generic backend that serves every id that
    has no dedicated implementation. There is no default: a class must say which it is
    (a vendor backend that served every id would be handed other vendors' blobs).
    """

    #: The ``BackendDelegate.id`` served, or ``"*"`` (explicitly) for every id.
    name: str

    @property
    def version(self) -> str:
        """The implementation's version, recorded in provenance: a changed version makes
        artifacts it made stale. Default: the version of the installed distribution
        that provides the class. Override it (a class attribute or an assignment).
        """
        explicit = self.__dict__.get("_ptestore_version")
        return explicit if isinstance(explicit, str) else distribution_version(type(self))

    @version.setter
    def version(self, value: str) -> None:
        self.__dict__["_ptestore_version"] = str(value)

    def compatibility_info(self, context: BackendDataInitContext) -> str:
        """An opaque string stamped into the provenance of what this backend made for
        ``context`` (compiler and SDK versions, hardware architecture, flags), read back
        by :meth:`check_compatibility` without loading the model. Called after
        :meth:`initialize_backend_data` with the same context. Default: empty."""
        return ""

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        """Rate an artifact whose provenance holds ``info`` (from
        :meth:`compatibility_info`) for ``device``, without loading the model.
        Default: ``OPTIMAL`` (no opinion; a changed :attr:`version` still makes the
        artifact stale)."""
        return Compatibility.OPTIMAL

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        """Walk ``context`` and submit replacements to ``output``.

        The default raises :class:`~ptestore.errors.NotSupported`, which means "leave
        this backend's data as it is".
        """
        name = getattr(self, "name", type(self).__name__)
        raise NotSupported(f"backend {name!r} does not initialize backend data")
