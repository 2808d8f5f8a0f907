"""The delta delivery of packed-weight files on files built byte by byte in the XPWC
layout (no runtime): regions that moved are found by the two files' indexes, an index
longer than a chunk is read whole before the layout is, and every byte of the result is
the target's whatever the pairing guessed."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptestore.fleet.packed_chunks import PackedLayouts, download_delta
from ptestore.provenance.chunks import CHUNK_SIZE, ChunkHasher
from ptestore.xnnpack.xpwc import MAGIC, VERSION, parse_index

PAGE = 4096
MiB = 1 << 20


def xpwc(regions: list[tuple[str, bytes]], align: int = PAGE) -> bytes:
    """A packed-weight file: each region at the next ``align``-aligned offset, in order,
    then the index and the footer."""
    body = bytearray()
    index = bytearray()
    for name, data in regions:
        body += bytes(-len(body) % align)
        raw = name.encode()
        index += struct.pack("<I", len(raw)) + raw + struct.pack("<QQI", len(body), len(data), 0)
        body += data
    start = len(body)
    return bytes(body + index + struct.pack("<QIII", start, len(regions), MAGIC, VERSION))


def noise(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def deliver(
    tmp: Path, old: bytes, new: bytes, others: tuple[bytes, ...] = ()
) -> tuple[bytes, dict[str, int]]:
    """``new`` delivered from a local "store" with ``old`` as the base (after
    ``others``, other files tried first): its bytes and the bytes by origin."""
    base, stored = tmp / "old.xpwc", tmp / "store" / "m.xnnpack-x.xpwc"
    stored.parent.mkdir(exist_ok=True)
    base.write_bytes(old)
    bases = []
    for i, other in enumerate(others):
        bases.append(tmp / f"other{i}.xpwc")
        bases[-1].write_bytes(other)
    stored.write_bytes(new)
    hasher = ChunkHasher(len(new))
    hasher.update(new)
    chunks = hasher.result()
    field = {
        "url": str(stored),
        "size": len(new),
        "sha256": "sha256:" + hashlib.sha256(new).hexdigest(),
    }
    moved: dict[str, int] = {}

    def count(e: Any) -> None:
        moved[e.origin] = moved.get(e.origin, 0) + e.nbytes

    dest = tmp / "xnnpack-download-x.xpwc"
    paths = [*map(str, bases), str(base)]
    download_delta(field, str(dest), chunks, {}, paths, CHUNK_SIZE, events=count)
    got = Path(str(dest) + ".part").read_bytes()
    for p in tmp.glob("xnnpack-download-*"):
        p.unlink()
    return got, moved


def test_regions_after_a_grown_one_come_from_where_the_old_file_keeps_them(
    tmp_path: Path,
) -> None:
    a, c, d = noise(1, 5 * MiB), noise(3, 9 * MiB + 100), noise(4, 3 * MiB)
    old = xpwc([("a", a), ("b", noise(2, 2 * MiB)), ("c", c), ("d", d)])
    new = xpwc([("a", a), ("b", noise(5, 3 * MiB + 12345)), ("c", c), ("d", d)])
    got, moved = deliver(tmp_path, old, new)
    assert got == new
    entries = {e.name: e for e in parse_index(new, "new")}
    # c and d moved alike: every chunk wholly inside them comes from the old file
    lo, hi = entries["c"].offset, entries["d"].offset + entries["d"].size
    inside = [x for x in range(0, len(new), CHUNK_SIZE) if lo <= x and x + CHUNK_SIZE <= hi]
    assert len(inside) >= 2
    assert moved["base"] >= CHUNK_SIZE * (1 + len(inside))  # a's first chunk and those
    assert moved["store"] + moved["base"] == len(new)


def test_another_models_file_tried_first_does_not_hide_the_right_one(tmp_path: Path) -> None:
    """The newest packed file beside DEST is another model's (its names are other keys):
    it is not tried, and the earlier version's file gives what it holds."""
    a, c = noise(1, 5 * MiB), noise(3, 9 * MiB)
    old = xpwc([("a", a), ("b", noise(2, 2 * MiB)), ("c", c)])
    new = xpwc([("a", a), ("b", noise(5, 2 * MiB)), ("c", c)])
    alone = deliver(tmp_path, old, new)[1]
    # another model of the same shapes (a file that would be hashed chunk by chunk)
    other = xpwc([("x", noise(7, 5 * MiB)), ("y", noise(8, 2 * MiB)), ("z", noise(9, 9 * MiB))])
    got, moved = deliver(tmp_path, old, new, (other,))
    assert got == new and moved == alone and moved["base"] >= 3 * CHUNK_SIZE
    assert PackedLayouts().moves(parse_index(new, "new"), parse_index(other, "other")) is None


