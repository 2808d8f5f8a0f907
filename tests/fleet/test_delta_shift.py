"""Delta fetch when the layout moved: a replacement of another size (packed weights, a
compiled blob) moves every segment after it, so a base (the portable source, last
month's artifact) holds those segments at other offsets than the download. The fetch
reads both layouts and takes each chunk from where the base keeps its segments
(:mod:`ptestore.fleet.shift`); only the metadata and the chunks of the replaced segment
come from the store. Property-tested on synthetic layouts, then on real programs,
locally and on moto and SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.delta import big_job, grown, program, trailer_size
from support.fleetrun import fleet_run

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.fleet.shift import Moves, chunk_pieces, segment_moves
from ptestore.format.reader import read_container
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.storage.loaders import LocalFileLoader
from ptestore.testing.s3server import S3TestServer

# -- chunk_pieces on synthetic layouts ---------------------------------------------


def _lay_out(meta: bytes, segments: list[bytes], align: int) -> tuple[bytearray, list[int]]:
    """``meta``, then each segment at the next multiple of ``align`` (zeros between)."""
    data = bytearray(meta)
    starts = []
    for seg in segments:
        data += bytes(-len(data) % align)
        starts.append(len(data))
        data += seg
    return data, starts


@st.composite
def _versions(draw: Any) -> tuple[bytearray, bytearray, Moves, int]:
    """A base and a target made from it: each segment kept (same bytes) or replaced by
    bytes of another size, laid out with their own metadata and alignment; the moves
    pair the kept ones. Small sizes and a small chunk, so chunks span boundaries."""
    n = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    segs = [bytes((i * 37 + j * 11 + 1) % 251 + 1 for j in range(s)) for i, s in enumerate(sizes)]
    kept = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    new = [
        s
        if keep
        else bytes(200 + (j * 7 + i) % 50 for j in range(len(s) + draw(st.integers(1, 90))))
        for i, (s, keep) in enumerate(zip(segs, kept, strict=True))
    ]
    base_meta = bytes(range(draw(st.integers(8, 200))))
    target_meta = bytes(255 - b for b in range(draw(st.integers(8, 200))))
    base, base_starts = _lay_out(base_meta, segs, draw(st.sampled_from([1, 16, 64])))
    target, starts = _lay_out(target_meta, new, draw(st.sampled_from([1, 16, 64])))
    rows = tuple(
        (s, s + len(seg), base_starts[i] if kept[i] else None)
        for i, (s, seg) in enumerate(zip(starts, new, strict=True))
    )
    return base, target, Moves(starts[0], rows), draw(st.sampled_from([32, 100, 256]))


@settings(max_examples=300, deadline=None)
@given(_versions())
def test_every_piece_names_the_bases_bytes_of_the_chunk(
    versions: tuple[bytearray, bytearray, Moves, int],
) -> None:
    base, target, moves, chunk = versions
    for a in range(0, len(target), chunk):
        b = min(a + chunk, len(target))
        pieces = chunk_pieces(moves, a, b)
        inside = [r for r in moves.rows if r[0] < b and r[1] > a]
        movable = a >= moves.data_start and all(r[2] is not None for r in inside)
        if pieces == ((a, b, a),):
            continue  # nothing in it moved: the same offsets, a guess the fetch checks
        if movable:
            assert pieces is not None, (a, b)
        if pieces is None:
            continue
        assert [p[0] for p in pieces] == [a] + [p[1] for p in pieces[:-1]]
        assert pieces[-1][1] == b
        built = b"".join(
            bytes(e - s) if off is None else bytes(base[off : off + e - s]) for s, e, off in pieces
        )
        assert built == target[a:b], (a, b, pieces)


def test_a_chunk_with_moved_metadata_or_a_segment_the_base_lacks_has_no_pieces() -> None:
    moves = Moves(100, ((100, 200, 150), (208, 300, None), (300, 400, 350)))
    assert chunk_pieces(moves, 0, 120) is None  # metadata, and a segment moved
    assert chunk_pieces(moves, 190, 220) is None  # a segment the base does not have
    assert chunk_pieces(moves, 120, 180) == ((120, 180, 170),)
    assert chunk_pieces(moves, 300, 400) == ((300, 400, 350),)
    moved_alike = Moves(0, ((0, 10, 20), (16, 30, 36), (40, 50, 45)))
    # the first two moved alike: one range of the base, their padding included; the
    # third moved otherwise: zeros, then its own range
    assert chunk_pieces(moved_alike, 5, 45) == ((5, 30, 25), (30, 40, None), (40, 45, 45))


# -- real programs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def grown_versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The portable source (four 5 MiB values), its artifact with the first value (in
    key order) grown by 1 MiB + 12,345 B, and an older artifact grown by 300,000 B."""
    d = tmp_path_factory.mktemp("grown")
    src = program(d)
    return src, grown(src, d / "new" / "m.pte"), grown(src, d / "old" / "m.pte", 300_000)


