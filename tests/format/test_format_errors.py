"""Every malformed-input path raises FormatError with a message naming file, field,
value and limit. Messages are pinned here."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import flatbuffers
import pytest
from support import synth
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import FormatError, PteStoreError
from ptestore.format import metadata_size, parse, read_container
from ptestore.format.flatbuf import FlatView
from ptestore.storage.loaders import BytesLoader

MLP = get_fixture("mlp_xnnpack").pte_path
PTD = get_fixture("mlp_portable_ext").ptd_path
assert MLP is not None
assert PTD is not None


def pte() -> bytearray:
    return bytearray(MLP.read_bytes())


def ptd() -> bytearray:
    return bytearray(PTD.read_bytes())


def u32(buf: bytearray, pos: int, value: int) -> bytearray:
    struct.pack_into("<I", buf, pos, value)
    return buf


def u64(buf: bytearray, pos: int, value: int) -> bytearray:
    struct.pack_into("<Q", buf, pos, value)
    return buf


def raises(data: bytes | bytearray, pattern: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        parse(bytes(data), len(data), "model.pte")
    msg = str(info.value)
    assert re.fullmatch(pattern, msg), msg
    assert isinstance(info.value, PteStoreError)
    assert isinstance(info.value, ValueError)
    return info.value


def _program() -> tuple[bytearray, FlatView]:
    data = pte()
    view = FlatView(data, "x", limit=metadata_size(data[:64], len(data), "x"))
    return data, view


def method_name_pos() -> int:
    data, view = _program()
    root = view.root("Program")
    plans = root.vector(1, "execution_plan", 4)
    assert plans is not None
    plan = plans.table(0)
    pos = plan.field_pos(0, "name", 4)
    assert pos is not None
    return pos + struct.unpack_from("<I", data, pos)[0]


def segments_vector_pos() -> int:
    data, view = _program()
    root = view.root("Program")
    pos = root.field_pos(4, "segments", 4)
    assert pos is not None
    return pos + struct.unpack_from("<I", data, pos)[0]


def delegate_ref_fields() -> tuple[int | None, int | None]:
    _data, view = _program()
    root = view.root("Program")
    plans = root.vector(1, "execution_plan", 4)
    assert plans is not None
    delegates = plans.table(0).vector(7, "delegates", 4)
    assert delegates is not None
    ref = delegates.table(0).table(1, "processed")
    assert ref is not None
    return ref.field_pos(0, "location", 1), ref.field_pos(1, "index", 4)


def named_data_index_pos() -> int:
    _data, view = _program()
    root = view.root("Program")
    vec = root.vector(7, "named_data", 4)
    assert vec is not None
    pos = vec.table(0).field_pos(1, "segment_index", 4)
    assert pos is not None
    return pos


CASES: list[tuple[str, Callable[[], bytes | bytearray], str]] = [
    ("short file", lambda: pte()[:4], r"model\.pte: file size = 4: must be >= 8 bytes .*"),
    (
        "bad identifier",
        lambda: pte()[:4] + b"XXXX" + pte()[8:],
        r"model\.pte: file identifier \(bytes 4\.\.8\) = b'XXXX': must be b'ET12' \(\.pte "
        r"Program\) or b'FT01' \(\.ptd FlatTensor\)",
    ),
    (
        "header too short",
        lambda: u32(pte(), 12, 16),
        r"model\.pte: extended header length = 16: must be >= 24 bytes",
    ),
    (
        "header longer than file",
        lambda: u32(pte(), 12, 1 << 31),
        r"model\.pte: extended header length = 2147483648: must be <= 6040 \(the header must "
        r"fit inside the 6048-byte file\)",
    ),
    (
        "program_size past end",
        lambda: u64(pte(), 16, 1 << 40),
        r"model\.pte: extended header program_size = 1099511627776: must be in \[40, 6048\] "
        r"\(after the header and inside the file\)",
    ),
    (
        "base inside program",
        lambda: u64(pte(), 24, 100),
        r"model\.pte: extended header segment_base_offset = 100: must be 0 or in \[1448, 6048\] "
        r"\(after the program, inside the file\)",
    ),
    (
        "data size past end",
        lambda: u64(pte(), 32, 4513),
        r"model\.pte: extended header segment_data_size = 4513: must be <= 4512 "
        r"\(segment_base_offset 1536 \+ size must not pass the end of the 6048-byte file\)",
    ),
    (
        "program_size near 2**64",
        lambda: u64(pte(), 16, (1 << 64) - 1),
        r"model\.pte: extended header program_size = 18446744073709551615: must be in "
        r"\[40, 6048\] \(after the header and inside the file\)",
    ),
    (
        "base near 2**64",
        lambda: u64(pte(), 24, (1 << 64) - 128),
        r"model\.pte: extended header segment_base_offset = 18446744073709551488: must be 0 "
        r"or in \[1448, 6048\] \(after the program, inside the file\)",
    ),
    (
        "data size near 2**64",
        lambda: u64(pte(), 32, (1 << 64) - 1),
        r"model\.pte: extended header segment_data_size = 18446744073709551615: must be "
        r"<= 4512 \(segment_base_offset 1536 \+ size must not pass the end of the 6048-byte "
        r"file\)",
    ),
    (
        "truncated by one byte",
        lambda: pte()[:-1],
        r"model\.pte: extended header segment_data_size = 4512: must be <= 4511 .*",
    ),
    (
        "root offset out of range",
        lambda: u32(pte(), 0, 1 << 30),
        r"model\.pte: Program \(table position\) = 1073741824: must be in \[8, 1444\]",
    ),
    (
        "root offset misaligned",
        lambda: u32(pte(), 0, 61),
        r"model\.pte: Program \(table position\) = 61: must be a multiple of 4 .*",
    ),
    (
        "vtable outside",
        lambda: struct.pack_into("<i", (b := pte()), 60, -(1 << 20)) or b,
        r"model\.pte: Program \(vtable position\) = 1048636: must be an even position in "
        r"\[0, 1444\]",
    ),
    (
        "segments vector length",
        lambda: u32(pte(), segments_vector_pos(), 0x10000000),
        r"model\.pte: Program\.segments \(vector length\) = 268435456: must be <= \d+ "
        r"\(4-byte elements from \d+ must end inside the FlatBuffer \[0, 1448\)\)",
    ),
    (
        "method name length",
        lambda: u32(pte(), method_name_pos(), 0xFFFFFFF0),
        r"model\.pte: Program\.execution_plan\[0\]\.name \(string length\) = 4294967280: "
        r"must be <= \d+ \(the string and its NUL must end inside the FlatBuffer \[0, 1448\)\)",
    ),
    (
        "method name not utf-8",
        lambda: (
            (b := pte()).__setitem__(slice(method_name_pos() + 4, method_name_pos() + 5), b"\xff")
            or b
        ),
        r"model\.pte: Program\.execution_plan\[0\]\.name = b'\\xfforward': must be valid "
        r"UTF-8 \(invalid byte 0xff at 0 of 7\)",
    ),
    (
        "segment past end of file",
        lambda: u64(pte(), 528, 5000),
        r"model\.pte: Program\.segments\[4\]\.offset \+ size = 6024: must be <= 4512 "
        r"\(segment_base_offset 1536 \+ offset \+ size must not pass the end of the 6048-byte "
        r"file\)",
    ),
    (
        "segments without a base",
        lambda: u64(pte(), 24, 0),
        r"model\.pte: Program\.segments\[1\]\.size = 1184: must be 0 when segment_base_offset "
        r"is 0 \(the header places no segment data\)",
    ),
    (
        "named data index out of range",
        lambda: u32(pte(), named_data_index_pos(), 99),
        r"model\.pte: Program\.named_data\[0\]\.segment_index = 99: must be < 6 \(the number "
        r"of segments\), for key '[0-9a-f]{64}'",
    ),
    (
        "delegate segment index out of range",
        lambda: u32(pte(), delegate_ref_fields()[1] or 0, 42),
        r"model\.pte: Program\.execution_plan\[0\]\.delegates\[0\]\.processed\.index = 42: "
        r"must be < 6 \(the number of segments\) for a SEGMENT delegate of method 'forward'",
    ),
    (
        "delegate location invalid",
        lambda: (b := pte()).__setitem__(delegate_ref_fields()[0] or 0, 7) or b,
        r"model\.pte: Program\.execution_plan\[0\]\.delegates\[0\]\.processed\.location = 7: "
        r"must be 0 \(INLINE\) or 1 \(SEGMENT\)",
    ),
]


@pytest.mark.parametrize(("name", "make", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_pte_error_messages(name: str, make: Callable[[], bytearray], pattern: str) -> None:
    raises(make(), pattern)


def _walk(data: bytes, track: bool) -> tuple[object, set[tuple[int, int]]]:
    """What the table decoders read of ``data`` through a view that records its reads
    or not: their result or the error's message, and the spans recorded."""
    from ptestore.format.tables import (
        read_constant_segment,
        read_inline_data,
        read_methods,
        read_named_data,
        read_segments,
    )

    try:
        limit = metadata_size(data[:64], len(data), "model.pte")
    except FormatError as exc:
        return str(exc), set()
    view = FlatView(data, "model.pte", limit=limit, track=track)
    try:
        root = view.root("Program")
        segments, seg_of = read_segments(root, "pte")
        inline = read_inline_data(root)
        found: object = (
            segments,
            read_named_data(root, "pte", seg_of),
            read_methods(root, seg_of, len(inline)),
            read_constant_segment(root, segments, seg_of),
        )
    except FormatError as exc:
        found = str(exc)
    return found, view.read_spans


