"""ptestore's own backends (passthrough, command) and the examples through the backend
contract kit (``ptestore.testing.BackendContract``), plus the kit's helpers."""

from __future__ import annotations

import sys

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
