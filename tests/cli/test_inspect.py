"""Issue 19: inspect/describe show provenance (and do not count the trailer as waste),
describe a .pte with its .ptd as one view, list the keys a .pte expects from outside,
and warn about a value whose size differs from its tensor info."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import flatbuffers
import pytest
from support import synth
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface, DeviceProfile
from ptestore.cli import main

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
assert MLP.pte_path is not None and EXT.pte_path is not None and EXT.ptd_path is not None


class Grow(BackendInterface):
    """Appends 4 bytes to the first float32 key, declaring the size change."""

    name = "XnnpackBackend"
    version = "3.0"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named)[0]
        data = bytes(named.get_data(key)) + b"\0" * 4
        output.write_named_data(key, BackendData(data, allow_size_change=True))
        self.key = key

    def compatibility_info(self, context: Any) -> str:
        return "packer=1"


@pytest.fixture
def stamped(tmp_path: Path) -> tuple[Path, str]:
    backend = Grow()
    dst = tmp_path / "o.pte"
    ptestore.specialize(
        MLP.pte_path,
        dst,
        backends=[backend],
        device=DeviceProfile("npu", {"soc": "x"}),
        provenance=True,
    )
    return dst, backend.key


def test_describe_shows_provenance_and_no_trailer_waste(stamped: tuple[Path, str]) -> None:
    dst, _ = stamped
    d = ptestore.describe(dst)
    assert d["file_size"] == dst.stat().st_size
    p = d["provenance"]
    assert p["backends"] == [
        {
            "id": "XnnpackBackend",
            "spec": "cli.test_inspect:Grow",
            "version": "3.0",
            "compatibility": "packer=1",
        }
    ]
    assert p["device"]["name"] == "npu"
    assert p["trailer"]["offset"] + p["trailer"]["size"] == d["file_size"]
    assert d["waste"]["trailing_bytes"] == 0
    assert ptestore.describe(MLP.pte_path)["provenance"] is None  # type: ignore[arg-type]


def test_inspect_text_shows_provenance(
    stamped: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    dst, _ = stamped
    assert main(["inspect", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "trailing bytes 0;" in out
    assert "bytes after the container (not waste)" in out
    assert "  backend XnnpackBackend: cli.test_inspect:Grow 3.0, compatibility " in out
    assert "  device: npu (sha256:" in out


def test_a_declared_size_change_is_warned_about(
    stamped: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    dst, key = stamped
    d = ptestore.describe(dst)
    info = next(r["tensor_info"] for r in d["keys"] if r["key"] == key)
    warning = (
        f"key {key!r}: {info['nbytes'] + 4} bytes, but its tensor info says "
        f"{info['dtype']} {info['shape']}, {info['nbytes']} bytes (a declared size change: "
        "only a runtime that reads this backend's own format can use it)"
    )
    assert warning in d["warnings"]
    assert main(["inspect", str(dst)]) == 0
    assert f"warning: {warning}" in capsys.readouterr().out


def test_a_pte_alone_lists_the_keys_it_expects_from_outside() -> None:
    d = ptestore.describe(EXT.pte_path)  # type: ignore[arg-type]
    assert d["named_data"] == []
    assert [
        (r["file"], r["size"], r["tensor_info"]["dtype"], r["tensor_info"]["shape"])
        for r in d["keys"]
    ] == [
        ("external", None, "float32", [32, 16]),
        ("external", None, "float32", [32]),
        ("external", None, "float32", [8, 32]),
        ("external", None, "float32", [8]),
    ]


def test_a_pair_is_one_view(capsys: pytest.CaptureFixture[str]) -> None:
    d = ptestore.describe(EXT.pte_path, ptd=EXT.ptd_path)  # type: ignore[arg-type]
    assert d["ptd"]["format"] == "ptd"
    ptd_keys = {r["key"]: r for r in d["ptd"]["named_data"]}
    assert len(d["keys"]) == len(ptd_keys) == 4
    for r in d["keys"]:
        assert r["file"] == "ptd"
        assert r["segment_index"] == ptd_keys[r["key"]]["segment_index"]
        assert r["size"] == r["tensor_info"]["nbytes"]
        # the .ptd's own rows get the dtypes the .pte describes
        assert ptd_keys[r["key"]]["tensor_info"] == r["tensor_info"]
    argv = ["inspect", str(EXT.pte_path), "--ptd", str(EXT.ptd_path), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == d["keys"]
    assert main(["inspect", str(EXT.pte_path), "--ptd", str(EXT.ptd_path)]) == 0
    out = capsys.readouterr().out
    assert "keys of the program (4), as the runtime merges them:" in out
    assert ".ptd (FlatTensor data)" in out


def test_a_pair_given_the_wrong_way_round_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(EXT.ptd_path), "--ptd", str(EXT.pte_path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"inspect {EXT.ptd_path} with --ptd {EXT.pte_path}: expected a .pte and a .ptd, "
        "found a .ptd and a .pte"
    ) in err


# ------------------------------------------- inspect X --compare SRC (issue 29 item 19)


def _grown(tmp_path: Path) -> tuple[Path, str, int]:
    """The fixture with its first named key grown by 512 bytes, a provenance trailer at
    its end; returns the file, the key and the file's real size."""
    from support.large import ReplaceKey

    key = ptestore.describe(MLP.pte_path)["named_data"][0]["key"]
    dst = tmp_path / "grown.pte"
    backend = ReplaceKey("XnnpackBackend", key, extra=512)
    assert ptestore.specialize(MLP.pte_path, dst, backends=[backend], provenance=True)
    return dst, key, dst.stat().st_size