@pytest.mark.parametrize(
    "make", [pte, *(c[1] for c in CASES)], ids=["whole", *(c[0] for c in CASES)]
)
def test_a_view_that_records_no_reads_reads_and_refuses_the_same(
    make: Callable[[], bytearray],
) -> None:
    """``track=False`` (the tensor walks: nothing patches what they read) skips only the
    record of spans: the same values and, for every damaged program above, the same
    error."""
    data = bytes(make())
    tracked, spans = _walk(data, True)
    untracked, none = _walk(data, False)
    assert untracked == tracked
    assert none == set()
    if make is pte:
        assert spans and not isinstance(tracked, str)


PTD_CASES: list[tuple[str, Callable[[], bytes | bytearray], str]] = [
    (
        "bad magic",
        lambda: ptd()[:8] + b"XXXX" + ptd()[12:],
        r"model\.pte: FlatTensor header magic \(bytes 8\.\.12\) = b'XXXX': must be b'FH01'",
    ),
    (
        "short header",
        lambda: u32(ptd(), 12, 32),
        r"model\.pte: FlatTensor header length = 32: must be >= 40 bytes",
    ),
    (
        "flatbuffer offset",
        lambda: u64(ptd(), 16, 1 << 50),
        r"model\.pte: FlatTensor header flatbuffer_offset = 1125899906842624: must be in "
        r"\[48, 3744\] .*",
    ),
    (
        "flatbuffer size",
        lambda: u64(ptd(), 24, 1 << 20),
        r"model\.pte: FlatTensor header flatbuffer_size = 1048576: must be <= 3696 .*",
    ),
    (
        "base before metadata end",
        lambda: u64(ptd(), 32, 64),
        r"model\.pte: FlatTensor header segment_base_offset = 64: must be in \[512, 3744\] .*",
    ),
    (
        "flatbuffer size near 2**64",
        lambda: u64(ptd(), 24, (1 << 64) - 1),
        r"model\.pte: FlatTensor header flatbuffer_size = 18446744073709551615: must be "
        r"<= 3696 \(flatbuffer_offset 48 \+ size must fit in the 3744-byte file\)",
    ),
    (
        "base near 2**64",
        lambda: u64(ptd(), 32, (1 << 64) - 1),
        r"model\.pte: FlatTensor header segment_base_offset = 18446744073709551615: must be "
        r"in \[512, 3744\] \(after the FlatBuffer, inside the file\)",
    ),
    (
        "data past end",
        lambda: u64(ptd(), 40, 4000),
        r"model\.pte: FlatTensor header segment_data_size = 4000: must be <= 3232 .*",
    ),
]


