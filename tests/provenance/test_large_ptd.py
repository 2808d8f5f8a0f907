"""Digests cover every byte, not a prefix: a multi-MiB ``.ptd`` made at test time (the
real export's ``.ptd`` with every value grown to 1.5 MiB of seeded noise) with one byte
flipped well past the first MiB is caught by ``verify`` (the ``.ptd`` itself and the
``.pte`` checked with it) and by ``fetch``, which publishes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.delta import flip
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.errors import IntegrityError
from ptestore.format.reader import read_container
from ptestore.provenance import read_trailer
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.provenance.trailer import ContentView
from ptestore.storage.loaders import open_loader

EXT = get_fixture("mlp_xnnpack_ext")
MIB = 1 << 20
VALUE = 3 * MIB // 2


class Grow(BackendInterface):
    """Every named value of the model becomes :data:`VALUE` bytes of seeded noise."""

    name = "XnnpackBackend"
    version = "1.0"

    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        for _ in context:
            pass
        rng = np.random.default_rng(7)
        for key in context.get_named_data_map():
            value = rng.integers(0, 256, VALUE, dtype=np.uint8).tobytes()
            output.write_named_data(key, BackendData(value, allow_size_change=True))


@pytest.fixture
def large(tmp_path: Path) -> tuple[Path, Path]:
    pte, ptd = tmp_path / "art" / "m.pte", tmp_path / "art" / "m.ptd"
    pte.parent.mkdir()
    ptestore.specialize(EXT.pte_path, pte, ptd=(EXT.ptd_path, ptd), backends=[Grow()])
    assert ptd.stat().st_size > 4 * MIB  # the largest committed .ptd is 3,872 bytes
    return pte, ptd


def _late_offset(path: Path) -> int:
    """An offset past the first MiB inside the last segment's bytes (before the trailer)."""
    loader = open_loader(path)
    try:
        trailer = read_trailer(loader)
        assert trailer is not None
        c = read_container(ContentView(loader, trailer.content_size)).container
    finally:
        loader.close()
    seg = max(c.segments, key=c.absolute)
    offset = c.absolute(seg) + seg.size - 17
    assert MIB < 3 * MIB < offset < trailer.content_size
    return offset


def test_verify_catches_a_byte_flipped_past_the_first_mib(large: tuple[Path, Path]) -> None:
    pte, ptd = large
    assert ptestore.verify(pte).status == "intact"
    assert ptestore.verify(ptd).status == "intact"
    flip(ptd, _late_offset(ptd), 0x20)
    for report in (ptestore.verify(ptd), ptestore.verify(pte)):
        assert report.status == "invalid", report.message()
        assert report.error is not None
        assert report.error.startswith(f"{ptd}: content.sha256 = 'sha256-tree:")
        content = read_trailer(open_loader(ptd))
        assert content is not None
        assert report.error.endswith(
            f"the {content.content_size} bytes before the trailer recorded in the provenance "
            "(the artifact was damaged or changed after it was made)"
        )
    # --quick reads no bytes and says so: it is not a digest check.
    assert ptestore.verify(pte, quick=True).content_checked is False


def test_fetch_catches_a_byte_flipped_past_the_first_mib(
    large: tuple[Path, Path], tmp_path: Path
) -> None:
    pte, ptd = large
    good = ptestore.fetch(pte, tmp_path / "good" / "m.pte")
    sizes = {Path(f["path"]).name: f["size"] for f in good.files}
    assert sizes == {"m.pte": pte.stat().st_size, "m.ptd": ptd.stat().st_size}
    late = _late_offset(ptd)
    flip(ptd, late, 0x20)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(pte, dest)
    assert info.value.published is False
    # checked chunk by chunk: the one holding the flipped byte is named, with its range
    chunk = late // CHUNK_SIZE
    assert str(info.value).startswith(f"{ptd}: downloaded bytes {chunk * CHUNK_SIZE}:"), str(
        info.value
    )
    assert f"(chunk {chunk}) have sha256:" in str(info.value)
    assert not dest.exists() and not dest.with_suffix(".ptd").exists()
