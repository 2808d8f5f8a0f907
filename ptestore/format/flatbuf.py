"""A bounds-checked view over FlatBuffer tables.

The ``flatbuffers`` Python runtime has no verifier: it happily follows negative or
out-of-range offsets (``struct.unpack_from`` reads from the end for negative positions
and raises a bare ``struct.error`` past the end). This module reads tables itself
(vtable slot ``4 + 2 * field id``, every scalar little-endian), checks every offset,
vtable and vector *before* reading at it, and turns every violation into a
:class:`~ptestore.errors.FormatError` that names the source, the field path, the value
and the limit.

It also enforces a work budget, so a hostile buffer whose tables all alias one huge
vector cannot make a parse take quadratic time or materialize more bytes than the
buffer holds many times over. Views of several FlatBuffers of one file (its XNNPACK
graphs) can also share one :class:`WorkBudget`, so buffers that overlap in the file
cannot multiply the work either.

Every byte range read is recorded in :attr:`FlatView.read_spans` (except reads made with
``track=False``: the fields the patch engine rewrites), so the parser can check that
the patch engine never writes into bytes that something else was read from; a view
made with ``track=False`` records nothing (a FlatBuffer nobody patches: the program's
tensors, the XNNPACK graphs).

The reads every table and field take (a table's vtable offset, size and object size, a
vtable entry, the offset a table, string or vector field holds) are made inline where a
check already made puts them inside the buffer; every other read is checked first, and
every violation raises the same error in either case. About a microsecond per read
counts here: a 1000-tensor program's graphs take tens of thousands.
"""

from __future__ import annotations

import struct

from .._dataclass import dataclass
from ..errors import FormatError
from .header import I32, U8, U16, U32, U64, Buffer

__all__ = ["FlatView", "TableView", "Vector", "WorkBudget"]

#: Scalar kinds a table field can be read as.
_SCALARS: dict[str, struct.Struct] = {
    "u8": U8,
    "i8": struct.Struct("<b"),
    "u16": U16,
    "u32": U32,
    "i32": I32,
    "u64": U64,
}


class WorkBudget:
    """Element visits and bytes materialized that the reads of several FlatBuffers of
    one file may spend together (``allowance`` of each), e.g. ``4096 + 4 * size`` for
    the XNNPACK graphs of a ``size``-byte file (``what`` names it in the error)."""

    def __init__(self, allowance: int, what: str) -> None:
        self.allowance = allowance
        self.what = what
        self._visits_left = allowance
        self._bytes_left = allowance

    def spend(self, source: str, visits: int, nbytes: int, field: str) -> None:
        """Charge the budget; raise a FormatError naming ``source`` and ``field`` when
        the reads would exceed it."""
        self._visits_left -= visits
        self._bytes_left -= nbytes
        if self._visits_left < 0 or self._bytes_left < 0:
            raise FormatError(
                source,
                field,
                "aliased data",
                f"at most {self.allowance} element reads / bytes for {self.what}",
                "buffers overlap or share tables so often that reading them would take "
                "unbounded work",
            )