def _layout(path: Path) -> Any:
    loader = LocalFileLoader(str(path))
    try:
        return read_container(loader).container
    finally:
        loader.close()


def _expected(target: Path) -> tuple[int, int]:
    """Bytes the store must send and the rest, from a base: the first chunk (the
    metadata, rewritten: the layout moved) and the chunks that hold what the grown
    value appended, and the 4 KiB tail read."""
    layout = _layout(target)
    (grown_value,) = (s for s in layout.segments if s.size > 5 * 1024 * 1024)
    appended = layout.segment_base_offset + grown_value.offset + 5 * 1024 * 1024
    end = appended + grown_value.size - 5 * 1024 * 1024
    content = target.stat().st_size - trailer_size(target)
    fetched = sum(
        min(a + CHUNK_SIZE, content) - a
        for a in range(0, content, CHUNK_SIZE)
        if a == 0 or (a < end and a + CHUNK_SIZE > appended)
    )
    assert 0 < fetched < content - CHUNK_SIZE  # chunks after the grown value remain
    return fetched + 4096, content - fetched


def test_the_segments_after_a_grown_one_are_paired_where_the_source_keeps_them(
    grown_versions: tuple[Path, Path, Path],
) -> None:
    src, new, _ = grown_versions
    moves = segment_moves(_layout(new), _layout(src))
    shifts = {None if b is None else b - s for s, _, b in moves.rows}
    # unmoved before the grown value, none for it, one shift for the segments after it
    assert moves.moved and len(shifts) == 3 and None in shifts and 0 in shifts


@pytest.mark.parametrize("which", ["source", "older artifact"])
def test_a_moved_layout_takes_the_moved_segments_from_the_base(
    grown_versions: tuple[Path, Path, Path], tmp_path: Path, which: str
) -> None:
    src, new, old = grown_versions
    base = src if which == "source" else old
    dest = tmp_path / "dev" / "m.pte"
    (got,) = ptestore.fetch(new, dest, base=base).files
    assert dest.read_bytes() == new.read_bytes()
    received, from_base = _expected(new)
    assert (got["received"], got["from_base"]) == (received, from_base)
    assert got["bases"] == {str(base): from_base}
    assert got["base_damaged"] == got["store_retried"] == []
    assert ptestore.verify(dest).status == "intact"


