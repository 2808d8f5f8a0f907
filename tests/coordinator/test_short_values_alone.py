"""A .pte run without a .ptd refuses a named-data value the .pte holds that is shorter
than a description of its key (an XNNPACK graph's constant), with the error a pair gets
(tests/coordinator/test_pair_keys.py), before any backend runs and before anything is
written: to a new file, over an existing one, in place, through ``ensure`` and the
command line. The runtime's verdict on these files (a crash for an empty value, other
bytes read as weights for a cut one): tests/interop/test_refused_sources_runtime.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import synth
from support.counting_backend import Recorder
from support.damaged import cut_value, unused_constant
from support.fixtures import get_fixture

import ptestore
from ptestore.cli import main
from ptestore.device import list_entries
from ptestore.errors import FormatError
from ptestore.format.reader import read_container
from ptestore.format.sizes import may_be_short
from ptestore.format.tensors import read_tensors, short_values
from ptestore.storage.loaders import BytesLoader

MLP = get_fixture("mlp_xnnpack").pte_path
assert MLP is not None
#: mlp_xnnpack's first weight (float32 [32, 16]) and last bias (float32 [8]).
W1 = "9eed8098f924a1e1efe5fd1dfba5ab56b5a8fa3bfbe4bb50eef0b5520f2a05a0"
B2 = "3bf604f25ef5fac19ec896e5dd1421db740d59bb3ff76838ded16846172d0ee5"
DESCRIBED = {
    W1: (2048, "float32 [32, 16]", "forward[0] xvalues[1]"),
    B2: (32, "float32 [8]", "forward[0] xvalues[5]"),
}


def _message(path: Path, key: str, size: int, more: str = "") -> str:
    nbytes, tensor, where = DESCRIBED[key]
    return (
        f"{path}: named data {key!r} (size) = {size}: must be >= {nbytes} bytes: {tensor}, "
        f"as the XnnpackBackend graph's {where} says (the runtime reads {nbytes} bytes from "
        f"the value's start, past its end{more})"
    )


def _source(tmp_path: Path, *cuts: tuple[str, int]) -> Path:
    data = MLP.read_bytes()
    for key, size in cuts:
        data = cut_value(data, key, size)
    src = tmp_path / "in.pte"
    src.write_bytes(data)
    return src


@pytest.mark.parametrize(("key", "size"), [(W1, 0), (W1, 2047), (B2, 16)])
def test_a_value_shorter_than_its_tensor_is_refused_before_any_backend(
    tmp_path: Path, key: str, size: int
) -> None:
    src = _source(tmp_path, (key, size))
    backend = Recorder()
    with pytest.raises(FormatError) as info:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[backend], allow_unchanged=True)
    assert str(info.value) == _message(src, key, size)
    assert backend.calls == 0
    assert [p.name for p in tmp_path.iterdir()] == ["in.pte"]


def test_every_short_value_is_counted_and_an_existing_destination_kept(tmp_path: Path) -> None:
    src = _source(tmp_path, (W1, 0), (B2, 0))
    out = tmp_path / "o.pte"
    out.write_bytes(b"an earlier program")
    with pytest.raises(FormatError) as info:
        ptestore.specialize(src, out, backends=["passthrough"], allow_unchanged=True)
    assert str(info.value) == _message(src, W1, 0, "; 1 other values are short too")
    assert out.read_bytes() == b"an earlier program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pte", "o.pte"]


def test_in_place_the_source_is_left_as_it_was(tmp_path: Path) -> None:
    src = _source(tmp_path, (B2, 16))
    before = src.read_bytes()
    backend = Recorder()
    with pytest.raises(FormatError) as info:
        ptestore.specialize(src, src, backends=[backend], in_place=True)
    assert str(info.value) == _message(src, B2, 16)
    assert backend.calls == 0
    assert src.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["in.pte"]  # no journal left


def test_ensure_refuses_it_and_caches_nothing(tmp_path: Path) -> None:
    src = _source(tmp_path, (W1, 0))
    backend = Recorder()
    with pytest.raises(FormatError) as info:
        ptestore.ensure(src, cache_dir=tmp_path / "cache", backends=[backend])
    assert str(info.value) == _message(src, W1, 0)
    assert backend.calls == 0
    # a failed run removes the entry directory it made (nothing left for `cache prune`)
    assert list_entries(tmp_path / "cache") == []


def test_the_command_line_exits_2_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _source(tmp_path, (W1, 2047))
    out = tmp_path / "o.pte"
    assert main(["specialize", str(src), str(out), "--backend", "passthrough", "--quiet"]) == 2
    assert _message(src, W1, 2047) in capsys.readouterr().err
    assert not out.exists()


def test_a_value_no_graph_value_reads_is_not_refused(tmp_path: Path) -> None:
    """The sizes alone (every constant_data entry) would flag B2 cut to 0; its entry is
    used by no value of the graph once xvalues[5] is no constant, so the runtime never
    reads it: the full descriptions decide, and nothing is short."""
    data = cut_value(unused_constant(MLP.read_bytes(), 5), B2, 0)
    parsed, loader = read_container(BytesLoader(data)), BytesLoader(data)
    assert may_be_short(parsed, loader)
    assert short_values(parsed, None, read_tensors(parsed, loader)) == []
    src = tmp_path / "in.pte"
    src.write_bytes(data)
    ptestore.specialize(src, tmp_path / "o.pte", backends=["passthrough"], allow_unchanged=True)
    assert (tmp_path / "o.pte").is_file()


def test_a_longer_value_and_a_pte_without_named_data_are_accepted(tmp_path: Path) -> None:
    """The runtime reads the bytes its tensor says from a longer value (its tail unread);
    a program that holds no named data (its constants in the constant segment) has
    nothing to check."""
    src = _source(tmp_path, (W1, 2048 + 16))  # into the next value's alignment padding
    ptestore.specialize(src, tmp_path / "o.pte", backends=["passthrough"], allow_unchanged=True)
    portable = get_fixture("mlp_portable").pte_path
    assert portable is not None
    ptestore.specialize(
        portable, tmp_path / "p.pte", backends=["passthrough"], allow_unchanged=True
    )
    assert (tmp_path / "o.pte").is_file() and (tmp_path / "p.pte").is_file()


def test_an_external_tensor_s_value_the_pte_holds_is_checked_too(tmp_path: Path) -> None:
    """A program's EXTERNAL tensor whose key the .pte holds itself (synthetic: no
    exporter at hand writes one): its byte count needs its dtype, so sizes alone cannot
    clear it and the tensors are described; float32 [8] over 16 bytes is refused, over
    32 accepted."""
    src, out = tmp_path / "in.pte", tmp_path / "o.pte"
    src.write_bytes(synth.external_program("w", 16, [8]))
    with pytest.raises(FormatError) as info:
        ptestore.specialize(src, out, backends=["passthrough"], allow_unchanged=True)
    assert str(info.value) == (
        f"{src}: named data 'w' (size) = 16: must be >= 32 bytes: float32 [8], as the "
        "program's EXTERNAL tensor forward values[0] says (the runtime reads 32 bytes from "
        "the value's start, past its end)"
    )
    assert not out.exists()
    data = synth.external_program("w", 32, [8])
    assert may_be_short(read_container(BytesLoader(data)), BytesLoader(data))
    src.write_bytes(data)
    ptestore.specialize(src, out, backends=["passthrough"], allow_unchanged=True)
    assert out.is_file()
