"""The container headers, byte for byte: constants, decoding, validation, encoding.

Both containers start with a FlatBuffer root offset ``[0, 4)`` and a file identifier
``[4, 8)``; a header follows at :data:`HEADER_OFFSET`:

- ``.pte`` (``ET12``): the optional extended header ``eh00`` (:class:`PteHeader`);
- ``.ptd`` (``FT01``): the FlatTensor header ``FH01`` (:class:`PtdHeader`), always present.

Every integer is little-endian. This is the only module that knows the header layouts;
the parser decodes with :meth:`PteHeader.from_bytes` / :meth:`PtdHeader.from_bytes`
and the patcher encodes with ``to_bytes``. :class:`FileHead` decodes the first bytes of
a file once: its kind, its header and where its metadata ends.

Decoding reads only the bytes the header occupies, so a file shorter than
:data:`HEAD_BYTES` is fine, and every short, truncated or hostile input raises
:class:`~ptestore.errors.FormatError` naming the source, field, value and limit.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Literal

from .._align import align_up, is_power_of_two
from .._dataclass import dataclass
from ..errors import FormatError
from ..storage.types import Buffer

__all__ = [
    "HEADER_OFFSET",
    "HEAD_BYTES",
    "Buffer",
    "I32",
    "MAX_FLATBUFFER",
    "PTD_FILE_IDENTIFIER",
    "PTD_FLATBUFFER_OFFSET_POS",
    "PTD_FLATBUFFER_SIZE_POS",
    "PTD_HEADER_LENGTH",
    "PTD_HEADER_MAGIC",
    "PTD_SEGMENT_BASE_OFFSET_POS",
    "PTD_SEGMENT_DATA_SIZE_POS",
    "PTE_FILE_IDENTIFIER",
    "PTE_HEADER_LENGTH",
    "PTE_HEADER_MAGIC",
    "PTE_HEADER_MIN_LENGTH",
    "PTE_PROGRAM_SIZE_POS",
    "PTE_SEGMENT_BASE_OFFSET_POS",
    "PTE_SEGMENT_DATA_SIZE_POS",
    "SEGMENT_BASE_ALIGNMENT",
    "U8",
    "U16",
    "U32",
    "U64",
    "FileHead",
    "Kind",
    "PtdHeader",
    "PteHeader",
    "align_up",
    "detect_kind",
    "is_power_of_two",
]

Kind = Literal["pte", "ptd"]

#: Every fixed-width integer in both containers (FlatBuffer scalars too) is little-endian.
U8 = struct.Struct("<B")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
I32 = struct.Struct("<i")
U64 = struct.Struct("<Q")

#: Bytes enough for either header (the C++ runtime also reads 64).
HEAD_BYTES = 64
#: The largest FlatBuffer (its offsets are 32-bit, and signed where they point back: 2 GiB
#: less a byte): a header claiming a larger one is refused before the FlatBuffer is read.
MAX_FLATBUFFER = (1 << 31) - 1
#: Where the header starts: after the root offset and the file identifier.
HEADER_OFFSET = 8
#: Segment data starts at a multiple of this (the exporter's ``segment_alignment``).
SEGMENT_BASE_ALIGNMENT = 128

# Common to both headers: [8, 12) magic, [12, 16) uint32 length (magic and length included).
_MAGIC_END = HEADER_OFFSET + 4
_LENGTH_END = _MAGIC_END + 4

PTE_FILE_IDENTIFIER = b"ET12"
PTE_HEADER_MAGIC = b"eh00"
#: Headers written before ExecuTorch 1.0 are 24 bytes long (no segment_data_size).
PTE_HEADER_MIN_LENGTH = 24
#: The length ExecuTorch 1.0 and later write; segment_data_size is read from this length on.
PTE_HEADER_LENGTH = 32
PTE_PROGRAM_SIZE_POS = 16
PTE_SEGMENT_BASE_OFFSET_POS = 24
PTE_SEGMENT_DATA_SIZE_POS = 32

PTD_FILE_IDENTIFIER = b"FT01"
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_LENGTH = 40
PTD_FLATBUFFER_OFFSET_POS = 16
PTD_FLATBUFFER_SIZE_POS = 24
PTD_SEGMENT_BASE_OFFSET_POS = 32
PTD_SEGMENT_DATA_SIZE_POS = 40


def _u32(buf: Buffer, pos: int) -> int:
    return int(U32.unpack_from(buf, pos)[0])


def _u64(buf: Buffer, pos: int) -> int:
    return int(U64.unpack_from(buf, pos)[0])


def _require(buf: Buffer, end: int, file_size: int, source: str, what: str) -> None:
    """Bytes ``[0, end)`` must exist in the file and in ``buf`` (its first bytes)."""
    if end > file_size:
        raise FormatError(source, "file size", file_size, f">= {end} bytes ({what} ends at {end})")
    if len(buf) < end:
        raise FormatError(
            source,
            "header bytes",
            len(buf),
            f">= {end} (the first bytes of the {file_size}-byte file, to read {what})",
            "the buffer handed to the parser is truncated",
        )


def _check_length(length: int, minimum: int, file_size: int, source: str, name: str) -> None:
    if length < minimum:
        raise FormatError(source, f"{name} length", length, f">= {minimum} bytes")
    if HEADER_OFFSET + length > file_size:
        raise FormatError(
            source,
            f"{name} length",
            length,
            f"<= {file_size - HEADER_OFFSET} (the header must fit inside the "
            f"{file_size}-byte file)",
        )


def _check_data_size(source: str, name: str, base: int, data_size: int, file_size: int) -> None:
    if base + data_size > file_size:
        raise FormatError(
            source,
            f"{name} segment_data_size",
            data_size,
            f"<= {file_size - base} (segment_base_offset {base} + size must not pass the end "
            f"of the {file_size}-byte file)",
        )


def _check_flatbuffer(source: str, field: str, size: int) -> None:
    if size > MAX_FLATBUFFER:
        raise FormatError(
            source,
            field,
            size,
            f"<= {MAX_FLATBUFFER} (a FlatBuffer's offsets are 32-bit: it is under 2 GiB)",
        )


@dataclass(frozen=True)
class PteHeader:
    """The .pte extended header (``eh00``) spliced in after the FlatBuffer identifier."""

    length: int
    #: FlatBuffer size measured from byte 0 (headers included).
    program_size: int
    #: Absolute offset of the first segment; 0 if there is none.
    segment_base_offset: int
    #: None when the header predates the field (length < 32, before ExecuTorch 1.0).
    segment_data_size: int | None

    NAME: ClassVar[str] = "extended header"

    @classmethod
    def from_bytes(cls, buf: Buffer, file_size: int, source: str) -> PteHeader | None:
        """Decode and validate the header from the file's first bytes; None when the file
        has none (bytes 8..12 are not ``eh00``: they are FlatBuffer bytes then)."""
        if file_size < _MAGIC_END:
            return None
        _require(buf, _MAGIC_END, file_size, source, f"the {cls.NAME} magic")
        if bytes(buf[HEADER_OFFSET:_MAGIC_END]) != PTE_HEADER_MAGIC:
            return None
        _require(buf, _LENGTH_END, file_size, source, f"the {cls.NAME} length")
        length = _u32(buf, _MAGIC_END)
        _check_length(length, PTE_HEADER_MIN_LENGTH, file_size, source, cls.NAME)
        has_data_size = length >= PTE_HEADER_LENGTH
        end = PTE_SEGMENT_DATA_SIZE_POS + (8 if has_data_size else 0)
        _require(buf, end, file_size, source, f"the {cls.NAME} fields")
        header = cls(
            length=length,
            program_size=_u64(buf, PTE_PROGRAM_SIZE_POS),
            segment_base_offset=_u64(buf, PTE_SEGMENT_BASE_OFFSET_POS),
            segment_data_size=_u64(buf, PTE_SEGMENT_DATA_SIZE_POS) if has_data_size else None,
        )
        header.validate(file_size, source)
        return header

    def validate(self, file_size: int, source: str) -> None:
        """Raise :class:`FormatError` unless the header fits a ``file_size``-byte file."""
        _check_length(self.length, PTE_HEADER_MIN_LENGTH, file_size, source, self.NAME)
        header_end = HEADER_OFFSET + self.length
        if not header_end <= self.program_size <= file_size:
            raise FormatError(
                source,
                f"{self.NAME} program_size",
                self.program_size,
                f"in [{header_end}, {file_size}] (after the header and inside the file)",
            )
        base = self.segment_base_offset
        if base != 0 and not self.program_size <= base <= file_size:
            raise FormatError(
                source,
                f"{self.NAME} segment_base_offset",
                base,
                f"0 or in [{self.program_size}, {file_size}] (after the program, inside the file)",
            )
        if self.segment_data_size is not None:
            _check_data_size(source, self.NAME, base, self.segment_data_size, file_size)
        _check_flatbuffer(source, f"{self.NAME} program_size", self.program_size)

    def to_bytes(self) -> bytes:
        """The header fields as they stand at ``[8, 8 + n)``: magic, length, program_size,
        segment_base_offset and (for 32-byte and longer headers) segment_data_size.
        Bytes of a longer header past these fields are not included."""
        out = (
            PTE_HEADER_MAGIC
            + U32.pack(self.length)
            + U64.pack(self.program_size)
            + U64.pack(self.segment_base_offset)
        )
        if self.segment_data_size is not None:
            out += U64.pack(self.segment_data_size)
        return out


@dataclass(frozen=True)
class PtdHeader:
    """The .ptd FlatTensor header (``FH01``)."""

    length: int
    #: Absolute offset of the FlatBuffer (after the header).
    flatbuffer_offset: int
    #: FlatBuffer size, header excluded.
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int

    NAME: ClassVar[str] = "FlatTensor header"

    @classmethod
    def from_bytes(cls, buf: Buffer, file_size: int, source: str) -> PtdHeader:
        """Decode and validate the header from the file's first bytes."""
        _require(buf, min(_MAGIC_END, file_size), file_size, source, f"the {cls.NAME} magic")
        magic = bytes(buf[HEADER_OFFSET:_MAGIC_END])
        if magic != PTD_HEADER_MAGIC:
            raise FormatError(
                source, f"{cls.NAME} magic (bytes 8..12)", magic, repr(PTD_HEADER_MAGIC)
            )
        _require(buf, _LENGTH_END, file_size, source, f"the {cls.NAME} length")
        length = _u32(buf, _MAGIC_END)
        _check_length(length, PTD_HEADER_LENGTH, file_size, source, cls.NAME)
        end = PTD_SEGMENT_DATA_SIZE_POS + 8
        _require(buf, end, file_size, source, f"the {cls.NAME} fields")
        header = cls(
            length=length,
            flatbuffer_offset=_u64(buf, PTD_FLATBUFFER_OFFSET_POS),
            flatbuffer_size=_u64(buf, PTD_FLATBUFFER_SIZE_POS),
            segment_base_offset=_u64(buf, PTD_SEGMENT_BASE_OFFSET_POS),
            segment_data_size=_u64(buf, PTD_SEGMENT_DATA_SIZE_POS),
        )
        header.validate(file_size, source)
        return header

    @property
    def metadata_end(self) -> int:
        """End of the FlatBuffer: bytes ``[0, metadata_end)`` are the metadata region."""
        return self.flatbuffer_offset + self.flatbuffer_size

    def validate(self, file_size: int, source: str) -> None:
        """Raise :class:`FormatError` unless the header fits a ``file_size``-byte file."""
        _check_length(self.length, PTD_HEADER_LENGTH, file_size, source, self.NAME)
        header_end = HEADER_OFFSET + self.length
        fb_off = self.flatbuffer_offset
        if not header_end <= fb_off <= file_size:
            raise FormatError(
                source,
                f"{self.NAME} flatbuffer_offset",
                fb_off,
                f"in [{header_end}, {file_size}] (after the header, inside the file)",
            )
        if self.metadata_end > file_size:
            raise FormatError(
                source,
                f"{self.NAME} flatbuffer_size",
                self.flatbuffer_size,
                f"<= {file_size - fb_off} (flatbuffer_offset {fb_off} + size must fit in the "
                f"{file_size}-byte file)",
            )
        base = self.segment_base_offset
        if not self.metadata_end <= base <= file_size:
            raise FormatError(
                source,
                f"{self.NAME} segment_base_offset",
                base,
                f"in [{self.metadata_end}, {file_size}] (after the FlatBuffer, inside the file)",
            )
        _check_data_size(source, self.NAME, base, self.segment_data_size, file_size)
        _check_flatbuffer(source, f"{self.NAME} flatbuffer_size", self.flatbuffer_size)

    def to_bytes(self) -> bytes:
        """The 40 header bytes at ``[8, 48)``."""
        return (
            PTD_HEADER_MAGIC
            + U32.pack(self.length)
            + U64.pack(self.flatbuffer_offset)
            + U64.pack(self.flatbuffer_size)
            + U64.pack(self.segment_base_offset)
            + U64.pack(self.segment_data_size)
        )