def test_a_moved_chunk_whose_base_bytes_differ_is_fetched(
    grown_versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The pairing is a guess: a base whose moved segment has other bytes (same size)
    gives that chunk to the store, the others still come from the base."""
    src, new, _ = grown_versions
    base = tmp_path / "base.pte"
    data = bytearray(src.read_bytes())
    last = _layout(src).segments[-1]
    at = _layout(src).segment_base_offset + last.offset + last.size - 10
    data[at] ^= 0xFF
    base.write_bytes(bytes(data))
    dest = tmp_path / "dev" / "m.pte"
    (got,) = ptestore.fetch(new, dest, base=base).files
    assert dest.read_bytes() == new.read_bytes()
    received, from_base = _expected(new)
    content = new.stat().st_size - trailer_size(new)
    last_chunk = content - (content - 1) // CHUNK_SIZE * CHUNK_SIZE
    assert got["received"] == received + last_chunk
    assert got["from_base"] == from_base - last_chunk


def test_a_base_whose_metadata_does_not_parse_is_used_at_its_own_offsets(
    grown_versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A damaged base (its file identifier overwritten): no layout to follow, so only
    the chunks at the same offsets can come from it; the download is still the
    artifact's, every chunk checked."""
    src, new, _ = grown_versions
    base = tmp_path / "damaged.pte"
    data = bytearray(src.read_bytes())
    data[4:8] = b"XXXX"
    base.write_bytes(bytes(data))
    dest = tmp_path / "dev" / "m.pte"
    (got,) = ptestore.fetch(new, dest, base=base).files
    assert dest.read_bytes() == new.read_bytes()
    received, _ = _expected(new)
    # chunk 1 (unmoved, same bytes) from the base; the moved chunks from the store
    content = new.stat().st_size - trailer_size(new)
    assert got["from_base"] == CHUNK_SIZE
    assert got["received"] == content - CHUNK_SIZE + 4096 > received


def test_external_weights_whose_layout_moved_take_the_moved_segments_from_the_base(
    tmp_path: Path,
) -> None:
    """A program with its weights in a .ptd (``mlp_xnnpack_ext``, four 5 MiB values): a
    value grown by 1 MiB in the .ptd moves the ones after it; the fetch of the pair with
    the portable pair as base takes them from the base's .ptd at their offsets there."""
    from support.delta import Grow
    from support.fixtures import get_fixture
    from support.large import Inflate

    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    src, src_ptd = tmp_path / "src.pte", tmp_path / "src.ptd"
    ptestore.specialize(
        ext.pte_path,
        src,
        ptd=(ext.ptd_path, src_ptd),
        backends=[Inflate("XnnpackBackend", 5 * 1024 * 1024)],
        provenance=False,
    )
    new, new_ptd = tmp_path / "new" / "m.pte", tmp_path / "new" / "m.ptd"
    new.parent.mkdir()
    ptestore.specialize(src, new, ptd=(src_ptd, new_ptd), backends=[Grow(1024 * 1024)])
    assert segment_moves(_layout(new_ptd), _layout(src_ptd)).moved
    dest = tmp_path / "dev" / "m.pte"
    result = ptestore.fetch(new, dest, base=src)
    (ptd,) = [f for f in result.files if str(f["path"]).endswith(".ptd")]
    assert (tmp_path / "dev" / "m.ptd").read_bytes() == new_ptd.read_bytes()
    assert dest.read_bytes() == new.read_bytes()
    # the metadata chunk and the one chunk that holds the appended MiB, and the tail read
    content = new_ptd.stat().st_size - trailer_size(new_ptd)
    assert ptd["received"] == 2 * CHUNK_SIZE + 4096
    assert ptd["from_base"] == content - 2 * CHUNK_SIZE
    assert ptd["bases"] == {str(src_ptd): content - 2 * CHUNK_SIZE}


def test_ensure_index_takes_the_moved_segments_from_the_cached_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A device's cache holds the artifact of a value grown by 300,000 B; the fleet's
    next build grows it by 1 MiB + 12,345 B: ``ensure INDEX`` takes the segments after
    it from the cached file, where they sit 300,000 B (aligned) earlier."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    device = DeviceProfile("a", {"soc": "x"})
    job = big_job(tmp_path, str(out), backend="support.delta:Grow=300000")
    first = ptestore.ensure(fleet_run(job, capsys), cache_dir=cache, model="m", device=device)
    job = big_job(tmp_path, str(out), backend=f"support.delta:Grow={1024 * 1024 + 12345}")
    index = fleet_run(job, capsys)
    fresh = ptestore.ensure(index, cache_dir=cache, model="m", device=device)
    new = out / "a" / "m.pte"
    assert Path(fresh.pte).read_bytes() == new.read_bytes()
    assert fresh.choice is not None
    fetched = fresh.choice["fetched"]
    received, from_base = _expected(new)
    assert (fetched["received"], fetched["from_base"]) == (received, from_base)
    assert fetched["bases"] == [first.pte]
    assert ptestore.verify(fresh.pte).status == "intact"


@pytest.mark.s3
def test_s3_a_moved_layout_moves_only_the_metadata_and_the_grown_value(
    s3_server: S3TestServer, grown_versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from support.faulty_proxy import faulty_proxy

    src, new, _ = grown_versions
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m/new.pte", Body=new.read_bytes())
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        opts = {**s3_server.storage_options, "endpoint_url": endpoint}
        dest = tmp_path / "dev" / "m.pte"
        (got,) = ptestore.fetch(
            f"s3://{bucket}/m/new.pte", dest, base=src, storage_options=opts
        ).files
    assert dest.read_bytes() == new.read_bytes()
    received, from_base = _expected(new)
    assert (got["received"], got["from_base"]) == (received, from_base)
    # what the server sent: those, and the trailer reads that describe a URL
    assert received <= proxy.sent["GET"] <= received + 64 * 1024