class FlatView:
    """A FlatBuffer in ``buf[0:limit]`` plus the source name used in errors; ``budget``,
    when given, is charged too (one shared by every FlatBuffer of a file)."""

    def __init__(
        self,
        buf: Buffer,
        source: str,
        *,
        limit: int,
        budget: WorkBudget | None = None,
        track: bool = True,
    ) -> None:
        self.buf = buf
        self.source = source
        self.limit = limit
        # Work budget: element visits and bytes materialized, proportional to the input.
        self._visits_left = 4096 + 2 * limit
        self._bytes_left = 4096 + 2 * limit
        self.budget = budget
        #: ``(position, size)`` of every tracked read (none when ``track`` is false).
        self.read_spans: set[tuple[int, int]] = set()
        self.track = track

    # -- raw reads -----------------------------------------------------------------
    def _need(self, pos: int, size: int, field: str) -> None:
        if pos < 0 or pos + size > self.limit:
            raise FormatError(
                self.source,
                field,
                pos,
                f"a position with {size} readable bytes inside the FlatBuffer [0, {self.limit})",
            )

    def read(self, kind: str, pos: int, field: str, *, track: bool = True) -> int:
        """The little-endian scalar ``kind`` (``"u8"``, ``"u32"``, ...) at ``pos``
        (recorded in :attr:`read_spans` unless ``track`` is false)."""
        fmt = _SCALARS[kind]
        size = fmt.size
        if pos < 0 or pos + size > self.limit:
            self._need(pos, size, field)
        if track and self.track:
            self.read_spans.add((pos, size))
        return int(fmt.unpack_from(self.buf, pos)[0])

    def _u16_at(self, pos: int) -> int:
        """The u16 at ``pos``, which the caller has checked is inside the buffer."""
        if self.track:
            self.read_spans.add((pos, 2))
        return int(U16.unpack_from(self.buf, pos)[0])

    def _u32_at(self, pos: int) -> int:
        """The u32 at ``pos``, which the caller has checked is inside the buffer."""
        if self.track:
            self.read_spans.add((pos, 4))
        return int(U32.unpack_from(self.buf, pos)[0])

    def u16(self, pos: int, field: str) -> int:
        return self.read("u16", pos, field)

    def u32(self, pos: int, field: str) -> int:
        return self.read("u32", pos, field)

    def spend(self, visits: int, nbytes: int, field: str) -> None:
        """Charge the work budget; raise if a hostile buffer exhausts it."""
        self._visits_left -= visits
        self._bytes_left -= nbytes
        if self._visits_left < 0 or self._bytes_left < 0:
            raise FormatError(
                self.source,
                field,
                "aliased data",
                f"at most {2 * self.limit} element reads / bytes for a {self.limit}-byte "
                "FlatBuffer",
                "tables or vectors are shared so often that reading them would take unbounded work",
            )
        if self.budget is not None:
            self.budget.spend(self.source, visits, nbytes, field)

    # -- tables --------------------------------------------------------------------
    def root(self, field: str) -> TableView:
        off = self.u32(0, f"{field} root offset")
        return self.table_at(off, field)

    def table_at(self, pos: int, field: str) -> TableView:
        """Validate the table at ``pos`` (its soffset, vtable and object size)."""
        if pos < 8 or pos + 4 > self.limit:
            raise FormatError(
                self.source, f"{field} (table position)", pos, f"in [8, {self.limit - 4}]"
            )
        if pos % 4:
            raise FormatError(
                self.source, f"{field} (table position)", pos, "a multiple of 4 (table alignment)"
            )
        if self.track:
            self.read_spans.add((pos, 4))
        soff = int(I32.unpack_from(self.buf, pos)[0])  # pos + 4 <= limit, checked above
        vt = pos - soff
        if vt < 0 or vt + 4 > self.limit or vt % 2:
            raise FormatError(
                self.source,
                f"{field} (vtable position)",
                vt,
                f"an even position in [0, {self.limit - 4}]",
            )
        vt_size = self._u16_at(vt)  # vt + 4 <= limit, checked above
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.limit:
            raise FormatError(
                self.source,
                f"{field} (vtable size)",
                vt_size,
                f"an even number >= 4 with the vtable ending by {self.limit}",
            )
        obj_size = self._u16_at(vt + 2)
        if obj_size < 4 or pos + obj_size > self.limit:
            raise FormatError(
                self.source,
                f"{field} (table size)",
                obj_size,
                f">= 4 and the table [{pos}, {pos}+size) inside the FlatBuffer [0, {self.limit})",
            )
        self.spend(1, 0, field)
        return TableView(self, pos, vt, vt_size, field)


@dataclass(frozen=True)
class Vector:
    """A validated vector: ``length`` elements of ``elem_size`` bytes from ``start``."""

    view: FlatView
    start: int  # position of the first element (after the length prefix)
    length: int
    elem_size: int
    field: str

    def elem_pos(self, i: int) -> int:
        return self.start + i * self.elem_size

    def table(self, i: int, *, track: bool = True) -> TableView:
        """Element ``i`` of a vector of tables (each element a uoffset; its read is
        recorded unless ``track`` is false)."""
        view = self.view
        pos = self.start + i * self.elem_size
        field = f"{self.field}[{i}]"
        if 0 <= i < self.length and self.elem_size >= 4:  # inside the vector, checked
            if track and view.track:
                view.read_spans.add((pos, 4))
            rel = int(U32.unpack_from(view.buf, pos)[0])
        else:
            rel = view.read("u32", pos, field, track=track)
        return view.table_at(pos + rel, field)

    def u64s(self) -> list[int]:
        self.view.spend(self.length, 8 * self.length, self.field)
        return [self.view.read("u64", self.elem_pos(i), self.field) for i in range(self.length)]

    def i32s(self) -> list[int]:
        self.view.spend(self.length, 4 * self.length, self.field)
        return [self.view.read("i32", self.elem_pos(i), self.field) for i in range(self.length)]

    def u8s(self) -> bytes:
        self.view.spend(1, self.length, self.field)
        if self.length and self.view.track:
            self.view.read_spans.add((self.start, self.length))
        return bytes(self.view.buf[self.start : self.start + self.length])


