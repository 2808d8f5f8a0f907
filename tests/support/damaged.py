"""Sources the stock runtime refuses, made from the committed fixtures by changing a few
bytes (the differential review's cases): ptestore must refuse each before any backend
runs (tests/coordinator/test_refused_sources.py) for the reason the runtime gives
(tests/interop/test_refused_sources_runtime.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from ptestore.format.reader import read_container
from ptestore.storage.loaders import BytesLoader
from support.fixtures import get_fixture


def _bytes(name: str, suffix: str = "pte") -> bytearray:
    fx = get_fixture(name)
    path = fx.pte_path if suffix == "pte" else fx.ptd_path
    assert path is not None
    with open(path, "rb") as f:
        return bytearray(f.read())


def _blob(data: bytearray) -> tuple[int, int]:
    """(start, segment index) of the first XnnpackBackend blob of a .pte."""
    c = read_container(BytesLoader(bytes(data))).container
    d = next(d for d in c.delegates if d.id == "XnnpackBackend")
    return c.absolute(c.segments[d.index]), d.index


def _set_segment_size(data: bytearray, index: int, size: int) -> None:
    seg = read_container(BytesLoader(bytes(data))).container.segments[index]
    assert seg.size_pos is not None
    struct.pack_into("<Q", data, seg.size_pos, size)


def _magic(data: bytearray) -> None:
    start, _ = _blob(data)
    data[start + 4 : start + 8] = b"XH01"


def _fb_outside(data: bytearray) -> None:
    start, _ = _blob(data)
    struct.pack_into("<I", data, start + 14, 2000)  # XNNHeader.flatbuffer_size


def _identifier(data: bytearray) -> None:
    start, _ = _blob(data)
    (fb_off,) = struct.unpack_from("<I", data, start + 10)
    data[start + fb_off + 4 : start + fb_off + 8] = b"XN02"


def _constant_overlaps(data: bytearray) -> None:
    start, _ = _blob(data)
    struct.pack_into("<I", data, start + 18, 100)  # XNNHeader.constant_data_offset


def _blob_cut(data: bytearray) -> None:
    _, index = _blob(data)
    _set_segment_size(data, index, 600)


def _u32(b: bytearray, p: int) -> int:
    return int(struct.unpack_from("<I", b, p)[0])


def _vtable_slot(b: bytearray, table: int, fid: int) -> int:
    """Position of field ``fid``'s entry in ``table``'s vtable."""
    return table - int(struct.unpack_from("<i", b, table)[0]) + 4 + 2 * fid


def _field(b: bytearray, table: int, fid: int) -> int:
    """Absolute position of field ``fid`` of ``table`` (which must be present)."""
    off = int(struct.unpack_from("<H", b, _vtable_slot(b, table, fid))[0])
    assert off
    return table + off


def _ref(b: bytearray, table: int, fid: int, i: int | None = None) -> int:
    """The table field ``fid`` points at (``i``: element ``i`` of that vector)."""
    p = _field(b, table, fid)
    t = p + _u32(b, p)
    if i is None:
        return t
    return t + 4 + 4 * i + _u32(b, t + 4 + 4 * i)


def _plan(b: bytearray) -> int:
    return _ref(b, _u32(b, 0), 1, 0)  # Program.execution_plan[0]


def _no_delegates_field(data: bytearray) -> None:
    """ExecutionPlan[0]'s vtable entry for ``delegates`` (field 7) set to 0: absent."""
    struct.pack_into("<H", data, _vtable_slot(data, _plan(data), 7), 0)


def _delegate_at_weight(data: bytearray) -> None:
    """The first delegate's ``processed.index`` moved from its blob to the next segment
    (a weight)."""
    _, index = _blob(data)
    processed = _ref(data, _ref(data, _plan(data), 7, 0), 1)  # delegates[0].processed
    pos = _field(data, processed, 1)
    assert _u32(data, pos) == index
    struct.pack_into("<I", data, pos, index + 1)


@dataclass(frozen=True)
class Damaged:
    name: str
    fixture: str
    change: Callable[[bytearray], None]
    #: ptestore's message after the damaged file's name (": ..." or " (blob ...): ...")
    message: str
    #: what the runtime's log says when it refuses the source
    runtime: str
    in_ptd: bool = False

    def files(self) -> tuple[bytes, bytes | None]:
        """The damaged .pte and .ptd (None: the fixture has none)."""
        fx = get_fixture(self.fixture)
        pte = _bytes(self.fixture)
        ptd = _bytes(self.fixture, "ptd") if fx.ptd_path is not None else None
        target = ptd if self.in_ptd else pte
        assert target is not None
        self.change(target)
        return bytes(pte), None if ptd is None else bytes(ptd)


