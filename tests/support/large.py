"""Larger programs for copy-on-write tests, made from a real export by ptestore itself.

``inflate(src, dst, nbytes)`` replaces every named-data value of a real XNNPACK .pte with
``nbytes`` of seeded random bytes (``allow_size_change=True``): the result has the
export's real metadata, delegates and keys, and segments big enough for whole-block
clones (the runtime cannot run it: the weights are noise). ``inflated(dst, nbytes)`` makes
one such program, once, from the ``mlp_xnnpack`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import ptestore
from ptestore.backends import BackendData, BackendInterface
from support.fixtures import get_fixture


class Inflate(BackendInterface):
    """Replaces every key with ``nbytes`` random bytes (a list: the sizes of the keys in
    sorted order)."""

    def __init__(self, backend_id: str, nbytes: int | Sequence[int]) -> None:
        self.name = backend_id
        self.nbytes = nbytes

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        rng = np.random.default_rng(0)
        for i, key in enumerate(sorted(named)):
            n = self.nbytes if isinstance(self.nbytes, int) else self.nbytes[i]
            value = rng.integers(0, 255, n, dtype=np.uint8)
            output.write_named_data(key, BackendData(value, allow_size_change=True))


class ReplaceKey(BackendInterface):
    """Replaces one key with its bytes reversed plus ``extra`` bytes (a growth when
    ``extra`` > 0); ``alignment`` is the alignment asked for."""

    def __init__(self, backend_id: str, key: str, extra: int = 0, alignment: int = 1) -> None:
        self.name = backend_id
        self.key = key
        self.extra = extra
        self.alignment = alignment
        self.replacement = b""

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        value = bytes(context.get_named_data_map().get_data(self.key))
        self.replacement = value[::-1] + bytes(i % 251 for i in range(self.extra))
        data = BackendData(
            self.replacement, alignment=self.alignment, allow_size_change=self.extra != 0
        )
        output.write_named_data(self.key, data)


def inflate(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], nbytes: int | Sequence[int]
) -> None:
    """Write ``src`` (a real XNNPACK .pte) with every key's value ``nbytes`` long (a
    list: each key's, in sorted order)."""
    report = ptestore.specialize(
        src, dst, backends=[Inflate("XnnpackBackend", nbytes)], provenance=False
    )
    assert report.specialized, report


def inflated(dst: str | os.PathLike[str], nbytes: int | Sequence[int]) -> None:
    """Where ``dst`` is absent, write there the ``mlp_xnnpack`` fixture (4 values) with
    every key's value ``nbytes`` long (:func:`inflate`: no provenance trailer)."""
    if not os.path.exists(dst):
        fx = get_fixture("mlp_xnnpack")
        assert fx.pte_path is not None
        inflate(fx.pte_path, dst, nbytes)
