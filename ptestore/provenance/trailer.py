"""The provenance trailer: a small, self-describing, checksummed block after the last
segment of a .pte or .ptd, outside ``segment_data_size`` and ``program_size``, where
the ExecuTorch runtime never looks.

Layout (all integers little-endian)::

    [content_size bytes]  the container, exactly as laid out (nothing changed)
    [payload]             UTF-8 canonical JSON (sorted keys, no spaces)
    [footer, 64 bytes]
        [0, 8)    u64 content_size   where the trailer starts (end of the container)
        [8, 16)   u64 payload_size
        [16, 48)  SHA-256 of the payload
        [48, 52)  u32 format version (2; 1 is read: the same layout, a record
                  without chunk digests)
        [52, 56)  u32 footer size (64)
        [56, 64)  magic b"PTSTPROV"

A reader looks at the last 64 bytes: no magic means no trailer; a magic with any
inconsistent field (sizes that do not add up to the file size, a wrong checksum,
unparsable JSON, JSON nested more than :data:`MAX_RECORD_DEPTH` levels, a string that
is not UTF-8 text such as a lone surrogate escape) is a corrupt trailer and raises
:class:`~ptestore.errors.FormatError`. The payload is decoded once, when it is read.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from .._dataclass import dataclass, field
from .._jsondepth import bracket_depth
from ..errors import ConfigurationError, FormatError, StorageError
from ..storage.types import DataLoader, load_into

__all__ = [
    "FOOTER_SIZE",
    "MAGIC",
    "MAX_PAYLOAD_SIZE",
    "MAX_RECORD_DEPTH",
    "TRAILER_VERSION",
    "ContentView",
    "Trailer",
    "decode_footer",
    "decode_record",
    "encode_trailer",
    "read_trailer",
    "without_any_trailer",
    "without_trailer",
]

MAGIC = b"PTSTPROV"
TRAILER_VERSION = 2
#: Footer versions a reader accepts (1: written before chunk digests, same layout).
READ_VERSIONS = (1, 2)
FOOTER_SIZE = 64
#: A trailer's JSON may not exceed this (it is metadata, not data).
MAX_PAYLOAD_SIZE = 1 << 20
#: Levels of JSON arrays and objects a record may nest (the record itself is level 1;
#: a device's options, at level 3, may nest ``MAX_OPTIONS_DEPTH`` levels of their own).
MAX_RECORD_DEPTH = 64
#: Bytes read from the end at once: most trailers fit, so one ranged read is enough.
_TAIL_READ = 4096

_FOOTER = struct.Struct("<QQ32sII8s")
assert _FOOTER.size == FOOTER_SIZE


@dataclass(frozen=True)
class Trailer:
    """A trailer read from a file."""

    #: Offset where the trailer starts: the size of the container without it.
    content_size: int
    payload: bytes
    sha256: str
    #: The footer's format version (1 for a trailer written before chunk digests).
    version: int = TRAILER_VERSION
    #: The payload decoded (by :func:`read_trailer`); None: decoded on first use.
    decoded: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """Bytes the trailer occupies (payload + footer)."""
        return len(self.payload) + FOOTER_SIZE

    def record(self) -> dict[str, Any]:
        """The payload as a JSON object (checked when the trailer was read); a copy the
        caller may change."""
        import copy

        if self.decoded is None:
            return decode_record(self.payload, "<trailer>")
        return copy.deepcopy(self.decoded)  # nesting bounded by MAX_RECORD_DEPTH

    def raw(self) -> bytes:
        """The trailer's bytes as they are in the file (payload and footer)."""
        footer = _FOOTER.pack(
            self.content_size,
            len(self.payload),
            bytes.fromhex(self.sha256),
            self.version,
            FOOTER_SIZE,
            MAGIC,
        )
        return self.payload + footer


def encode_trailer(payload: dict[str, Any], content_size: int) -> bytes:
    """The trailer bytes for ``payload`` placed after ``content_size`` bytes."""
    if content_size < 0:
        raise ValueError(f"content_size must be >= 0, got {content_size}")
    import hashlib
    import json

    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        body = text.encode()
    except UnicodeEncodeError:  # a string the record's makers did not check (a backstop)
        raise ConfigurationError(
            f"provenance field {_not_utf8(payload)} is not valid UTF-8 text (a lone "
            "surrogate: bytes that were not UTF-8, decoded with surrogateescape); "
            "provenance records JSON"
        ) from None
    if len(body) > MAX_PAYLOAD_SIZE:
        raise ConfigurationError(
            f"provenance payload is {len(body)} bytes; the limit is {MAX_PAYLOAD_SIZE}"
        )
    footer = _FOOTER.pack(
        content_size,
        len(body),
        hashlib.sha256(body).digest(),
        TRAILER_VERSION,
        FOOTER_SIZE,
        MAGIC,
    )
    return body + footer