@pytest.mark.parametrize(("name", "make", "pattern"), PTD_CASES, ids=[c[0] for c in PTD_CASES])
def test_ptd_error_messages(name: str, make: Callable[[], bytearray], pattern: str) -> None:
    raises(make(), pattern)


def test_truncated_metadata_buffer_is_a_format_error() -> None:
    from ptestore.format import parse_pte

    data = bytes(pte())
    with pytest.raises(FormatError) as info:
        parse_pte(data[:1000], len(data), "model.pte")
    assert str(info.value) == (
        "model.pte: program_size = 1448: must be <= 1000 (bytes available) "
        "(the buffer handed to the parser is truncated)"
    )


def _aliasing_bomb(n: int) -> bytes:
    """A headerless Program whose n plans all share one plan whose n delegates all share
    one delegate: n*n delegates from a few kilobytes."""
    b = flatbuffers.Builder(0)
    d = synth.delegate(b, "XnnpackBackend", segment=True)
    p = synth.plan(b, "forward", synth.offsets_vector(b, [d] * n))
    plans = synth.offsets_vector(b, [p] * n)
    b.StartObject(2)  # DataSegment (empty: offset and size absent)
    segment = b.EndObject()
    return synth.finish_program(b, plans, segments=synth.offsets_vector(b, [segment]))


