"""What a backend submits as bytes (``coordinator/buffers.py``) and how it names keys.

- A buffer of Python object pointers (a numpy array of ``dtype=object``, format ``'O'``)
  was taken as bytes (``memoryview(...).cast("B")``) and published this process's
  memory addresses: refused wherever it is submitted (a value, a chunk, a blob).
- A typed buffer that is not numpy (a ``memoryview`` of float64 values, an
  ``array.array('i')``) for a float32 key was taken as raw bytes; a numpy array of the
  wrong dtype was already refused: the same rule now, by the buffer's format.
- ``write_named_data(5, BackendData(...))`` said "pass a mapping or pairs, not data"
  instead of that keys are strings; ``write_named_data([(KEY,)])`` gave a raw
  unpacking ``ValueError``."""

from __future__ import annotations

import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.quiet_backend import Quiet

import ptestore
from ptestore.backends import BackendData
from ptestore.errors import BackendError, InvalidReplacement

POINTERS = (
    "{what}: {which} is a buffer of Python object pointers (format 'O': a numpy array of "
    "dtype object?): its bytes are memory addresses of this process, not data; convert the "
    "values to a numeric dtype (numpy.asarray(values, dtype=numpy.float32)) or pass bytes"
)

Submit = Callable[[Any, Any, Any, str], None]


def _float_key(named: Any) -> str:
    return next(k for k in sorted(named) if (i := named.get_tensor_info(k)) and len(i.shape) == 2)


def _run(src: Path, tmp_path: Path, submit: Submit) -> ptestore.SpecializationReport:
    class Submits(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            submit(context, output, named, _float_key(named))

    return ptestore.specialize(src, tmp_path / "o.pte", backends=[Submits()])


def _objects(named: Any, key: str) -> np.ndarray:
    """As many object pointers as the value has bytes / 8: the size is right."""
    return np.array([object() for _ in range(named.get_data_size(key) // 8)], dtype=object)


@pytest.mark.parametrize(
    ("submit", "what", "which"),
    [
        (
            lambda c, o, n, k: o.write_named_data(
                k, BackendData(_objects(n, k), allow_size_change=True)
            ),
            "write_named_data",
            "BackendData.data",
        ),
        (
            lambda c, o, n, k: o.write_named_data(k, BackendData(memoryview(_objects(n, k)))),
            "write_named_data",
            "BackendData.data",
        ),
        (
            lambda c, o, n, k: o.write_named_data_chunks(
                k, n.get_data_size(k), [memoryview(_objects(n, k))]
            ),
            "write_named_data_chunks",
            "a chunk",
        ),
        (
            lambda c, o, n, k: [
                o.write_processed_data(BackendData(np.array([object()] * 4, dtype=object)))
                for _ in c
            ],
            "write_processed_data",
            "BackendData.data",
        ),
    ],
    ids=["array", "memoryview", "chunk", "blob"],
)
def test_object_pointers_are_refused(
    src: Path, tmp_path: Path, submit: Submit, what: str, which: str
) -> None:
    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, submit)
    assert err.value.message == POINTERS.format(what=what, which=which)
    assert not (tmp_path / "o.pte").exists()


def test_a_typed_buffer_of_another_dtype_is_refused(src: Path, tmp_path: Path) -> None:
    def doubles(c: Any, o: Any, n: Any, k: str) -> None:
        o.write_named_data(k, BackendData(memoryview(np.zeros(n.get_data_size(k) // 8))))

    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, doubles)
    assert err.value.message == (
        "write_named_data: the replacement is a buffer of format 'd' (float64), the key "
        "holds float32 [32, 16], 2048 bytes (from xnnpack forward[0] xvalues[1]): convert it "
        "(numpy.asarray(...).astype(numpy.float32)), or pass BackendData(..., "
        "allow_size_change=True) if it is your runtime's own format"
    )

    def ints(c: Any, o: Any, n: Any, k: str) -> None:
        chunk = array.array("i", bytes(n.get_data_size(k)))
        o.write_named_data_chunks(k, n.get_data_size(k), [chunk])

    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, ints)
    assert err.value.message.startswith(
        "write_named_data_chunks: a chunk is a buffer of format 'i' (int32), the key holds "
        "float32 [32, 16]"
    )


@pytest.mark.parametrize(
    "value",
    [
        lambda a: memoryview(a),  # format 'f': float32, as the key
        lambda a: a.tobytes(),
        lambda a: memoryview(a).cast("B"),
        lambda a: bytearray(a.tobytes()),
        lambda a: array.array("f", a.tobytes()),
    ],
    ids=["float32-view", "bytes", "byte-view", "bytearray", "array-f"],
)
def test_buffers_that_say_the_keys_dtype_or_raw_bytes_are_taken(
    src: Path, tmp_path: Path, value: Callable[[np.ndarray], Any]
) -> None:
    def doubled(c: Any, o: Any, n: Any, k: str) -> None:
        o.write_named_data(k, BackendData(value(np.array(n.get_array(k)) * 2)))

    report = _run(src, tmp_path, doubled)
    assert report.backends[0].status == "specialized"


def test_a_key_that_is_not_a_string_is_named_so(src: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, lambda c, o, n, k: o.write_named_data(5, BackendData(b"x")))
    assert err.value.message == "named data keys are strings, got int"
    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, lambda c, o, n, k: o.write_named_data(b"k", BackendData(b"x")))
    assert err.value.message == "named data keys are strings, got bytes"
    pairs = [(5, BackendData(b"x"))]
    with pytest.raises(InvalidReplacement) as err:
        _run(src, tmp_path, lambda c, o, n, k: o.write_named_data(pairs))
    assert err.value.message == "named data keys are strings, got int"


@pytest.mark.parametrize(
    ("items", "shown"),
    [
        (lambda k: [(k,)], "tuple ('{k16}"),
        (lambda k: [k], "str '{k16}"),
        (lambda k: [(k, BackendData(b"x"), 4)], "tuple ('{k16}"),
        (lambda k: [7], "int 7"),
    ],
    ids=["one-element", "a-key-alone", "three-elements", "not-a-pair"],
)
def test_an_item_that_is_not_a_pair_is_named_so(
    src: Path, tmp_path: Path, items: Callable[[str], Any], shown: str
) -> None:
    with pytest.raises(BackendError) as err:
        _run(src, tmp_path, lambda c, o, n, k: o.write_named_data(items(k)))
    message = str(err.value)
    said = "initialize_backend_data failed: TypeError: write_named_data(items): each item "
    said += "must be a (key, BackendData) pair, got "
    assert said in message, message
    key = message.split("key '")[1][:16]
    assert message.split(said)[1].startswith(shown.format(k16=key)), message
    assert isinstance(err.value.__cause__, TypeError)