def _not_utf8(payload: dict[str, Any]) -> str:
    """Where the first string (a key or a value) of ``payload`` that is not UTF-8 is:
    ``requested[0].spec (character '\\udcff' at index 3)``."""
    todo: list[tuple[str, object]] = [("", payload)]
    while todo:
        path, value = todo.pop()
        items: list[tuple[str, object]] = []
        if isinstance(value, dict):
            for k, v in value.items():
                name = str(k).encode("utf-8", "backslashreplace").decode()  # printable
                name = f"{path}.{name}" if path else name
                items += [(name, k), (name, v)]
        elif isinstance(value, (list, tuple)):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                at = exc.start
                return f"{path or '(the record)'} (character {value[at]!r} at index {at})"
        todo.extend(reversed(items))
    return "(unknown)"


def decode_footer(
    footer: bytes | bytearray | memoryview, file_size: int, source: str
) -> tuple[int, int, bytes] | None:
    """``(content_size, payload_size, sha256)`` of a footer (the last 64 bytes of a
    ``file_size``-byte file), None when it carries no magic."""
    if len(footer) != FOOTER_SIZE:
        raise ValueError(f"{source}: a footer is {FOOTER_SIZE} bytes, got {len(footer)}")
    content_size, payload_size, digest, version, size, magic = _FOOTER.unpack(bytes(footer))
    if magic != MAGIC:
        return None
    where = f"provenance trailer at the end of the {file_size}-byte file"
    if version not in READ_VERSIONS:
        raise FormatError(source, "provenance trailer version", version, "1 or 2", where)
    if size != FOOTER_SIZE:
        raise FormatError(source, "provenance trailer footer size", size, f"{FOOTER_SIZE}", where)
    if payload_size > MAX_PAYLOAD_SIZE:
        raise FormatError(
            source, "provenance trailer payload_size", payload_size, f"<= {MAX_PAYLOAD_SIZE}", where
        )
    if content_size + payload_size + FOOTER_SIZE != file_size:
        raise FormatError(
            source,
            "provenance trailer content_size",
            content_size,
            f"{file_size - payload_size - FOOTER_SIZE} (file size {file_size} - payload "
            f"{payload_size} - footer {FOOTER_SIZE})",
            where,
        )
    return content_size, payload_size, bytes(digest)


def read_trailer(loader: DataLoader) -> Trailer | None:
    """The provenance trailer of the object behind ``loader``, or None if it has none.

    Raises :class:`~ptestore.errors.FormatError` for a damaged trailer (the checksum,
    the sizes or the JSON)."""
    size = loader.size()
    if size < FOOTER_SIZE:
        return None
    tail_size = min(size, _TAIL_READ)
    tail = bytes(loader.load(size - tail_size, tail_size))
    decoded = decode_footer(tail[-FOOTER_SIZE:], size, loader.name)
    if decoded is None:
        return None
    content_size, payload_size, digest = decoded
    version = _FOOTER.unpack(tail[-FOOTER_SIZE:])[3]
    if payload_size + FOOTER_SIZE <= tail_size:
        payload = tail[tail_size - FOOTER_SIZE - payload_size : tail_size - FOOTER_SIZE]
    else:
        payload = bytes(loader.load(content_size, payload_size))
    import hashlib  # a file with a trailer only: most sources have none

    actual = hashlib.sha256(payload).digest()
    if actual != digest:
        raise FormatError(
            loader.name,
            "provenance trailer checksum",
            actual.hex(),
            f"the SHA-256 recorded in the footer ({digest.hex()})",
            "the trailer was damaged",
        )
    value = decode_record(payload, loader.name)
    return Trailer(content_size, payload, digest.hex(), version, value)


def decode_record(payload: bytes, source: str) -> dict[str, Any]:
    """The JSON object ``payload`` holds; :class:`~ptestore.errors.FormatError` for
    anything else: invalid JSON, not an object, nested more than
    :data:`MAX_RECORD_DEPTH` levels, a string (or key) that is not UTF-8 text, or a
    number that is not finite (``NaN``, ``Infinity``, ``1e999``: Python's ``json`` reads
    them, JSON has none, and a report could not write them back as JSON)."""
    import json

    try:
        value = json.loads(payload, parse_constant=_NonFinite, parse_float=_finite_float)
    except RecursionError:
        value, depth = None, bracket_depth(payload)
    except ValueError as exc:
        raise FormatError(
            source, "provenance trailer payload", payload[:60], "a JSON object", str(exc)
        ) from None
    else:
        depth = _check_text(value, source)
    if depth > MAX_RECORD_DEPTH:
        raise FormatError(
            source,
            "provenance trailer payload (nesting depth)",
            depth,
            f"<= {MAX_RECORD_DEPTH} levels of arrays and objects",
        )
    if not isinstance(value, dict):
        raise FormatError(
            source, "provenance trailer payload", type(value).__name__, "a JSON object"
        )
    return value


