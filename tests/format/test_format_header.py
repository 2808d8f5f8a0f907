"""The header module: decode/encode round trips on real files, the alignment helpers,
and one header decode per read."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.fixtures import all_fixtures, get_fixture

from ptestore.errors import FormatError
from ptestore.format import header as hdr
from ptestore.format import parse, patch_metadata, read_container
from ptestore.storage.loaders import BytesLoader

FILES = [
    pytest.param(path.read_bytes(), id=f"{fx.name}-{role}")
    for fx in all_fixtures()
    for role, path in (("pte", fx.pte_path), ("ptd", fx.ptd_path))
    if path is not None
]


@pytest.mark.parametrize("data", FILES)
def test_header_round_trips(data: bytes) -> None:
    head = hdr.FileHead.from_bytes(data[: hdr.HEAD_BYTES], len(data), "m")
    if head.header is None:
        assert head.kind == "pte"
        assert data[8:12] != hdr.PTE_HEADER_MAGIC
        assert head.metadata_size == len(data)
        return
    encoded = head.header.to_bytes()
    assert data[hdr.HEADER_OFFSET : hdr.HEADER_OFFSET + len(encoded)] == encoded
    assert parse(data, len(data), "m").header == head.header


def test_header_fields_and_lengths() -> None:
    data = get_fixture("mlp_xnnpack").pte_path.read_bytes()  # type: ignore[union-attr]
    pte = hdr.PteHeader.from_bytes(data, len(data), "m")
    assert pte == hdr.PteHeader(32, 1448, 1536, 4512)
    assert len(pte.to_bytes()) == 32
    old = replace(pte, length=24, segment_data_size=None)
    assert len(old.to_bytes()) == 24
    assert hdr.PteHeader.from_bytes(data[:4] + b"ET12zz00", len(data), "m") is None
    ptd_data = get_fixture("mlp_portable_ext").ptd_path.read_bytes()  # type: ignore[union-attr]
    ptd = hdr.PtdHeader.from_bytes(ptd_data, len(ptd_data), "m")
    assert ptd == hdr.PtdHeader(40, 48, 464, 512, 3232)
    assert ptd.metadata_end == 512
    assert len(ptd.to_bytes()) == 40


def test_validate_checks_a_built_header() -> None:
    with pytest.raises(FormatError) as info:
        hdr.PteHeader(32, 2000, 0, 0).validate(1000, "new.pte")
    assert str(info.value) == (
        "new.pte: extended header program_size = 2000: must be in [40, 1000] "
        "(after the header and inside the file)"
    )
    with pytest.raises(FormatError) as info:
        hdr.PtdHeader(40, 48, 8, 100, 0).validate(80, "new.ptd")
    assert str(info.value) == (
        "new.ptd: FlatTensor header segment_base_offset = 100: must be in [56, 80] "
        "(after the FlatBuffer, inside the file)"
    )


@pytest.mark.parametrize("data", FILES)
def test_patched_header_validates(data: bytes) -> None:
    c = parse(data, len(data), "m")
    if c.header is None:
        return
    placements = [(s.offset, s.size) for s in c.segments]
    out = patch_metadata(c, data, placements, segment_base_offset=c.segment_base_offset)
    new = bytes(out.metadata) + data[len(out.metadata) :]
    again = hdr.FileHead.from_bytes(new, len(new), "m").header
    assert again is not None
    again.validate(len(new), "m")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, False), (-4, False), (1, True), (2, True), (3, False), (128, True), (1 << 64, True)],
)
def test_is_power_of_two(value: int, expected: bool) -> None:
    assert hdr.is_power_of_two(value) is expected


def test_align_up() -> None:
    assert hdr.align_up(1448, hdr.SEGMENT_BASE_ALIGNMENT) == 1536
    assert hdr.align_up(1536, 128) == 1536
    assert hdr.align_up(7, 1) == 7
    assert hdr.align_up(7, 0) == 7


def test_one_header_decode_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for cls in (hdr.PteHeader, hdr.PtdHeader):
        original = cls.from_bytes.__func__  # type: ignore[attr-defined]

        def counting(klass: type, buf: bytes, size: int, source: str, f=original) -> object:
            calls.append(klass.__name__)
            return f(klass, buf, size, source)

        monkeypatch.setattr(cls, "from_bytes", classmethod(counting))
    for fx in all_fixtures():
        for path in (fx.pte_path, fx.ptd_path):
            if path is None:
                continue
            calls.clear()
            read_container(BytesLoader(path.read_bytes(), str(path)))
            assert len(calls) == 1, (path, calls)
