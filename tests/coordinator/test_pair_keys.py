"""A .pte paired with a .ptd that does not hold every key the .pte reads is refused before
anything is written: the runtime cannot load such a pair (checked here with the real
runtime: error 0x20 for an XNNPACK graph's constant and for a program's EXTERNAL tensor).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support.counting_backend import Recorder
from support.damaged import cut_value
from support.et_runtime import Job, run_one, run_programs
from support.fixtures import get_fixture

import ptestore
from ptestore.coordinator.run import described_by
from ptestore.errors import FormatError, MissingNamedData
from ptestore.format.reader import read_container
from ptestore.format.tensors import layout_tensors, short_values
from ptestore.storage.loaders import BytesLoader


def _paths(name: str) -> tuple[Path, Path]:
    fx = get_fixture(name)
    assert fx.pte_path is not None and fx.ptd_path is not None
    return Path(fx.pte_path), Path(fx.ptd_path)


XNN_PTE, XNN_PTD = _paths("mlp_xnnpack_ext")
PORT_PTE, PORT_PTD = _paths("mlp_portable_ext")


def _refused(tmp_path: Path, pte: Path, ptd: Path) -> MissingNamedData:
    out, out_ptd = tmp_path / "o.pte", tmp_path / "o.ptd"
    out_ptd.write_bytes(b"an earlier .ptd")
    with pytest.raises(MissingNamedData) as info:
        ptestore.specialize(pte, out, ptd=(ptd, out_ptd), backends=["passthrough"])
    assert not out.exists()
    assert out_ptd.read_bytes() == b"an earlier .ptd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.ptd"]
    return info.value


def test_xnnpack_graph_key_missing_from_the_ptd(tmp_path: Path) -> None:
    err = _refused(tmp_path, XNN_PTE, PORT_PTD)
    key = "9eed8098f924a1e1efe5fd1dfba5ab56b5a8fa3bfbe4bb50eef0b5520f2a05a0"
    assert err.key == key
    assert err.files == (str(XNN_PTE), str(PORT_PTD))
    assert str(err.args[0]) == (
        f"{XNN_PTE}: named data key {key!r}, read by the XnnpackBackend graph's forward[0] "
        f"xvalues[1], is in neither {XNN_PTE} nor {PORT_PTD} (and 3 other keys): is "
        f"{PORT_PTD} the .ptd this .pte was exported with? The runtime cannot load this pair "
        "(a key it does not find is error 0x20)"
    )


def test_external_tensor_missing_from_the_ptd(tmp_path: Path) -> None:
    err = _refused(tmp_path, PORT_PTE, XNN_PTD)
    assert err.key == "fc1.weight"
    assert re.search(
        r"named data key 'fc1\.weight', read by the program's EXTERNAL tensor forward "
        r"values\[0\], is in neither .* \(and 3 other keys\)",
        str(err.args[0]),
    )


def test_keys_the_pte_holds_itself_need_no_ptd_entry(tmp_path: Path) -> None:
    """mlp_xnnpack holds its weights in the .pte: a .ptd with other keys beside it is no
    error (the runtime merges both maps), and the pair is written."""
    pte = get_fixture("mlp_xnnpack").pte_path
    assert pte is not None
    ptestore.specialize(
        pte,
        tmp_path / "o.pte",
        ptd=(PORT_PTD, tmp_path / "o.ptd"),
        backends=["passthrough"],
        allow_unchanged=True,
    )
    assert (tmp_path / "o.pte").exists() and (tmp_path / "o.ptd").exists()


def test_the_matching_pair_is_written(tmp_path: Path) -> None:
    ptestore.specialize(
        XNN_PTE,
        tmp_path / "o.pte",
        ptd=(XNN_PTD, tmp_path / "o.ptd"),
        backends=["passthrough"],
        allow_unchanged=True,
    )
    assert (tmp_path / "o.ptd").exists()


@pytest.mark.parametrize(("pte", "ptd"), [(XNN_PTE, PORT_PTD), (PORT_PTE, XNN_PTD)])
def test_the_runtime_refuses_what_is_refused(pte: Path, ptd: Path) -> None:
    """Why the check exists: the stock runtime fails to load these pairs as they are."""
    x = np.ones((2, 16), dtype=np.float32)
    result = run_one(Job(pte=pte, ptd=ptd, method="forward", inputs=[x]))
    assert not result.ok and not result.crashed
    assert result.error is not None and result.error.endswith("error: 0x20"), result.describe()


def _cut(src: Path, key: str, size: int, dst: Path) -> Path:
    """``src`` with the stored size of ``key``'s segment set to ``size`` (its bytes and
    every other byte left where they are)."""
    dst.write_bytes(cut_value(src.read_bytes(), key, size))
    return dst


XNN_BIAS = "3bf604f25ef5fac19ec896e5dd1421db740d59bb3ff76838ded16846172d0ee5"


@pytest.mark.parametrize(
    ("pte", "ptd", "key", "size", "said"),
    [
        (PORT_PTE, PORT_PTD, "fc2.bias", 16, "the program's EXTERNAL tensor forward values[3]"),
        (PORT_PTE, PORT_PTD, "fc2.bias", 0, "the program's EXTERNAL tensor forward values[3]"),
        (XNN_PTE, XNN_PTD, XNN_BIAS, 0, "the XnnpackBackend graph's forward[0] xvalues[5]"),
    ],
)
def test_a_value_shorter_than_its_tensor_is_refused_before_any_backend(
    tmp_path: Path, pte: Path, ptd: Path, key: str, size: int, said: str
) -> None:
    """The runtime reads as many bytes as the tensor says from the value's start: past
    the end of a short value (the bytes after it as weights, or a crash)."""
    cut = _cut(ptd, key, size, tmp_path / "in.ptd")
    out = tmp_path / "o.pte"
    backend = Recorder()
    with pytest.raises(FormatError) as info:
        ptestore.specialize(
            pte, out, ptd=(cut, tmp_path / "o.ptd"), backends=[backend], allow_unchanged=True
        )
    assert backend.calls == 0
    assert str(info.value) == (
        f"{cut}: named data {key!r} (size) = {size}: must be >= 32 bytes: float32 [8], as "
        f"{said} says (the runtime reads 32 bytes from the value's start, past its end)"
    )
    assert not out.exists() and not (tmp_path / "o.ptd").exists()


def test_a_ptd_layout_longer_than_the_value_is_refused(tmp_path: Path) -> None:
    """The .ptd's own tensor layout describes its values too (float32 [8]: 32 bytes)."""
    cut = _cut(PORT_PTD, "fc2.bias", 16, tmp_path / "in.ptd")
    parsed = read_container(BytesLoader(cut.read_bytes(), name=str(cut)))
    described = [(k, i) for k, i in layout_tensors(parsed) if k == "fc2.bias"]
    [(key, held, size, info)] = short_values(parsed, None, described)
    assert (key, held is parsed, size, info.source) == ("fc2.bias", True, 16, "ptd")
    assert described_by(info) == f"the tensor layout of {cut} named_data 'fc2.bias'"


def test_the_runtime_reads_past_a_short_value(tmp_path: Path) -> None:
    """Why: with fc2.bias cut to 16 of its 32 bytes (the bytes after it unchanged), the
    runtime computes exactly what it computes with the whole value: it read 32 bytes."""
    fx = get_fixture("mlp_portable_ext")
    cut = _cut(PORT_PTD, "fc2.bias", 16, tmp_path / "in.ptd")
    x = fx.inputs["forward"]
    whole, short = run_programs(
        [Job(pte=PORT_PTE, ptd=PORT_PTD, inputs=x), Job(pte=PORT_PTE, ptd=cut, inputs=x)]
    )
    assert whole.ok and short.ok, (whole.describe(), short.describe())
    assert whole.outputs is not None and short.outputs is not None
    assert np.array_equal(whole.outputs[0], short.outputs[0])
