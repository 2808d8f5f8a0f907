"""Read a container's metadata through a DataLoader with ranged reads only."""

from __future__ import annotations

from .._dataclass import dataclass
from ..errors import FormatError
from ..storage.types import DataLoader
from .header import HEAD_BYTES, U32, FileHead
from .model import Container
from .parsing import parse_metadata

__all__ = ["ParsedFile", "check_bounds", "read_container"]


@dataclass(frozen=True)
class ParsedFile:
    """A parsed container plus the metadata bytes it was parsed from."""

    container: Container
    metadata: bytes
    #: Bytes read from the loader to parse (header probe + metadata).
    bytes_read: int


def read_container(loader: DataLoader) -> ParsedFile:
    """Parse the .pte or .ptd behind ``loader``, reading only its metadata region.

    Two ranged reads at most: the first 64 bytes (headers, decoded once), then the
    FlatBuffer, in one buffer of its size (never pieces joined). Segment data is never
    read. What the
    first bytes can tell is checked before the FlatBuffer is read (:func:`check_bounds`):
    a corrupt header is a :class:`FormatError`, not a read of the whole file.
    """
    size = loader.size()
    try:
        head_bytes = bytes(loader.load(0, min(HEAD_BYTES, size)))
        head = FileHead.from_bytes(head_bytes, size, loader.name)
        read = len(head_bytes)
        if head.metadata_size <= len(head_bytes):
            meta = head_bytes[: head.metadata_size]
        else:
            check_bounds(head, head_bytes)
            meta = _read_metadata(loader, head)
            read += head.metadata_size
        return ParsedFile(parse_metadata(meta, head), meta, read)
    except FormatError as exc:
        # a view hiding a provenance trailer (forwarded by a wrapper around one) measures
        # the container, not the file: say so, or the sizes do not match the file's
        hidden = int(getattr(loader, "hidden_bytes", 0))
        if not hidden:
            raise
        note = (
            f"that is the container: the file is {size + hidden} bytes, the last {hidden} "
            "its provenance trailer"
        )
        detail = note if exc.detail is None else f"{exc.detail}; {note}"
        raise FormatError(exc.source, exc.field, exc.value, exc.limit, detail) from None


def check_bounds(head: FileHead, first: bytes) -> None:
    """What the file's ``first`` bytes bound before its FlatBuffer is read (the header's
    own checks, :mod:`.header`, bound its size: inside the file, before the segments,
    under 2 GiB): a ``.pte``'s root table (the offset at ``[0, 4)``) inside the program,
    4-byte aligned, refused as the parser refuses it."""
    if head.kind != "pte":
        return
    n, pos = head.metadata_size, int(U32.unpack_from(first, 0)[0])
    if pos < 8 or pos + 4 > n:
        raise FormatError(head.source, "Program (table position)", pos, f"in [8, {n - 4}]")
    if pos % 4:
        raise FormatError(
            head.source, "Program (table position)", pos, "a multiple of 4 (table alignment)"
        )


def _read_metadata(loader: DataLoader, head: FileHead) -> bytes:
    """The file's bytes ``[0, metadata_size)`` in one read, kept as the loader returns
    them where they are its own (``bytes``; a local file's past 1 GiB a ``bytearray``
    read in place, never pieces joined: the peak is the size, not twice it)."""
    n = head.metadata_size
    try:
        data = loader.load(0, n)
        return data if isinstance(data, (bytes, bytearray)) else bytes(data)  # type: ignore[return-value]
    except MemoryError as exc:
        raise MemoryError(
            f"{head.source}: its {n}-byte FlatBuffer (the header's size of its metadata) "
            "does not fit in memory"
        ) from exc