def detect_kind(buf: Buffer, file_size: int, source: str) -> Kind:
    """``"pte"`` or ``"ptd"`` from the FlatBuffer file identifier at bytes 4..8."""
    if file_size < HEADER_OFFSET:
        raise FormatError(
            source, "file size", file_size, f">= {HEADER_OFFSET} bytes (root offset + identifier)"
        )
    _require(buf, HEADER_OFFSET, file_size, source, "the file identifier")
    ident = bytes(buf[4:HEADER_OFFSET])
    if ident == PTE_FILE_IDENTIFIER:
        return "pte"
    if ident == PTD_FILE_IDENTIFIER:
        return "ptd"
    raise FormatError(
        source,
        "file identifier (bytes 4..8)",
        ident,
        f"{PTE_FILE_IDENTIFIER!r} (.pte Program) or {PTD_FILE_IDENTIFIER!r} (.ptd FlatTensor)",
        _CHANGING_HINT if ident == CHANGING_IDENTIFIER else None,
    )


#: What ptestore's in-place run writes in place of the identifier while it changes the
#: file (``ptestore.journal_check.CHANGING``; the format floor cannot import it).
CHANGING_IDENTIFIER = b"PTJ~"
_CHANGING_HINT = (
    "marked as being changed in place: an in-place run was interrupted while it rewrote "
    "the file. If a journal is beside this name (.NAME.ptestore-jrnl2, or "
    ".NAME.ptestore-journal of an older ptestore), `ptestore inspect` of this name "
    "completes the file from it; if the run used another name of this file (a hard "
    "link), `ptestore inspect` of that name does; if no journal is beside either name, "
    "restore the model from its portable source (a new copy of the original .pte)"
)


@dataclass(frozen=True)
class FileHead:
    """What a container's first bytes say, decoded once per read."""

    source: str
    file_size: int
    kind: Kind
    header: PteHeader | PtdHeader | None

    @classmethod
    def from_bytes(cls, buf: Buffer, file_size: int, source: str) -> FileHead:
        """Decode the identifier and header from the first bytes of the file
        (:data:`HEAD_BYTES` of them, or the whole file if shorter, are always enough)."""
        kind = detect_kind(buf, file_size, source)
        header: PteHeader | PtdHeader | None
        if kind == "pte":
            header = PteHeader.from_bytes(buf, file_size, source)
        else:
            header = PtdHeader.from_bytes(buf, file_size, source)
        if header is None:  # a .pte without an extended header is one FlatBuffer
            _check_flatbuffer(
                source, "file size (a .pte without an extended header is one FlatBuffer)", file_size
            )
        return cls(source, file_size, kind, header)

    @property
    def metadata_size(self) -> int:
        """How many leading bytes hold the headers and the FlatBuffer."""
        if isinstance(self.header, PteHeader):
            return self.header.program_size
        if isinstance(self.header, PtdHeader):
            return self.header.metadata_end
        return self.file_size