def test_compare_as_json_names_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst, key, size = _grown(tmp_path)
    assert main(["inspect", str(dst), "--compare", str(MLP.pte_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["file"] == str(dst) and d["source"] == str(MLP.pte_path)
    # The file's real size, trailer included (the container ends where the trailer starts).
    trailer = ptestore.describe(dst)["provenance"]["trailer"]
    assert trailer["offset"] + trailer["size"] == size
    assert d["file_size"] == size and d["trailer_size"] == trailer["size"] > 0
    assert d["source_size"] == Path(MLP.pte_path).stat().st_size
    assert d["source_trailer_size"] is None
    (grown,) = [s for s in d["segments"] if s["status"] == "grown"]
    assert grown["keys"] == [key] and grown["size"] == grown["was"]["size"] + 512
    assert d["keys"]["changed"] == [key]
    assert d["keys"]["added"] == [] and d["keys"]["removed"] == []
    # every segment after the grown one moved by 512 bytes, the earlier ones did not
    for s in d["segments"]:
        if s["status"] == "moved":
            assert s["start"] - s["was"]["start"] == 512 and s["start"] > grown["start"]
        elif s["status"] == "unchanged":
            assert s["start"] == s["was"]["start"] < grown["start"] + 1
    assert d["counts"]["grown"] == 1 and d["counts"]["moved"] == len(d["keys"]["moved"]) > 0
    assert d["bytes_changed"] == grown["size"] == d["bytes"]["grown"]
    assert sum(d["counts"].values()) == len(d["segments"])


def test_compare_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst, key, size = _grown(tmp_path)
    assert main(["inspect", str(dst), "--compare", str(MLP.pte_path)]) == 0
    out = capsys.readouterr().out
    trailer = ptestore.describe(dst)["provenance"]["trailer"]["size"]
    assert out.startswith(f"{dst} compared with its source {MLP.pte_path}\n")
    assert f"size {size} bytes (provenance trailer {trailer}), source " in out
    assert "segments: 1 grown, 3 moved, 2 unchanged; bytes changed 2560" in out
    assert f"keys changed: {key}\n" in out
    (row,) = [line for line in out.splitlines() if line.startswith("  2 ")]
    assert row.split()[:5] == ["2", "grown", "2560", "@", "2816"] and row.endswith(key)


def test_compare_a_file_with_itself_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "inspect",
                str(EXT.pte_path),
                "--ptd",
                str(EXT.ptd_path),
                "--compare",
                str(EXT.pte_path),
                "--compare-ptd",
                str(EXT.ptd_path),
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    for side in (d, d["ptd"]):
        assert side["bytes_changed"] == 0 and set(side["counts"]) <= {"unchanged", "empty"}
        assert side["keys"]["changed"] == side["keys"]["moved"] == []
    assert d["ptd"]["file"] == str(EXT.ptd_path) and d["ptd"]["keys"]["unchanged"]


def test_compare_ptd_needs_compare(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["inspect", str(EXT.pte_path), "--ptd", str(EXT.ptd_path)]
    assert main([*argv, "--compare-ptd", str(EXT.ptd_path)]) == 2
    err = capsys.readouterr().err
    assert "--compare-ptd SRC_PTD needs --compare SRC (or --html FILE)" in err


# -- inspect --json writes one strict JSON document or nothing ----------------------------


def test_json_of_a_hostile_file_is_one_error_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 600 dims of 2**31-1: the byte size had more than 4300 digits, json.dump raised a
    # bare ValueError half-way through the document (exit 1, half a JSON object out).
    path = tmp_path / "dims.ptd"
    path.write_bytes(synth.flat_tensor([("w", (6, [2**31 - 1] * 600, []))]))
    assert main(["inspect", "--json", str(path)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["exit_code"] == 2 and out["error"]["type"] == "FormatError"
    assert out["error"]["message"] == (
        f"{path}: FlatTensor.named_data[0].tensor_layout.sizes (length) = 600: must be <= 64 "
        "dims (ptestore's limit; ExecuTorch's runtime takes at most 16)"
    )


@pytest.mark.parametrize("late", [object(), float("nan")], ids=["unserializable", "nan"])
def test_json_is_made_whole_before_any_is_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], late: object
) -> None:
    import ptestore.inspection

    monkeypatch.setattr(
        ptestore.inspection, "describe_files", lambda files: {"a": list(range(50)), "z": late}
    )
    with pytest.raises((TypeError, ValueError)):
        main(["inspect", "--json", str(MLP.pte_path)])
    assert capsys.readouterr().out == ""


def _xnnpack_pte(scale: float) -> bytes:
    """A .pte whose XNNPACK graph has one per-tensor quantized constant ``k`` (a named
    key) of the given scale."""
    b = flatbuffers.Builder(0)
    key = b.CreateString("k")
    b.StartObject(3)  # ConstantDataOffset: offset UINT64_MAX, size 4, named_key
    b.PrependUint64Slot(0, (1 << 64) - 1, 0)
    b.PrependUint64Slot(1, 4, 0)
    b.PrependUOffsetTRelativeSlot(2, key, 0)
    named = b.EndObject()
    b.StartObject(3)
    constants = synth.offsets_vector(b, [b.EndObject(), named])
    b.StartVector(4, 1, 4)
    b.PrependUint32(4)
    dims = b.EndVector()
    b.StartObject(7)  # XNNTensorValue: datatype qint8, num_dims 1, constant_buffer_idx 1
    b.PrependInt16Slot(0, 3, 0)
    b.PrependUint32Slot(1, 1, 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    b.PrependUint32Slot(3, 1, 0)
    b.PrependUint32Slot(6, 7, 0)
    tensor = b.EndObject()
    b.StartObject(2)  # PerTensorQuant
    b.PrependFloat32Slot(0, scale, 1.0)
    b.PrependInt32Slot(1, 0, 1)
    quant = b.EndObject()
    b.StartObject(3)  # XNNQuantizedTensorValue
    b.PrependUOffsetTRelativeSlot(0, tensor, 0)
    b.PrependUint8Slot(1, 2, 0)
    b.PrependUOffsetTRelativeSlot(2, quant, 0)
    qtv = b.EndObject()
    b.StartObject(2)  # XValue
    b.PrependUint8Slot(0, 2, 0)
    b.PrependUOffsetTRelativeSlot(1, qtv, 0)
    xvalues = synth.offsets_vector(b, [b.EndObject()])
    b.StartObject(9)  # XNNGraph
    b.PrependUOffsetTRelativeSlot(2, xvalues, 0)
    b.PrependUOffsetTRelativeSlot(8, constants, 0)
    b.Finish(b.EndObject(), file_identifier=b"XN01")
    return synth.overlapping_xnnpack(1, 0, graph=bytes(b.Output()))


@pytest.mark.parametrize("scale", ["nan", "inf", "-inf"])
def test_a_non_finite_scale_is_a_string_in_strict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scale: str
) -> None:
    path = tmp_path / "q.pte"
    path.write_bytes(_xnnpack_pte(float(scale)))
    assert main(["inspect", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    (key,) = [k for k in out["keys"] if k["key"] == "k"]
    assert key["tensor_info"]["quantization"]["scale"] == [scale]


# -- strings from the file are one printable line in text reports --------------------------

HOSTILE_KEY = "\x1b]0;owned\x07\x1b[2J\nprovenance: ptestore 0.1.0, device pixel9 (trusted)"


def test_a_hostile_key_is_escaped_in_the_text_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Printed raw, the key's newline forged a report line and its escape sequences set
    # the terminal's title and cleared the screen.
    path = tmp_path / "k.ptd"
    path.write_bytes(synth.flat_tensor([(HOSTILE_KEY, (6, [4], [0])), ("fc1.weight", None)]))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\nprovenance: ptestore" not in out
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\nprovenance: ptestore 0.1.0, device pixel9 (trusted)"
    rows = [line for line in out.splitlines() if line.startswith("  ") and "segment" not in line]
    assert any(line.startswith(f"  {escaped}  ") for line in rows), out
    assert any(line.startswith("  fc1.weight  ") for line in rows), out
    assert out.rstrip().endswith("provenance: none")
    assert main(["inspect", str(path), "--compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"{escaped}, fc1.weight" in out, out


def test_printable_keeps_ordinary_text_and_escapes_the_rest() -> None:
    from ptestore._text import printable

    for text in ("fc1.weight", "a b", "9eed8098f924", "poids ü €", "C:\\path"):
        assert printable(text) == text
    assert printable("a\\b\n") == "a\\\\b\\n"
    assert printable("x\u2028y\tz\x00") == "x\\u2028y\\tz\\x00"


def test_a_hostile_backend_id_is_escaped_in_the_specialize_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = flatbuffers.Builder(0)
    d = synth.delegate(b, "Evil\x1b[2J\nBackend", segment=True)
    plans = synth.offsets_vector(b, [synth.plan(b, "forward", synth.offsets_vector(b, [d]))])
    b.StartObject(2)  # DataSegment (empty)
    segments = synth.offsets_vector(b, [b.EndObject()])
    src = tmp_path / "evil.pte"
    src.write_bytes(synth.finish_program(b, plans, segments=segments))
    dst = tmp_path / "out.pte"
    assert main(["specialize", str(src), str(dst), "--allow-unchanged", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err
    assert "backend Evil\\x1b[2J\\nBackend: no implementation (data kept as is)" in out
    assert "Backend ids in the program: Evil\\x1b[2J\\nBackend." in err


def _with_footer(
    data: bytes,
    *,
    version: int | None = None,
    flip_payload: bool = False,
    content_size: int | None = None,
) -> bytes:
    """``data`` (a file with a trailer) with its footer's version or content size
    replaced, or a byte of its payload flipped (the checksum then wrong)."""
    import struct

    from ptestore.provenance.trailer import FOOTER_SIZE

    out = bytearray(data)
    if version is not None:
        struct.pack_into("<I", out, len(out) - FOOTER_SIZE + 48, version)
    if content_size is not None:
        struct.pack_into("<Q", out, len(out) - FOOTER_SIZE, content_size)
    if flip_payload:
        out[len(out) - FOOTER_SIZE - 2] ^= 0x01
    return bytes(out)


def _stamped(made: Path) -> Path:
    """A pass-through of the MLP fixture with a provenance record (a device named),
    written to ``made``."""
    ptestore.specialize(
        MLP.pte_path,
        made,
        backends=["ptestore.backends.passthrough:PassthroughBackend@XnnpackBackend"],
        device=DeviceProfile("npu", {"soc": "x"}),
        allow_unchanged=True,
    )
    return made


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"flip_payload": True}, "provenance trailer checksum = "),
        ({"version": 9}, "provenance trailer version = 9: must be 1 or 2"),
    ],
)
def test_a_damaged_trailer_still_shows_the_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: dict[str, Any], said: str
) -> None:
    """A damaged trailer (wrong checksum, unknown footer version) is the provenance
    line's ``unreadable: ...`` (``{"error": ...}`` in --json); the container is shown
    all the same, up to where the footer says it ends (inspect failed with exit 2)."""
    made = _stamped(tmp_path / "made.pte")
    path = tmp_path / "a.pte"
    path.write_bytes(_with_footer(made.read_bytes(), **damage))
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    whole = json.loads(json.dumps(ptestore.describe(made)))
    assert set(out["provenance"]) == {"error"} and said in out["provenance"]["error"]
    assert out["provenance"]["error"].startswith(f"{path}: ")
    assert out["segments"] == whole["segments"] and out["named_data"] == whole["named_data"]
    assert out["file_size"] == path.stat().st_size
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"\nprovenance: unreadable: {path}: " in text and said in text
    assert "provenance trailer: " in text  # the bytes after the container, not waste
    assert main(["inspect", str(path), "--html", str(tmp_path / "map.html")]) == 0
    assert said in (tmp_path / "map.html").read_text()


@pytest.mark.parametrize("content_size", [1, 100, 2000])
def test_a_damaged_content_size_still_shows_the_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content_size: int
) -> None:
    """The footer's content_size damaged: the container was read up to it, and inspect
    blamed the container with a file size the file does not have ("file size = 1: must
    be >= 8 bytes", exit 2). Where the container does not parse, it is the whole
    file's; the provenance line says what is wrong with the footer."""
    made = _stamped(tmp_path / "made.pte")
    path = tmp_path / "a.pte"
    path.write_bytes(_with_footer(made.read_bytes(), content_size=content_size))
    size = path.stat().st_size
    said = f"{path}: provenance trailer content_size = {content_size}: must be "
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    whole = json.loads(json.dumps(ptestore.describe(made)))
    assert set(out["provenance"]) == {"error"} and out["provenance"]["error"].startswith(said)
    assert out["segments"] == whole["segments"] and out["named_data"] == whole["named_data"]
    assert out["file_size"] == size
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"\nprovenance: unreadable: {said}" in text
    assert main(["inspect", str(path), "--html", str(tmp_path / "map.html")]) == 0
    assert said.removeprefix(f"{path}: ") in (tmp_path / "map.html").read_text()
    capsys.readouterr()
    assert main(["inspect", str(path), "--compare", str(MLP.pte_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["file"] == str(path)


def test_long_names_from_the_file_make_short_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A method name, a backend id and a compile spec's key of 100,000 characters (a
    hostile file) are cut in the text report (whole in --json)."""
    method, backend, spec = "m" * 100_000, "B" * 100_000, "k" * 100_000
    b = flatbuffers.Builder(0)
    value = b.CreateByteVector(b"\x01")
    key = b.CreateString(spec)
    b.StartObject(2)  # CompileSpec
    b.PrependUOffsetTRelativeSlot(0, key, 0)
    b.PrependUOffsetTRelativeSlot(1, value, 0)
    specs = synth.offsets_vector(b, [b.EndObject()])
    d = synth.delegate(b, backend, segment=False, specs=specs)
    plans = synth.offsets_vector(b, [synth.plan(b, method, synth.offsets_vector(b, [d]))])
    blob = b.CreateByteVector(b"inline-blob")
    b.StartObject(1)  # BackendDelegateInlineData
    b.PrependUOffsetTRelativeSlot(0, blob, 0)
    inline = b.EndObject()
    path = tmp_path / "long.pte"
    path.write_bytes(synth.finish_program(b, plans, inline=synth.offsets_vector(b, [inline])))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) < 400
    assert f"methods (1): {'m' * 300}... (100000 characters)\n" in out
    (row,) = [line for line in out.splitlines() if line.startswith("  " + "m" * 63 + "...")]
    assert f"{'B' * 63}... " in row and f"{'k' * 37}...=01" in row
    assert main(["inspect", str(path), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["methods"] == [method]
    [delegate] = whole["delegates"]
    assert (delegate["id"], delegate["compile_specs"][0]["key"]) == (backend, spec)