class _NonFinite:
    """A number :func:`decode_record` read that is not finite (its text, as written):
    refused by :func:`_check_text`, which knows its field."""

    def __init__(self, text: str) -> None:
        self.text = text


def _finite_float(text: str) -> float | _NonFinite:
    number = float(text)
    return number if math.isfinite(number) else _NonFinite(text)


def _check_text(value: object, source: str) -> int:
    """The nesting depth of the JSON value ``value`` (walked without recursion); raises
    FormatError for a string or key that cannot be encoded as UTF-8, or a number that
    is not finite."""
    deepest = 0
    stack: list[tuple[object, str, int]] = [(value, "provenance", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _utf8(item, path, source)
            continue
        if isinstance(item, _NonFinite):
            raise FormatError(
                source,
                path,
                item.text,
                "a finite number",
                "JSON has no NaN or Infinity, and a provenance record is JSON",
            )
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, depth + 1)
        sep = " " if depth == 0 else "."
        if isinstance(item, dict):
            for key, sub in item.items():
                _utf8(key, f"{path} (a key)", source)
                stack.append((sub, f"{path}{sep}{key}", depth + 1))
        else:
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))
    return deepest


def _utf8(text: str, field: str, source: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FormatError(
            source,
            field,
            text[:60],
            "UTF-8 text",
            f"character {text[exc.start]!r} at index {exc.start} is a lone surrogate",
        ) from None


class ContentView:
    """A loader showing only the first ``content_size`` bytes of another one (the
    container without its trailer). Everything else is forwarded."""

    def __init__(
        self, inner: DataLoader, content_size: int, trailer: Trailer | None = None
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._size = content_size
        #: The trailer it hides, when :func:`without_trailer` read it.
        self.trailer = trailer

    def size(self) -> int:
        return self._size

    @property
    def hidden_bytes(self) -> int:
        """How many bytes of the object it hides (its trailer's, the last ones)."""
        return int(self.inner.size()) - self._size

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self._size:
            raise StorageError(
                f"{self.name}: read of {size} bytes at offset {offset} is outside the "
                f"container (size {self._size}, without its provenance trailer)"
            )

    def load(self, offset: int, size: int) -> bytes | bytearray | memoryview:
        self._check(offset, size)
        return self.inner.load(offset, size)

    def readinto(self, offset: int, buffer: memoryview) -> None:
        """``load`` into ``buffer`` (the inner loader's ``readinto`` where it has one)."""
        self._check(offset, buffer.nbytes)
        load_into(self.inner, offset, buffer)

    def view(self, offset: int, size: int) -> memoryview | bytes | bytearray:
        """A zero-copy view where the inner loader gives one (a local file's mapping:
        :meth:`~ptestore.storage.loaders.LocalFileLoader.view`), else ``load``."""
        self._check(offset, size)
        inner = getattr(self.inner, "view", None)
        return self.inner.load(offset, size) if inner is None else inner(offset, size)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # check_unchanged, fileno, path, etag, fs: the object is the same one.
        return getattr(self.inner, name)


def without_trailer(loader: DataLoader) -> DataLoader:
    """``loader`` itself when its object has no trailer, else a :class:`ContentView`
    that hides the trailer (so a re-specialized artifact gets a new trailer instead of
    two)."""
    trailer = read_trailer(loader)
    if trailer is None:
        return loader
    return ContentView(loader, trailer.content_size, trailer)


def without_any_trailer(loader: DataLoader) -> DataLoader:
    """:func:`without_trailer` for a reader that shows a file whatever its trailer is
    (``inspect``): a damaged trailer (wrong checksum, unknown footer version, an invalid
    record) hides what its footer says precedes it when that is within the file, else
    nothing (the whole file); what is wrong with it is for the caller to say
    (:func:`~ptestore.provenance.provenance_json` reports it). The footer's
    ``content_size`` may be the damage: ``inspect`` reads the whole file's container
    when the container does not parse where it says."""
    try:
        return without_trailer(loader)
    except FormatError:
        size = loader.size()  # >= FOOTER_SIZE: a smaller object has no trailer to damage
        content_size, _, _, _, _, magic = _FOOTER.unpack(
            bytes(loader.load(size - FOOTER_SIZE, FOOTER_SIZE))
        )  # decode_footer refused it: read as it is, the magic there (checked below)
        if magic == MAGIC and content_size <= size - FOOTER_SIZE:
            return ContentView(loader, content_size)
        return loader
