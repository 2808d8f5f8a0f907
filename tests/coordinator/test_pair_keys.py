"""A .pte paired with a .ptd that does not hold every key the .pte reads is refused before
anything is written: the runtime cannot load such a pair (checked here with the real
runtime: error 0x20 for an XNNPACK graph's constant and for a program's EXTERNAL tensor).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support.et_runtime import Job, run_one
from support.fixtures import get_fixture

import ptestore
from ptestore.errors import MissingNamedData


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