def test_aliasing_bomb_is_refused_quickly() -> None:
    data = _aliasing_bomb(3000)
    assert len(data) < 64 * 1024
    with pytest.raises(FormatError, match=r"aliased data.*unbounded work"):
        parse(data, len(data), "bomb.pte")


def test_small_aliasing_is_fine() -> None:
    # Legitimate sharing within the budget still parses (it is valid FlatBuffer).
    data = _aliasing_bomb(3)
    c = parse(data, len(data), "ok.pte")
    assert c.methods == ("forward",) * 3
    assert len(c.delegates) == 9


def test_headerless_program_with_segment_bytes_is_refused() -> None:
    from ptestore.format.parsing import parse_pte

    # A well-formed file whose header we drop: segments claim bytes but there is no base.
    data = pte()
    data[8:12] = b"zz00"
    with pytest.raises(FormatError) as info:
        parse_pte(bytes(data), len(data), "model.pte")
    assert "model.pte" in str(info.value)


# Short inputs with hostile header fields. Before the header module, each of these
# escaped as a bare ValueError ("parse needs the first 64 bytes, got 49") or named the
# wrong field; now each is a FormatError naming file, field, value and limit.


def _loader(data: bytes | bytearray) -> Callable[[], object]:
    return lambda: read_container(BytesLoader(bytes(data), "model.pte"))


def _cut(data: bytes | bytearray, n: int) -> Callable[[], object]:
    return lambda: parse(bytes(data[:n]), len(data), "model.pte")


