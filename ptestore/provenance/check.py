"""Check an artifact's bytes against its own provenance record, whole or a byte range:
each chunk (:mod:`.chunks`) that overlaps the range is hashed (in parallel for a local
file) and compared with the digest the record names, so a damaged byte is reported
with its chunk's range.

What a run trusts of a source's own trailer is in :mod:`.known`.

A version-1 record names only the whole content's SHA-256: it can be checked whole,
not by range.
"""

from __future__ import annotations

from .._dataclass import dataclass
from ..errors import ConfigurationError, FormatError
from ..storage.types import DataLoader

__all__ = ["BytesChecked", "check_bytes", "parse_range"]


@dataclass(frozen=True)
class BytesChecked:
    """What :func:`check_bytes` read: ``[start, end)`` of the content, widened to whole
    chunks (``chunks`` of them; 0 for a version-1 record, checked whole) and never past
    the content's end."""

    start: int
    end: int
    chunks: int


def parse_range(text: str) -> tuple[int, int]:
    """``"START:END"`` (bytes, END exclusive; either may be empty: the content's start
    or end, written as -1 for END) as ``(start, end)``."""
    head, sep, tail = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start = int(head) if head.strip() else 0
        end = int(tail) if tail.strip() else -1
    except ValueError:
        raise ConfigurationError(
            f"byte range {text!r}: expected START:END (bytes, END exclusive), e.g. 0:4194304"
        ) from None
    if start < 0 or (tail.strip() and end < 0):  # -1 is the end only when left empty
        raise ConfigurationError(
            f"byte range {text!r}: START and END must be >= 0 (byte offsets in the content; "
            "leave END empty for the end)"
        )
    return start, end


def check_bytes(loader: DataLoader, byte_range: tuple[int, int] | None = None) -> BytesChecked:
    """Check the bytes of the artifact behind ``loader`` (before its trailer) in
    ``byte_range`` (``(start, end)``, end exclusive, ``-1`` for the end; all when None)
    against its provenance record.

    Raises :class:`~ptestore.errors.FormatError` naming the first damaged chunk and its
    range (field ``content.chunks[i]``), or the whole content's SHA-256 for a version-1
    record (:class:`~ptestore.errors.PreconditionFailed` instead when the object was
    modified or replaced while it was read: nothing is said of its bytes);
    :class:`~ptestore.errors.ConfigurationError` for a range that starts at or past the
    content's end (an END past it is clipped to it: the result names the bytes checked)
    or ends before it starts, an empty range, a range of a version-1 record or an
    artifact without a record."""
    from .chunks import iter_mismatches
    from .record import Provenance
    from .trailer import read_trailer

    trailer = read_trailer(loader)
    prov = None if trailer is None else Provenance.of_trailer(trailer, loader.name)
    if trailer is None or prov is None or prov.content is None:
        raise ConfigurationError(
            f"{loader.name}: no provenance record names the digests of its bytes "
            "(made without provenance, or by an older ptestore): nothing to check them against"
        )
    content = prov.content
    size = trailer.content_size
    start, end = (0, size) if byte_range is None else byte_range
    if end == -1:
        end = size
    if start < 0 or end < start or (start >= size and end > start):
        raise ConfigurationError(
            f"{loader.name}: byte range {start}:{end} is outside the content: must be within "
            f"0:{size} (the bytes before the provenance trailer)"
        )
    if byte_range is not None and start == end:
        raise ConfigurationError(
            f"{loader.name}: byte range {start}:{end} is empty (END is exclusive): nothing "
            f"to check; give START < END within 0:{size}"
        )
    end = min(end, size)  # an END past the content is its end, as an empty END is
    chunks = content.chunks
    if chunks is None:
        if byte_range is not None and (start, end) != (0, size):
            raise ConfigurationError(
                f"{loader.name}: its provenance record (version 1) names no chunk digests: "
                f"only the whole content (0:{size}) can be checked, not {start}:{end}"
            )
        from .digest import content_digest

        got = content_digest(loader, size, like=content.sha256)
        if got.sha256 != content.sha256:
            loader.check_unchanged()  # modified or replaced while it was read: not damage
            raise FormatError(
                loader.name,
                "content.sha256",
                got.sha256,
                f"{content.sha256}, the SHA-256 of the {size} bytes before the trailer",
                "the bytes were damaged or changed after the record was made",
            )
        return BytesChecked(0, size, 0)
    for i, a, b, got_chunk in iter_mismatches(loader, chunks, start, end):
        loader.check_unchanged()  # modified or replaced while it was read: not damage
        raise FormatError(
            loader.name,
            f"content.chunks[{i}]",
            got_chunk.hex(),
            f"{chunks.digests[i].hex()}, the SHA-256 the record names for bytes {a}:{b}",
            f"a byte in {a}:{b} was damaged or changed after the record was made",
        )
    span = chunks.covering(start, end)
    first = chunks.span(span.start)[0] if span else start
    last = chunks.span(span.stop - 1)[1] if span else end
    return BytesChecked(first, last, len(span))