def _data_size(value: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:
        struct.pack_into("<Q", data, 40, value)  # FlatTensor header segment_data_size

    return change


BLOB = " (XnnpackBackend blob of forward[0], segment 1): "
IDENTIFIER = "XNNGraph file identifier (bytes 4..8) = "
REFUSED_GRAPH = "XNNCompiler.cpp"  # "XNNPACK Delegate Serialization Format Invalid"
REFUSED_HEADER = "XNNHeader.cpp"
XNNPACK_BLOBS = [
    Damaged(
        "xh_magic_XH01",
        "mlp_xnnpack",
        _magic,
        f"{BLOB}{IDENTIFIER}b'XH01': must be b'XN01' or b'XN00'",
        REFUSED_GRAPH,
    ),
    Damaged(
        "xh_flatbuffer_outside_blob",
        "mlp_xnnpack",
        _fb_outside,
        f"{BLOB}XNNHeader.flatbuffer_size = 2000: must be >= 8 with flatbuffer_offset 32 + "
        "size inside the 1184-byte blob",
        REFUSED_HEADER,
    ),
    Damaged(
        "xnngraph_identifier_XN02",
        "mlp_xnnpack",
        _identifier,
        f"{BLOB}{IDENTIFIER}b'XN02': must be b'XN01' or b'XN00'",
        REFUSED_GRAPH,
    ),
    Damaged(
        "xh_constant_overlaps_graph",
        "mlp_xnnpack",
        _constant_overlaps,
        f"{BLOB}XNNHeader.constant_data_offset = 100: must be after the FlatBuffer (>= 1176) "
        "with the 0-byte constant data inside the 1184-byte blob",
        REFUSED_HEADER,
    ),
    Damaged(
        "blob_segment_cut_to_600",
        "mlp_xnnpack",
        _blob_cut,
        f"{BLOB}XNNHeader.flatbuffer_size = 1144: must be >= 8 with flatbuffer_offset 32 + "
        "size inside the 600-byte blob",
        REFUSED_HEADER,
    ),
    Damaged(
        "delegate_at_a_weight_segment",
        "mlp_xnnpack",
        _delegate_at_weight,
        f"{BLOB.replace('segment 1', 'segment 2')}{IDENTIFIER}b'^T\\t>': must be b'XN01' or "
        "b'XN00'",
        REFUSED_GRAPH,
    ),
]
PROGRAM = [
    Damaged(
        "plan_without_delegates_field",
        "mlp_portable",
        _no_delegates_field,
        ": Program.execution_plan[0].delegates = None: must be present (an empty vector when "
        "method 'forward' has no delegate)",
        "Missing delegates field",
    )
]
PTD_DATA_SIZE = [
    Damaged(
        f"{fx}_ptd_data_size_{v}",
        f"mlp_{fx}_ext",
        _data_size(v),
        f": FlatTensor.segments[0].offset + size = 2048: must be <= {base + v} "
        f"(segment_base_offset {base} + the header's segment_data_size {v}: the runtime's "
        "bound for a .ptd segment)",
        "malformed PTD file",
        in_ptd=True,
    )
    for fx, base in (("portable", 512), ("xnnpack", 640))
    for v in (0, 1000)
]
ALL = XNNPACK_BLOBS + PROGRAM + PTD_DATA_SIZE


def cut_value(data: bytes | bytearray, key: str, size: int) -> bytes:
    """``data`` (a .pte or .ptd) with the stored size of ``key``'s segment set to ``size``
    (its bytes and every other byte left where they are): a value shorter than its
    tensor when ``size`` is below the description's byte count."""
    out = bytearray(data)
    c = read_container(BytesLoader(bytes(out))).container
    _set_segment_size(out, next(e.segment_index for e in c.named_data if e.key == key), size)
    return bytes(out)


def unused_constant(data: bytes | bytearray, xvalue: int) -> bytes:
    """``data`` (the ``mlp_xnnpack`` .pte) with ``xvalues[xvalue]`` of its graph no
    longer a constant (``constant_buffer_idx`` 0): its ``constant_data`` entry stays,
    used by no value of the graph, so the runtime never reads its key."""
    out = bytearray(data)
    start, _ = _blob(out)
    (fb_off,) = struct.unpack_from("<I", out, start + 10)  # XNNHeader.flatbuffer_offset
    graph = start + fb_off
    xv = _ref(out, graph + _u32(out, graph), 2, xvalue)  # XNNGraph.xvalues[xvalue]
    assert out[_field(out, xv, 0)] == 1  # XValueUnion: XNNTensorValue
    tensor = _ref(out, xv, 1)
    struct.pack_into("<I", out, _field(out, tensor, 3), 0)  # constant_buffer_idx
    return bytes(out)


def xh29_pair() -> tuple[bytes, bytes]:
    """The ``mlp_xnnpack_ext`` pair, its blob's XNNHeader length field 29: the runtime
    does not read that field and loads the pair."""
    pte, ptd = _bytes("mlp_xnnpack_ext"), _bytes("mlp_xnnpack_ext", "ptd")
    start, _ = _blob(pte)
    assert pte[start + 4 : start + 8] == b"XH00"
    struct.pack_into("<H", pte, start + 8, 29)
    return bytes(pte), bytes(ptd)