def test_the_files_installed_for_the_pte_are_its_first_bases(tmp_path: Path) -> None:
    """Six packed-weight files beside DEST, the oldest installed for it: it comes first,
    then the newest of the others, four in all."""
    import json
    import os

    from ptestore.fleet.packed_chunks import packed_bases
    from ptestore.xnnpack.users import USERS

    dest = str(tmp_path / "m.pte")
    files = []
    for i in range(6):
        f = tmp_path / f"xnnpack-{i:032x}.xpwc"
        f.write_bytes(b"x")
        os.utime(f, (1000 + i, 1000 + i))
        files.append(str(f))
    Path(files[0] + ".json").write_text(json.dumps({USERS: ["/elsewhere.pte", dest]}))
    Path(files[5] + ".json").write_text("not JSON")
    (tmp_path / "xnnpack-download-1.xpwc.part").write_bytes(b"x")
    assert packed_bases([str(tmp_path)], dest) == [files[0], files[5], files[4], files[3]]
    assert packed_bases([str(tmp_path)]) == [files[5], files[4], files[3], files[2]]


def test_the_pairing_is_by_name_and_size_only() -> None:
    lay = PackedLayouts()
    old = parse_index(xpwc([("a", b"x" * 10), ("b", b"y" * 20), ("c", b"z" * 30)]), "old")
    new = parse_index(xpwc([("c", b"z" * 30), ("a", b"x" * 11), ("b", b"q" * 20)]), "new")
    moves = lay.moves(new, old)
    # c now first (from the old file's third page), a of another size (none), b paired
    want = ((0, 30, 2 * PAGE), (PAGE, PAGE + 11, None), (2 * PAGE, 2 * PAGE + 20, PAGE))
    assert moves.rows == want


def test_an_index_longer_than_a_chunk_is_read_whole_before_the_layout(tmp_path: Path) -> None:
    """50,000 small regions (at 64-byte offsets, the alignment XNNPACK needs, not
    page-aligned, to keep the file small): the index (4.4 MB) spans the last two chunks,
    so the layout needs both; the regions that moved still come from the old file."""
    names = [f"{hashlib.sha256(str(i).encode()).hexdigest()}" for i in range(50_000)]
    small = [(n, bytes([i % 251]) * 192) for i, n in enumerate(names)]
    first = ("w", noise(7, 4 * MiB))
    old = xpwc([first, *small], align=64)
    new = xpwc([("w", noise(8, 4 * MiB + 3 * PAGE)), *small], align=64)
    assert parse_index(new, "new")[1].offset != parse_index(old, "old")[1].offset
    (index_start,) = struct.unpack_from("<Q", new, len(new) - 20)
    assert index_start < (len(new) - 1) // CHUNK_SIZE * CHUNK_SIZE  # before the last chunk
    got, moved = deliver(tmp_path, old, new)
    assert got == new
    assert moved["store"] + moved["base"] == len(new) and moved["base"] >= CHUNK_SIZE


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3 * MiB), min_size=2, max_size=5),
    changed=st.sets(st.integers(0, 4)),
    grow=st.integers(-PAGE, 2 * MiB),
)
def test_any_reshaping_delivers_the_targets_bytes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], changed: set[int], grow: int
) -> None:
    """Whatever moved, changed or grew, and whatever the pairing guessed, the file
    delivered is the target's (each chunk checked against its record)."""
    tmp = tmp_path_factory.mktemp("any")
    old_regions = [(f"r{i}", noise(i, n)) for i, n in enumerate(sizes)]
    new_regions = []
    for i, (name, data) in enumerate(old_regions):
        if i in changed:
            data = noise(100 + i, max(1, len(data) + (grow if i == min(changed) else 0)))
        new_regions.append((name, data))
    got, moved = deliver(tmp, xpwc(old_regions), xpwc(new_regions))
    assert got == xpwc(new_regions)
    assert moved.get("store", 0) + moved.get("base", 0) == len(got)
