"""Delegate blobs and segments that cover the same bytes many times: the work done is
bounded by the file, not multiplied by the number of segments. Counted by wrapping the
functions that do the work, never timed."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from support import synth
from support.fixtures import all_fixtures, get_fixture

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.format import tensors
from ptestore.format.layoutdiff import segment_hashes
from ptestore.format.reader import read_container
from ptestore.format.tensors import describe_tensors, xnnpack_packed_weights, xnnpack_tensors
from ptestore.inspection import describe
from ptestore.storage.loaders import BytesLoader


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Wrap ``ptestore.format.tensors.NAME``; the list holds its number of calls."""
    calls = [0]
    real = getattr(tensors, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(tensors, name, counted)
    return calls


def test_delegates_over_the_same_bytes_parse_one_graph(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = synth.overlapping_xnnpack(64, 50)
    loader = BytesLoader(data, "o.pte")
    parsed = read_container(loader)
    assert len({(s.index, s.offset, s.size) for s in parsed.container.segments}) == 64
    graphs = _count(monkeypatch, "parse_xnngraph")
    packed = _count(monkeypatch, "parse_packed_weights")
    assert xnnpack_tensors(parsed, loader) == []
    assert xnnpack_packed_weights(parsed, loader) == []
    assert (graphs[0], packed[0]) == (1, 1)
    path = tmp_path / "o.pte"
    path.write_bytes(data)
    describe(str(path))  # what `ptestore inspect` shows
    assert graphs[0] == 2


def test_two_delegate_segments_made_to_cover_one_blob_parse_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # conv_xnnpack's two XNNPACK delegates own segments 1 and 2; point 2 at 1's bytes.
    fx = get_fixture("conv_xnnpack")
    assert fx.pte_path is not None
    data = bytearray(fx.pte_path.read_bytes())
    c = read_container(BytesLoader(bytes(data))).container
    first, second = (c.segments[d.index] for d in c.delegates)
    assert second.offset_pos is not None and second.size_pos is not None
    struct.pack_into("<Q", data, second.offset_pos, first.offset)
    struct.pack_into("<Q", data, second.size_pos, first.size)
    loader = BytesLoader(bytes(data), "conv.pte")
    parsed = read_container(loader)
    graphs = _count(monkeypatch, "parse_xnngraph")
    index = describe_tensors(parsed, loader)
    assert graphs[0] == 1
    assert {i.where.split(" ")[0] for i in index.values() if i.source == "xnnpack"} == {
        "forward[0]"
    }


def test_distinct_graphs_over_one_root_share_the_file_budget() -> None:
    # 16 segments at 8-byte steps, each a FlatBuffer of its own whose root is the same
    # 200-xvalue table: each graph alone is fine, together they would read the blob 16
    # times over.
    data = synth.overlapping_xnnpack(16, 200, stride=8)
    loader = BytesLoader(data, "o.pte")
    parsed = read_container(loader)
    assert len({(s.offset, s.size) for s in parsed.container.segments}) == 16
    for parse in (xnnpack_tensors, xnnpack_packed_weights):
        with pytest.raises(FormatError) as err:
            parse(parsed, loader)  # type: ignore[operator]
        assert str(err.value) == (
            "o.pte (XnnpackBackend blob of forward[13], segment 13): XNNGraph [1256, 2156) = "
            "'aliased data': must be at most 12720 element reads / bytes for the XNNPACK "
            "graphs of a 2156-byte file (buffers overlap or share tables so often that "
            "reading them would take unbounded work)"
        )
    assert len(data) == 2156


def test_every_fixture_graph_fits_the_file_budget() -> None:
    checked = 0
    for fx in all_fixtures():
        if fx.pte_path is None:
            continue
        loader = BytesLoader(fx.pte_path.read_bytes(), f"{fx.name}.pte")
        parsed = read_container(loader)
        if any(d.id == "XnnpackBackend" for d in parsed.container.delegates):
            xnnpack_tensors(parsed, loader)
            xnnpack_packed_weights(parsed, loader)
            checked += 1
    assert checked >= 4


class CountingLoader(BytesLoader):
    """A BytesLoader that counts the bytes loaded."""

    loaded = 0

    def load(self, offset: int, size: int) -> Any:
        self.loaded += size
        return super().load(offset, size)


def test_compare_hashes_each_distinct_range_once(tmp_path: Path) -> None:
    data = synth.overlapping_xnnpack(64, 50)
    path = tmp_path / "o.pte"
    path.write_bytes(data)
    desc = describe(str(path))
    blob = desc["segments"][0]["size"]
    loader = CountingLoader(data, "o.pte")
    hashes = segment_hashes(loader, desc)
    assert sorted(hashes) == list(range(64))
    assert len(set(hashes.values())) == 1
    assert loader.loaded == blob


def test_compare_refuses_segments_that_overlap_over_and_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = synth.overlapping_xnnpack(16, 200, stride=8, backend="VendorNpuBackend")
    path = tmp_path / "o.pte"
    path.write_bytes(data)
    desc = describe(str(path))
    total = sum(s["size"] for s in desc["segments"])
    assert (len(data), total) == (2156, 15104)
    loader = CountingLoader(data, "o.pte")
    with pytest.raises(FormatError) as err:
        segment_hashes(loader, desc)
    message = (
        f"{path}: segments (distinct byte ranges to hash) = 15104: must be <= 4312 bytes "
        "(twice the 2156-byte file) (segments overlap so often that comparing them would "
        "read the file over and over)"
    )
    assert str(err.value) == message
    assert loader.loaded == 0
    capsys.readouterr()
    assert main(["inspect", str(path), "--compare", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_delegates_sharing_an_inline_graph_parse_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import flatbuffers

    b = flatbuffers.Builder(0)
    delegates = [synth.delegate(b, "XnnpackBackend", segment=False) for _ in range(8)]
    plans = synth.offsets_vector(b, [synth.plan(b, "forward", synth.offsets_vector(b, delegates))])
    blob = b.CreateByteVector(synth.xnngraph(20))
    b.StartObject(1)  # BackendDelegateInlineData
    b.PrependUOffsetTRelativeSlot(0, blob, 0)
    inline = b.EndObject()
    data = synth.finish_program(b, plans, inline=synth.offsets_vector(b, [inline]))
    loader = BytesLoader(data, "i.pte")
    parsed = read_container(loader)
    assert [d.location for d in parsed.container.delegates] == ["inline"] * 8
    graphs = _count(monkeypatch, "parse_xnngraph")
    assert xnnpack_tensors(parsed, loader) == []
    assert graphs[0] == 1