def _read_string(view: FlatView, pos: int, field: str) -> str:
    if pos < 0 or pos + 4 > view.limit:
        view._need(pos, 4, f"{field} (string length)")
    n = view._u32_at(pos)
    if pos + 4 + n + 1 > view.limit:
        raise FormatError(
            view.source,
            f"{field} (string length)",
            n,
            f"<= {max(0, view.limit - pos - 5)} (the string and its NUL must end inside the "
            f"FlatBuffer [0, {view.limit}))",
        )
    view.spend(1, n, field)
    if view.track:
        view.read_spans.add((pos + 4, n + 1))
    end = pos + 4 + n
    if view.buf[end] != 0:
        # The runtime's verifier (InternalConsistency) refuses such a file: error 0x23.
        raise FormatError(
            view.source,
            f"{field} (string terminator at {end})",
            view.buf[end],
            "0 (a FlatBuffer string ends with a NUL byte)",
        )
    raw = bytes(view.buf[pos + 4 : end])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # the bytes around the first invalid one (the value shown is cut to 32 bytes)
        lo = max(0, exc.start - 16)
        window = raw[lo : lo + 32]
        where = f"invalid byte {raw[exc.start]:#04x} at {exc.start} of {len(raw)}"
        if lo or len(raw) > 32:
            where += f"; bytes {lo}..{lo + len(window)} shown"
        raise FormatError(view.source, field, window, "valid UTF-8", where) from None


class TableView:
    """A validated table; field ids follow the schema's declaration order."""

    def __init__(self, view: FlatView, pos: int, vtable: int, vt_size: int, field: str) -> None:
        self.view = view
        self.pos = pos
        self.vtable = vtable
        self.vt_size = vt_size
        self.field = field

    def field_pos(self, fid: int, name: str, size: int) -> int | None:
        """Absolute position of field ``fid`` if physically present, else None."""
        slot = 4 + 2 * fid
        if slot + 2 > self.vt_size:
            return None
        view = self.view
        entry = self.vtable + slot  # inside the vtable, checked when the table was made
        if view.track:
            view.read_spans.add((entry, 2))
        voff = int(U16.unpack_from(view.buf, entry)[0])
        if voff == 0:
            return None
        # Like the C++ verifier, require the field inside the buffer, not inside the
        # table's declared object size: real files exist whose u64 fields end past it.
        if voff < 4 or self.pos + voff + size > self.view.limit:
            raise FormatError(
                self.view.source,
                f"{self.field}.{name} (field offset)",
                voff,
                f">= 4 with the {size}-byte field inside the FlatBuffer [0, {self.view.limit}) "
                f"(table at {self.pos})",
            )
        return self.pos + voff

    def scalar(
        self, fid: int, name: str, kind: str, default: int = 0, *, track: bool = True
    ) -> int:
        """Field ``fid`` as scalar ``kind``; ``default`` when it is absent."""
        pos = self.field_pos(fid, name, _SCALARS[kind].size)
        if pos is None:
            return default
        return self.view.read(kind, pos, f"{self.field}.{name}", track=track)

    def table(self, fid: int, name: str) -> TableView | None:
        pos = self.field_pos(fid, name, 4)
        if pos is None:
            return None
        rel = self.view._u32_at(pos)  # field_pos checked its 4 bytes
        return self.view.table_at(pos + rel, f"{self.field}.{name}")

    def string(self, fid: int, name: str) -> str | None:
        pos = self.field_pos(fid, name, 4)
        if pos is None:
            return None
        rel = self.view._u32_at(pos)  # field_pos checked its 4 bytes
        return _read_string(self.view, pos + rel, f"{self.field}.{name}")

    def vector(self, fid: int, name: str, elem_size: int) -> Vector | None:
        """A vector field; returns None when absent. Validates the whole extent."""
        pos = self.field_pos(fid, name, 4)
        if pos is None:
            return None
        field = f"{self.field}.{name}"
        rel = self.view._u32_at(pos)  # field_pos checked its 4 bytes
        vpos = pos + rel
        if vpos + 4 > self.view.limit:  # vpos >= 0: pos and rel are
            self.view._need(vpos, 4, f"{field} (vector length)")
        n = self.view._u32_at(vpos)
        start = vpos + 4
        if start + n * elem_size > self.view.limit:
            raise FormatError(
                self.view.source,
                f"{field} (vector length)",
                n,
                f"<= {max(0, (self.view.limit - start) // elem_size)} "
                f"({elem_size}-byte elements from {start} must end inside the "
                f"FlatBuffer [0, {self.view.limit}))",
            )
        self.view.spend(1, 0, field)
        return Vector(self.view, start, n, elem_size, field)
