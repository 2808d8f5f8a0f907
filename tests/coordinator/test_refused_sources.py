"""Sources the stock runtime refuses (tests/support/damaged.py: an XNNPACK blob with
another magic or identifier, its FlatBuffer or constant data outside the blob or
overlapping, its segment cut, a delegate pointing at a weight; a method without its
``delegates`` field; a .ptd whose segment_data_size its segments pass) are refused when
the run reads its sources: a FormatError naming the file, field, value and limit, before
any backend runs and with nothing written (the runtime's own verdict on each:
tests/interop/test_refused_sources_runtime.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from support.counting_backend import Recorder
from support.damaged import ALL, Damaged, xh29_pair
from support.fixtures import get_fixture

import ptestore
from ptestore.errors import FormatError


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_refused_before_any_backend(tmp_path: Path, case: Damaged) -> None:
    pte, ptd = case.files()
    src = tmp_path / "in.pte"
    src.write_bytes(pte)
    pair = None
    if ptd is not None:
        (tmp_path / "in.ptd").write_bytes(ptd)
        pair = (tmp_path / "in.ptd", tmp_path / "o.ptd")
    backend = Recorder()
    with pytest.raises(FormatError) as info:
        ptestore.specialize(
            src, tmp_path / "o.pte", ptd=pair, backends=[backend], allow_unchanged=True
        )
    damaged = tmp_path / ("in.ptd" if case.in_ptd else "in.pte")
    assert str(info.value) == f"{damaged}{case.message}"
    assert backend.calls == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["in.pte"] + (["in.ptd"] if ptd is not None else [])
    )


def _accepted(tmp_path: Path, pte: bytes, ptd: bytes | None) -> None:
    tmp_path.mkdir()
    src = tmp_path / "in.pte"
    src.write_bytes(pte)
    pair = None
    if ptd is not None:
        (tmp_path / "in.ptd").write_bytes(ptd)
        pair = (tmp_path / "in.ptd", tmp_path / "o.ptd")
    ptestore.specialize(
        src, tmp_path / "o.pte", ptd=pair, backends=["passthrough"], allow_unchanged=True
    )
    assert (tmp_path / "o.pte").is_file()


def test_what_the_runtime_loads_is_not_refused(tmp_path: Path) -> None:
    """Measured with the runtime in the differential review: a .ptd whose
    segment_data_size is 32 bytes short of its last segment's end (3200 of 3232; the
    runtime's bound is segment_base_offset + segment_data_size), and an XNNPACK header
    whose length field says 29 (the runtime does not read it), both load; the latter in
    a pair too (tests/interop/test_refused_sources_runtime.py)."""
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    ptd = bytearray(Path(fx.ptd_path).read_bytes())
    struct.pack_into("<Q", ptd, 40, 3200)
    _accepted(tmp_path / "ptd", Path(fx.pte_path).read_bytes(), bytes(ptd))
    mlp = get_fixture("mlp_xnnpack").pte_path
    assert mlp is not None
    data = bytearray(Path(mlp).read_bytes())
    start = 1536
    assert data[start + 4 : start + 8] == b"XH00"
    struct.pack_into("<H", data, start + 8, 29)
    _accepted(tmp_path / "xh", bytes(data), None)
    # the same header in a pair: the pair's check reads the graphs as the runtime does
    _accepted(tmp_path / "xh_pair", *xh29_pair())
