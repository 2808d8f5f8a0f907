"""The first bytes of an XNNPACK delegate blob: its ``XH00`` header and the XNNGraph
FlatBuffer's file identifier, checked as the runtime checks them (XNNHeader.cpp,
XNNCompiler.cpp) when a run reads its sources.

Layout (backends/xnnpack/serialization/xnnpack_graph_serialize.py): 4 zero bytes, magic
``XH00``, u16 header length (30), u32 flatbuffer offset, u32 flatbuffer size, u32
constant data offset, u64 constant data size. Without the magic the whole blob is the
FlatBuffer, whose bytes 4..8 are its identifier (``XN01``/``XN00``).

Standard library only (beside :mod:`ptestore.errors` and the container model): a run
checks every XNNPACK blob of its .pte here, at start-up, with two ranged reads of a few
bytes each; the graphs themselves are parsed by :mod:`.xnnpack` when something asks.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from .._dataclass import dataclass
from ..errors import FormatError

if TYPE_CHECKING:
    from ..storage.types import Buffer, DataLoader
    from .model import Container, Delegate

__all__ = [
    "XNNPACK_BACKEND_ID",
    "XNN_HEADER_LENGTH",
    "XNN_HEADER_MAGIC",
    "XNN_IDENTIFIERS",
    "XnnHeader",
    "blob_source",
    "check_identifier",
    "check_xnnpack_blobs",
    "parse_xnn_header",
    "xnngraph_span",
]

XNNPACK_BACKEND_ID = "XnnpackBackend"
XNN_HEADER_MAGIC = b"XH00"
XNN_HEADER_LENGTH = 30
XNN_IDENTIFIERS = (b"XN01", b"XN00")


@dataclass(frozen=True)
class XnnHeader:
    flatbuffer_offset: int
    flatbuffer_size: int
    constant_data_offset: int
    constant_data_size: int


def parse_xnn_header(
    head: bytes | bytearray | memoryview, blob_size: int, source: str, *, strict: bool = True
) -> XnnHeader | None:
    """The ``XH00`` header from the first bytes of a blob; None when the blob has none.
    ``strict=False``: a header length below 30 is not refused (the runtime ignores it)."""
    if len(head) < 8 or bytes(head[4:8]) != XNN_HEADER_MAGIC:
        return None
    if blob_size < XNN_HEADER_LENGTH or len(head) < XNN_HEADER_LENGTH:
        raise FormatError(
            source, "XNNHeader (blob size)", blob_size, f">= {XNN_HEADER_LENGTH} bytes"
        )
    length, fb_off, fb_size, cd_off, cd_size = struct.unpack_from("<HIIIQ", head, 8)
    if strict and length < XNN_HEADER_LENGTH:
        raise FormatError(source, "XNNHeader.length", length, f">= {XNN_HEADER_LENGTH}")
    if fb_size < 8 or fb_off + fb_size > blob_size:
        raise FormatError(
            source,
            "XNNHeader.flatbuffer_size",
            fb_size,
            f">= 8 with flatbuffer_offset {fb_off} + size inside the {blob_size}-byte blob",
        )
    if fb_off < length:
        raise FormatError(
            source, "XNNHeader.flatbuffer_offset", fb_off, f">= the header length {length}"
        )
    if cd_off < fb_off + fb_size or cd_off + cd_size > blob_size:
        raise FormatError(
            source,
            "XNNHeader.constant_data_offset",
            cd_off,
            f"after the FlatBuffer (>= {fb_off + fb_size}) with the {cd_size}-byte constant "
            f"data inside the {blob_size}-byte blob",
        )
    return XnnHeader(fb_off, fb_size, cd_off, cd_size)


def xnngraph_span(
    head: bytes | bytearray | memoryview, blob_size: int, source: str, *, strict: bool = True
) -> tuple[int, int]:
    """``(offset, size)`` of the XNNGraph FlatBuffer inside a blob of ``blob_size`` bytes
    (``strict``: as for :func:`parse_xnn_header`)."""
    hdr = parse_xnn_header(head, blob_size, source, strict=strict)
    if hdr is None:
        return 0, blob_size
    return hdr.flatbuffer_offset, hdr.flatbuffer_size


def check_identifier(first: bytes | bytearray | memoryview, source: str) -> None:
    """Refuse an XNNGraph FlatBuffer whose first 8 bytes (``first``, fewer when it is
    shorter) do not end with ``XN01`` or ``XN00``: the runtime refuses it (0x30)."""
    if len(first) < 8 or bytes(first[4:8]) not in XNN_IDENTIFIERS:
        raise FormatError(
            source,
            "XNNGraph file identifier (bytes 4..8)",
            bytes(first[4:8]),
            "b'XN01' or b'XN00'",
        )


def blob_source(c: Container, d: Delegate, where: str) -> str:
    """``'model.pte (XnnpackBackend blob of forward[0], segment 1)'``, for messages."""
    return f"{c.source} ({XNNPACK_BACKEND_ID} blob of {d.method}[{d.position}], {where})"


def check_xnnpack_blobs(c: Container, metadata: Buffer, loader: DataLoader) -> None:
    """Check the header and graph identifier of every distinct XNNPACK delegate blob of
    a .pte (two reads of at most 30 and 8 bytes each; an inline blob is in
    ``metadata``), as the runtime does when it loads the method: a blob it refuses
    (another magic, a FlatBuffer or constant data outside the blob or overlapping, an
    identifier other than ``XN01``/``XN00``, a delegate pointing at a weight) is a
    :class:`FormatError` naming the blob, field, value and limit. A header length
    below 30 the runtime does not check: nor does this (``inspect`` does)."""
    seen: set[tuple[int, int]] = set()
    for d in c.delegates:
        if d.id != XNNPACK_BACKEND_ID:
            continue
        if d.location == "segment":
            seg = c.segments[d.index]
            start, size, inline = c.absolute(seg), seg.size, None
            where = f"segment {d.index}"
        else:
            start, size = c.inline_delegate_data[d.index]  # the metadata starts at byte 0
            inline = memoryview(metadata)[start : start + size]
            where = f"inline data {d.index}"
        if (start, size) in seen:
            continue
        seen.add((start, size))
        src = blob_source(c, d, where)
        n = min(size, XNN_HEADER_LENGTH)
        head = inline[:n] if inline is not None else bytes(loader.load(start, n))
        off, fb_size = xnngraph_span(head, size, src, strict=False)
        n = min(fb_size, 8)
        if inline is not None:
            first: Buffer = inline[off : off + n]
        else:
            first = head[off : off + n] if off + n <= len(head) else loader.load(start + off, n)
        check_identifier(first, src)