SHORT: list[tuple[str, Callable[[], Callable[[], object]], str]] = [
    (
        "pte program_size under 64, read through a loader",
        lambda: _loader(u64(pte(), 16, 49)),
        "model.pte: Program (table position) = 60: must be in [8, 45]",
    ),
    (
        "pte program_size just past the header, read through a loader",
        lambda: _loader(u64(pte(), 16, 40)),
        "model.pte: Program (table position) = 60: must be in [8, 36]",
    ),
    (
        "ptd metadata under 64, read through a loader",
        lambda: _loader(u64(ptd(), 24, 8)),
        "model.pte: FlatTensor (table position) = 68: must be in [8, 52]",
    ),
    (
        "buffer holds the header but not the program",
        lambda: _cut(pte(), 49),
        "model.pte: program_size = 1448: must be <= 49 (bytes available) "
        "(the buffer handed to the parser is truncated)",
    ),
    (
        "buffer cut inside the extended header",
        lambda: _cut(pte(), 20),
        "model.pte: header bytes = 20: must be >= 40 (the first bytes of the 6048-byte file, "
        "to read the extended header fields) (the buffer handed to the parser is truncated)",
    ),
    (
        "buffer cut inside the extended header magic",
        lambda: lambda: metadata_size(bytes(pte()[:10]), 6048, "model.pte"),
        "model.pte: header bytes = 10: must be >= 12 (the first bytes of the 6048-byte file, "
        "to read the extended header magic) (the buffer handed to the parser is truncated)",
    ),
    (
        "buffer cut inside the identifier",
        lambda: _cut(pte(), 4),
        "model.pte: header bytes = 4: must be >= 8 (the first bytes of the 6048-byte file, "
        "to read the file identifier) (the buffer handed to the parser is truncated)",
    ),
    (
        "buffer cut inside the FlatTensor header",
        lambda: _cut(ptd(), 30),
        "model.pte: header bytes = 30: must be >= 48 (the first bytes of the 3744-byte file, "
        "to read the FlatTensor header fields) (the buffer handed to the parser is truncated)",
    ),
    (
        "14-byte pte: extended header magic without a length",
        lambda: _cut(pte()[:14], 14),
        "model.pte: file size = 14: must be >= 16 bytes (the extended header length ends at 16)",
    ),
    (
        "14-byte ptd: FlatTensor header magic without a length",
        lambda: _cut(ptd()[:14], 14),
        "model.pte: file size = 14: must be >= 16 bytes (the FlatTensor header length ends at 16)",
    ),
    (
        "10-byte ptd: FlatTensor header magic cut short",
        lambda: _cut(ptd()[:10], 10),
        "model.pte: FlatTensor header magic (bytes 8..12) = b'FH': must be b'FH01'",
    ),
    (
        "40-byte ptd: header longer than the file",
        lambda: _cut(ptd()[:40], 40),
        "model.pte: FlatTensor header length = 40: must be <= 32 (the header must fit inside "
        "the 40-byte file)",
    ),
]


@pytest.mark.parametrize(("name", "make", "message"), SHORT, ids=[c[0] for c in SHORT])
def test_short_input_error_messages(
    name: str, make: Callable[[], Callable[[], object]], message: str
) -> None:
    run = make()
    with pytest.raises(FormatError) as info:
        run()
    assert str(info.value) == message


