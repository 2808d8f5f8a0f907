"""ptestore's own backends (passthrough, command) and the examples through the backend
contract kit (``ptestore.testing.BackendContract``), plus the kit's helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from examples.bf16_round import Bf16Round
from examples.double_first_weight import DoubleFirstWeight
from ptestore.backends import BackendInterface
from ptestore.backends.command import CommandBackend
from ptestore.backends.passthrough import PassthroughBackend
from ptestore.testing import (
    BackendContract,
    Program,
    compare_outputs,
    open_named_data,
    shipped_program,
    shipped_programs,
)

#: Rounds every float32 value (by the tensor info ptestore passes) to bfloat16
#: precision, keeping float32 and its size; anything else is kept (empty stdout).
BF16_COMMAND = r"""
import array, json, os, sys
info = json.loads(os.environ["PTESTORE_TENSOR_INFO"])
data = sys.stdin.buffer.read()
if info is None or info["dtype"] != "float32" or len(data) % 4:
    sys.exit(0)
words = array.array("I", data)
for i, x in enumerate(words):
    words[i] = ((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
sys.stdout.buffer.write(words.tobytes())
"""


class TestPassthroughContract(BackendContract):
    declines_on_purpose = True  # its whole job is to replace nothing

    def make_backend(self) -> BackendInterface:
        return PassthroughBackend()


class TestCommandContract(BackendContract):
    serve_id = "XnnpackBackend"

    def make_backend(self) -> BackendInterface:
        return CommandBackend([sys.executable, "-c", BF16_COMMAND], processed=False)

    def tolerance(self, program: Program) -> tuple[float, float]:
        return max(program.atol, 3e-2), max(program.rtol, 3e-2)


#: BF16_COMMAND for plain float32 tensors only, as examples/bf16_round.py rounds them: a
#: quantization scale is kept, and so is every key that shares its bytes with one
#: (PTESTORE_SHARED_KEYS: the program runs once per key, and keys sharing a segment must
#: all get the same bytes; scale_alias_xnnpack's float32 tensor shares a scale's bytes).
#: NAIVE_BF16_COMMAND is the same program without that knowledge.
PLAIN_BF16_COMMAND = r"""
import array, json, os, sys
def plain(i):
    return (i is not None and i["dtype"] == "float32" and i["role"] == "tensor"
            and i["quantization"] is None and not i["other_uses"])
info = json.loads(os.environ["PTESTORE_TENSOR_INFO"])
shared = json.loads(os.environ["PTESTORE_SHARED_KEYS"])
data = sys.stdin.buffer.read()
if not plain(info) or not all(plain(i) for i in shared.values()) or len(data) % 4:
    sys.exit(0)
words = array.array("I", data)
for i, x in enumerate(words):
    words[i] = ((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
sys.stdout.buffer.write(words.tobytes())
"""
NAIVE_BF16_COMMAND = PLAIN_BF16_COMMAND.replace(
    'json.loads(os.environ["PTESTORE_SHARED_KEYS"])', "{}"
)


class TestBf16RoundContract(BackendContract):
    def make_backend(self) -> BackendInterface:
        return Bf16Round()

    def tolerance(self, program: Program) -> tuple[float, float]:
        return max(program.atol, 3e-2), max(program.rtol, 3e-2)


class TestDoubleFirstWeightContract(BackendContract):
    """The hooks for a backend that changes what the model computes (two programs)."""

    def make_backend(self) -> BackendInterface:
        return DoubleFirstWeight()

    def contract_programs(self) -> list[Program]:
        return [shipped_program("mlp_xnnpack"), shipped_program("mlp_xnnpack_ext")]

    def reference_outputs(self, program: Program) -> None:
        return None  # doubling a weight changes what the model computes

    def rerun_changes(self, program: Program) -> str:
        return "it doubles the first float32 weight again on every run"


def test_open_named_data_reads_a_pair_with_tensor_info() -> None:
    program = shipped_program("mlp_xnnpack_ext")
    with open_named_data(program.pte, program.ptd) as named:
        assert len(named) == 4
        shapes = sorted(tuple(named.get_array(k).shape) for k in named)
        assert shapes == [(8,), (8, 32), (32,), (32, 16)]
        assert {named.file_of(k) for k in named} == {"ptd"}
        for key in named:
            info = named.get_tensor_info(key)
            assert info is not None and info.dtype == "float32"
            assert len(named.get_data(key)) == info.nbytes
            assert named.get_shared_keys(key) == ()


def test_open_named_data_shows_aliased_keys() -> None:
    program = shipped_program("scale_alias_xnnpack")
    with open_named_data(program.pte) as named:
        shared = {k: named.get_shared_keys(k) for k in named if named.get_shared_keys(k)}
        assert len(shared) == 2
        a, b = sorted(shared)
        assert shared[a] == (b,) and bytes(named.get_data(a)) == bytes(named.get_data(b))


def test_open_named_data_refuses_a_ptd_as_pte() -> None:
    program = shipped_program("mlp_xnnpack_ext")
    assert program.ptd is not None
    with pytest.raises(Exception, match=r"mlp_xnnpack_ext\.ptd: expected a \.pte, found a \.ptd"):
        open_named_data(program.ptd)


def test_shipped_programs_are_small_and_complete() -> None:
    programs = shipped_programs()
    assert [p.name for p in programs] == [
        "mlp_xnnpack",
        "quant_xnnpack",
        "scale_alias_xnnpack",
        "shared_blob_xnnpack",
        "two_methods_xnnpack",
        "mlp_xnnpack_ext",
    ]
    total = sum(p.pte.stat().st_size + (p.ptd.stat().st_size if p.ptd else 0) for p in programs)
    assert total < 64 * 1024
    for p in programs:
        assert set(p.inputs) == set(p.outputs) == set(p.methods)


def test_compare_outputs_names_every_difference() -> None:
    ref = {"forward": [np.zeros((2, 3), np.float32)]}
    assert compare_outputs(ref, ref) == []
    got = {"forward": [np.full((2, 3), 0.5, np.float32)]}
    assert compare_outputs(got, ref, atol=0.1, rtol=0.0) == [
        "method 'forward' output 0: max abs difference 0.5 exceeds atol=0.1 rtol=0.0"
    ]
    assert compare_outputs({"forward": [np.zeros(3, np.int64)]}, ref) == [
        "method 'forward' output 0: int64 [3], expected float32 [2, 3]"
    ]
    assert compare_outputs({}, ref) == ["method 'forward': no outputs"]
    assert compare_outputs(got, ref, values=False) == []


#: Records, per run of the program, its kind, key and PTESTORE_SHARED_KEYS (one JSON
#: line appended to the file argv[1]); keeps the input.
RECORD_COMMAND = r"""
import json, os, sys
sys.stdin.buffer.read()
seen = {k: os.environ[f"PTESTORE_{k}"] for k in ("KIND", "KEY", "SHARED_KEYS")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(seen) + "\n")
"""


def test_a_command_program_is_told_which_keys_share_its_bytes(tmp_path: Path) -> None:
    """PTESTORE_SHARED_KEYS: the other keys stored in the same bytes, with their tensor
    info; ``{}`` for a key that shares nothing and for a blob. Before, nothing told the
    program, so one run per key could not give every alias the same bytes."""
    import json

    import ptestore

    log = tmp_path / "runs.jsonl"
    program = shipped_program("scale_alias_xnnpack")
    backend = CommandBackend([sys.executable, "-c", RECORD_COMMAND, str(log)])
    ptestore.specialize(program.pte, tmp_path / "o.pte", backends=[backend], allow_unchanged=True)
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    with open_named_data(program.pte) as named:
        want = {
            key: {k: named.get_tensor_info(k).to_json() for k in named.get_shared_keys(key)}
            for key in named
        }
    assert sum(1 for shared in want.values() if shared) == 2  # the fixture's alias pair
    blobs = [r for r in runs if r["KIND"] == "processed"]
    assert blobs and all(r["SHARED_KEYS"] == "{}" for r in blobs)
    told = {r["KEY"]: json.loads(r["SHARED_KEYS"]) for r in runs if r["KIND"] == "named_data"}
    assert told == want
    scale = next(k for k in want if k.startswith("scale_"))
    (alias,) = want[scale]
    assert told[alias][scale]["role"] == "scale"  # what the program needs to keep it


def test_a_command_program_can_keep_every_alias_of_a_scale(tmp_path: Path) -> None:
    """Rounding plain float32 tensors only: without PTESTORE_SHARED_KEYS the program
    rounds the tensor whose bytes a scale shares and keeps the scale, and the run is
    refused; told, it keeps both (and still rounds a model's plain weights)."""
    import ptestore
    from ptestore.errors import InvalidReplacement

    aliased = shipped_program("scale_alias_xnnpack")
    naive = CommandBackend([sys.executable, "-c", NAIVE_BF16_COMMAND], processed=False)
    assert NAIVE_BF16_COMMAND != PLAIN_BF16_COMMAND
    with pytest.raises(InvalidReplacement, match="replace every alias with identical bytes"):
        ptestore.specialize(aliased.pte, tmp_path / "o.pte", backends=[naive])
    told = CommandBackend([sys.executable, "-c", PLAIN_BF16_COMMAND], processed=False)
    report = ptestore.specialize(
        aliased.pte, tmp_path / "o.pte", backends=[told], allow_unchanged=True
    )
    assert report.backends[0].keys_replaced == []  # the scale and its alias kept alike
    mlp = shipped_program("mlp_xnnpack")
    report = ptestore.specialize(mlp.pte, tmp_path / "m.pte", backends=[told])
    assert len(report.backends[0].keys_replaced) == 4
