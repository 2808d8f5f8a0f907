"""Property test: mutated real fixtures raise only FormatError, never anything else.

Bit flips, byte and word overwrites with hostile values (concentrated in the metadata,
where they matter), and truncations. Whatever parses must also describe, render, lay out
and patch without any other exception. ``PTESTORE_FUZZ_EXAMPLES`` sets the number of
cases (10,000 by default, as CI runs it).
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures import all_fixtures

from ptestore.coordinator import layout_file
from ptestore.errors import FormatError
from ptestore.format import parse, patch_metadata
from ptestore.inspection import describe, render_table

EXAMPLES = int(os.environ.get("PTESTORE_FUZZ_EXAMPLES", "10000"))

FILES: list[bytes] = []
for fx in all_fixtures():
    for path in (fx.pte_path, fx.ptd_path):
        if path is not None:
            FILES.append(path.read_bytes())

HOSTILE_U32 = [0, 1, 3, 4, 7, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFC, 0xFFFFFFFF, 0x10000]
HOSTILE_U64 = [0, 1, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 32, 1 << 40]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(FILES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "u32", "u64", "truncate", "header"]))
        hot = draw(st.booleans())
        if len(data) < 16:
            break
        limit = min(len(data), 4096) if hot else len(data)
        if kind == "flip":
            pos = draw(st.integers(0, limit - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            pos = draw(st.integers(0, limit - 1))
            data[pos] = draw(st.integers(0, 255))
        elif kind == "u32":
            pos = draw(st.integers(0, limit - 4)) & ~3
            value = draw(st.one_of(st.sampled_from(HOSTILE_U32), st.integers(0, 0xFFFFFFFF)))
            struct.pack_into("<I", data, pos, value)
        elif kind == "u64":
            pos = draw(st.integers(0, limit - 8)) & ~3
            value = draw(st.one_of(st.sampled_from(HOSTILE_U64), st.integers(0, (1 << 64) - 1)))
            struct.pack_into("<Q", data, pos, value)
        elif kind == "header":
            pos = draw(st.sampled_from([0, 12, 16, 24, 32, 40]))
            if pos + 8 <= len(data):
                value = draw(st.one_of(st.sampled_from(HOSTILE_U64), st.integers(0, len(data) * 2)))
                if pos >= 16:
                    struct.pack_into("<Q", data, pos, value & ((1 << 64) - 1))
                else:
                    struct.pack_into("<I", data, pos, value & 0xFFFFFFFF)
        else:
            data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated())
def test_mutations_raise_only_format_errors(data: bytes) -> None:
    try:
        c = parse(data, len(data), "fuzz.pte")
    except FormatError as exc:
        assert str(exc).startswith("fuzz.pte: ")
        return
    describe(c)
    render_table(c)
    try:
        placements, _ = layout_file(c, data, {})
        moved = [(off + 64, size) for off, size in placements]
        if c.header is not None:
            patch_metadata(c, data, moved, base_alignment=128)
    except FormatError:
        pass
