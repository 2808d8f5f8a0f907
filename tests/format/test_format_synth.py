"""Forms no committed fixture has: the pre-1.0 24-byte header, longer headers, compile
specs with values, inline delegate data. Built from real fixtures or with the
flatbuffers Builder, then read and patched."""

from __future__ import annotations

import struct

import flatbuffers
import pytest
from support import synth
from support.fixtures import get_fixture

from ptestore.format import parse, patch_metadata
from ptestore.inspection import describe

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None


def header24(data: bytes) -> bytes:
    """The same program with a pre-1.0 24-byte extended header: the length says 24 and
    the 8 bytes where segment_data_size would be are header padding (zeros)."""
    out = bytearray(data)
    struct.pack_into("<I", out, 12, 24)
    out[32:40] = b"\0" * 8
    return bytes(out)


def test_24_byte_header_is_read_and_patched() -> None:
    data = header24(MLP.pte_path.read_bytes())  # type: ignore[union-attr]
    c = parse(data, len(data), "old.pte")
    assert c.header is not None
    assert c.header.length == 24
    assert c.header.segment_data_size is None  # type: ignore[union-attr]
    assert describe(c)["header"]["segment_data_size"] is None
    placements = [(s.offset + 4096, s.size) for s in c.segments]
    result = patch_metadata(c, data, placements, base_alignment=4096)
    meta = result.metadata
    assert meta[32:40] == b"\0" * 8  # never writes a field the header does not have
    assert struct.unpack_from("<I", meta, 12)[0] == 24
    new = bytearray(result.file_size)
    new[: len(meta)] = meta
    c2 = parse(bytes(new), len(new), "new.pte")
    assert [(s.offset, s.size) for s in c2.segments] == placements


def test_longer_header_is_accepted() -> None:
    data = bytearray(MLP.pte_path.read_bytes())  # type: ignore[union-attr]
    struct.pack_into("<I", data, 12, 40)  # a future header with one more field
    c = parse(bytes(data), len(data), "future.pte")
    assert c.header is not None
    assert c.header.length == 40


def _program_with_specs_and_inline_blob() -> bytes:
    b = flatbuffers.Builder(0)
    value = b.CreateByteVector(b"\x01\x02\xff")
    key = b.CreateString("weights_format")
    b.StartObject(2)  # CompileSpec
    b.PrependUOffsetTRelativeSlot(0, key, 0)
    b.PrependUOffsetTRelativeSlot(1, value, 0)
    spec = b.EndObject()
    specs = synth.offsets_vector(b, [spec])
    d = synth.delegate(b, "VendorNpuBackend", segment=False, specs=specs)
    plans = synth.offsets_vector(b, [synth.plan(b, "forward", synth.offsets_vector(b, [d]))])
    blob = b.CreateByteVector(b"inline-blob")
    b.StartObject(1)  # BackendDelegateInlineData
    b.PrependUOffsetTRelativeSlot(0, blob, 0)
    inline = b.EndObject()
    return synth.finish_program(b, plans, inline=synth.offsets_vector(b, [inline]))


def test_compile_specs_and_inline_delegates() -> None:
    data = _program_with_specs_and_inline_blob()
    c = parse(data, len(data), "npu.pte")
    assert c.header is None
    ((pos, size),) = c.inline_delegate_data
    assert data[pos : pos + size] == b"inline-blob"
    (d,) = describe(c)["delegates"]
    assert d == {
        "method": "forward",
        "id": "VendorNpuBackend",
        "location": "inline",
        "index": 0,
        "compile_specs": [{"key": "weights_format", "value": "0102ff"}],
    }


def test_inline_delegate_input_and_refused_replacement(tmp_path: object) -> None:
    import ptestore
    from ptestore.backends import BackendData, BackendInterface
    from ptestore.errors import InvalidReplacement
    from ptestore.storage.loaders import BytesLoader
    from ptestore.writers import open_writer

    seen: list[bytes] = []

    class Npu(BackendInterface):
        name = "VendorNpuBackend"

        def initialize_backend_data(self, context: object, output: object) -> None:
            item = context.next_backend_data()  # type: ignore[attr-defined]
            seen.append(bytes(item.processed))
            assert item.compile_spec("weights_format") == b"\x01\x02\xff"
            output.write_processed_data(BackendData(b"compiled"))  # type: ignore[attr-defined]

    data = _program_with_specs_and_inline_blob()
    writer = open_writer("memory://synth/npu-out.pte")
    with pytest.raises(InvalidReplacement, match=r"keeps its processed data inline"):
        ptestore.initialize_and_save_backend_data(BytesLoader(data), writer, backends=[Npu()])
    assert seen == [b"inline-blob"]
    import fsspec

    assert not fsspec.filesystem("memory").exists("/synth/npu-out.pte")