def test_inspect_short_program_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "short.pte"
    bad.write_bytes(u64(pte(), 16, 49))
    assert main(["inspect", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"ptestore inspect: error: {bad}: Program (table position) = 60: must be in [8, 45]\n"
    )


# A key listed twice in one container. Exporters write each key once; a hostile .ptd that
# repeated one key N times, each with its own layout, made inspect quadratic (1000
# entries, 56 KB: 87 s and 400 MB of JSON).


def test_a_ptd_key_listed_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = synth.flat_tensor([("a", (6, [4], [0])), ("b", None), ("a", (6, [2], [0]))])
    with pytest.raises(FormatError) as info:
        parse(data, len(data), "w.ptd")
    assert str(info.value) == (
        "w.ptd: FlatTensor.named_data[2].key = 'a': must be a key no other entry has "
        "(FlatTensor.named_data[0] has it too) (a named-data key is listed once in a container)"
    )
    path = tmp_path / "dup.ptd"
    path.write_bytes(synth.flat_tensor([("w", (6, [i], [0])) for i in range(1000)]))
    assert main(["inspect", "--json", str(path)]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["exit_code"] == 2
    assert "FlatTensor.named_data[1].key = 'w': must be a key no other" in error["message"]


def test_a_pte_key_listed_twice_is_refused() -> None:
    data = pte()
    c = parse(bytes(data), len(data), "m.pte")
    first, second = (e.key.encode() for e in c.named_data[:2])
    assert len(first) == len(second) == 64
    at = data.index(second)
    data[at : at + 64] = first
    raises(
        data,
        re.escape(
            f"model.pte: Program.named_data[1].key = '{first.decode()}': must be a key no other "
            "entry has (Program.named_data[0] has it too) (a named-data key is listed once in a "
            "container)"
        ),
    )


def test_a_long_value_is_shown_cut() -> None:
    # Every FormatError shows its value as :func:`ptestore._text.shown` does: about 80
    # characters and the whole value's size, whatever a hostile file holds.
    assert str(FormatError("f", "k", "ab" * 50, "short")) == (
        f"f: k = '{'ab' * 40}'... (100 characters): must be short"
    )
    assert str(FormatError("f", "k", bytes(100), "short")) == (
        f"f: k = {bytes(80)!r}... (100 bytes): must be short"
    )
    assert str(FormatError("f", "k", list(range(100)), "short")) == (
        f"f: k = {str(list(range(100)))[:80]}... (390 characters): must be short"
    )
    assert str(FormatError("f", "k", [10**5000], "short")) == (
        "f: k = <list too large to show>: must be short"
    )
    assert str(FormatError("f", "k", "a" * 80, "short")) == f"f: k = '{'a' * 80}': must be short"


def test_a_string_without_its_nul_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the terminator's position was checked: a key whose NUL was 'A' was parsed and
    # published, and the runtime's verifier refused the output (error 0x23).
    data = pte()
    key = parse(bytes(data), len(data), "m.pte").named_data[0].key.encode()
    end = data.index(key) + len(key)
    assert data[end] == 0
    data[end] = ord("A")
    raises(
        data,
        re.escape(
            f"model.pte: Program.named_data[0].key (string terminator at {end}) = 65: must be 0 "
            "(a FlatBuffer string ends with a NUL byte)"
        ),
    )
    src, dst = tmp_path / "nonul.pte", tmp_path / "out.pte"
    src.write_bytes(data)
    assert main(["specialize", str(src), str(dst), "--backend", "passthrough", "-q"]) == 2
    assert "(string terminator at" in capsys.readouterr().err
    assert not dst.exists()


def test_a_long_key_with_a_bad_byte_shows_the_bytes_around_it() -> None:
    # a 64-character key, its byte 51 not UTF-8: the value shown is the 32 bytes around
    # it (it was the key's first 32, which do not hold the byte the message names)
    data = bytearray(MLP.read_bytes())
    key = read_container(BytesLoader(bytes(data), name="m.pte")).container.named_data[0].key
    at = bytes(data).index(key.encode()) + 51
    data[at] = 0xFF
    with pytest.raises(FormatError) as info:
        read_container(BytesLoader(bytes(data), name="m.pte"))
    window = key.encode()[35:51] + b"\xff" + key.encode()[52:67]
    assert str(info.value) == (
        f"m.pte: Program.named_data[0].key = {window!r}: must be valid UTF-8 "
        "(invalid byte 0xff at 51 of 64; bytes 35..64 shown)"
    )


def test_a_bound_past_a_stamped_container_says_where_the_file_ends() -> None:
    # the container a stamped file holds ends where its provenance trailer starts: a
    # segment past it is measured against the container's size, which the message
    # says is not the file's (the file is the trailer's bytes longer)
    from ptestore.provenance.trailer import encode_trailer, without_trailer

    content = u64(pte(), 528, 5000)
    data = bytes(content) + encode_trailer({"k": "v"}, len(content))
    with pytest.raises(FormatError) as info:
        read_container(without_trailer(BytesLoader(data, name="model.pte")))
    assert str(info.value) == (
        "model.pte: Program.segments[4].offset + size = 6024: must be <= 4512 "
        "(segment_base_offset 1536 + offset + size must not pass the end of the 6048-byte "
        f"file) (that is the container: the file is {len(data)} bytes, the last "
        f"{len(data) - 6048} its provenance trailer)"
    )
    # an unstamped file: no such note
    with pytest.raises(FormatError, match=r"6048-byte file\)$"):
        read_container(BytesLoader(bytes(content), name="model.pte"))
