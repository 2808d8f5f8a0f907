"""Provenance trailers: format, errors, the pipeline writing them, replacing instead of
stacking, device profiles reaching backends, versions and compatibility strings."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import all_fixtures, get_fixture

import ptestore
from ptestore.backends import BackendInterface
from ptestore.backends.command import CommandBackend
from ptestore.backends.compat import (
    Compatibility,
    DeviceProfile,
    distribution_version,
    parse_device_options,
)
from ptestore.backends.passthrough import PassthroughBackend
from ptestore.errors import BackendError, ConfigurationError, FormatError
from ptestore.format.reader import read_container
from ptestore.provenance import (
    Provenance,
    encode_trailer,
    provenance_json,
    read_provenance,
    read_trailer,
    replace_trailer,
    without_trailer,
)
from ptestore.provenance.trailer import FOOTER_SIZE, MAX_PAYLOAD_SIZE, decode_footer
from ptestore.storage.loaders import BytesLoader, open_loader

MLP = get_fixture("mlp_xnnpack")
PORTABLE_EXT = get_fixture("mlp_portable_ext")  # no extended header: program = whole file
EXT = get_fixture("mlp_xnnpack_ext")
DEVICE = DeviceProfile("pixel9", {"soc": "sm8650", "scale": 2.0})


def _path(fx: Any) -> Path:
    assert fx.pte_path is not None
    return Path(fx.pte_path)


# -- the binary format -------------------------------------------------------------------


def test_trailer_round_trip_and_layout() -> None:
    body = b"\x00" * 100
    data = body + encode_trailer({"a": 1, "b": "x"}, len(body))
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    assert trailer.content_size == 100
    assert trailer.record() == {"a": 1, "b": "x"}
    assert trailer.payload == b'{"a":1,"b":"x"}'
    assert trailer.size == len(data) - 100 == len(trailer.payload) + FOOTER_SIZE
    assert trailer.sha256 == hashlib.sha256(trailer.payload).hexdigest()
    assert data[-8:] == b"PTSTPROV"
    assert struct.unpack_from("<QQ", data, len(data) - FOOTER_SIZE) == (100, len(trailer.payload))


def test_no_trailer_is_none_and_without_trailer_is_identity() -> None:
    assert read_trailer(BytesLoader(b"")) is None
    assert read_trailer(BytesLoader(b"x" * 63)) is None
    loader = BytesLoader(_path(MLP).read_bytes())
    assert read_trailer(loader) is None
    assert without_trailer(loader) is loader


def test_large_payload_needs_a_second_read() -> None:
    payload = {"blob": "y" * 20000}
    data = b"abc" + encode_trailer(payload, 3)
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None and trailer.record() == payload


def test_damaged_checksum_is_a_format_error() -> None:
    data = bytearray(b"\x01" * 10 + encode_trailer({"k": "v"}, 10))
    data[12] ^= 0xFF  # inside the payload
    with pytest.raises(FormatError, match="provenance trailer checksum") as info:
        read_trailer(BytesLoader(bytes(data), name="mem://bad.pte"))
    assert str(info.value).startswith("mem://bad.pte: provenance trailer checksum = ")
    assert "(the trailer was damaged)" in str(info.value)


def test_inconsistent_sizes_are_a_format_error() -> None:
    good = b"\x01" * 10 + encode_trailer({"k": "v"}, 10)
    with pytest.raises(FormatError) as info:
        read_trailer(BytesLoader(b"\x02" + good, name="x.pte"))  # one byte more in front
    assert str(info.value) == (
        "x.pte: provenance trailer content_size = 10: must be 11 (file size "
        f"{len(good) + 1} - payload 9 - footer 64) (provenance trailer at the end of the "
        f"{len(good) + 1}-byte file)"
    )


def test_bad_version_and_footer_size_and_payload_size() -> None:
    footer = struct.pack("<QQ32sII8s", 0, 0, bytes(32), 3, 64, b"PTSTPROV")
    with pytest.raises(FormatError, match="provenance trailer version = 3: must be 1 or 2"):
        decode_footer(footer, 64, "f")
    footer = struct.pack("<QQ32sII8s", 0, 0, bytes(32), 1, 48, b"PTSTPROV")
    with pytest.raises(FormatError, match="provenance trailer footer size = 48: must be 64"):
        decode_footer(footer, 64, "f")
    footer = struct.pack("<QQ32sII8s", 0, MAX_PAYLOAD_SIZE + 1, bytes(32), 1, 64, b"PTSTPROV")
    with pytest.raises(FormatError, match=f"payload_size = {MAX_PAYLOAD_SIZE + 1}: must be <="):
        decode_footer(footer, 64, "f")
    with pytest.raises(ValueError, match="a footer is 64 bytes, got 3"):
        decode_footer(b"abc", 3, "f")


def test_payload_must_be_a_json_object() -> None:
    body = b"[1,2]"
    footer = struct.pack(
        "<QQ32sII8s", 0, len(body), hashlib.sha256(body).digest(), 1, 64, b"PTSTPROV"
    )
    with pytest.raises(FormatError, match="provenance trailer payload = 'list': must be a JSON"):
        read_trailer(BytesLoader(body + footer))
    body = b"{nope"
    footer = struct.pack(
        "<QQ32sII8s", 0, len(body), hashlib.sha256(body).digest(), 1, 64, b"PTSTPROV"
    )
    with pytest.raises(FormatError, match="must be a JSON object"):
        read_trailer(BytesLoader(body + footer))


def test_encode_refuses_oversized_payload_and_negative_offset() -> None:
    with pytest.raises(ValueError, match=f"the limit is {MAX_PAYLOAD_SIZE}"):
        encode_trailer({"x": "z" * MAX_PAYLOAD_SIZE}, 0)
    with pytest.raises(ValueError, match="content_size must be >= 0, got -1"):
        encode_trailer({}, -1)


def test_record_validation_names_the_field() -> None:
    data = _specialized(_path(MLP))
    record = json.loads(read_trailer(BytesLoader(data)).payload)  # type: ignore[union-attr]
    bad = dict(record, source={**record["source"], "size": "12"})
    with pytest.raises(FormatError, match=r"x: provenance source\.size = '12': must be an integer"):
        Provenance.from_dict(bad, "x")
    with pytest.raises(FormatError, match=r"format = None: must be 'ptestore\.provenance'"):
        Provenance.from_dict({}, "x")
    with pytest.raises(FormatError, match="provenance role = 'exe': must be 'pte' or 'ptd'"):
        Provenance.from_dict(dict(record, role="exe"), "x")
    with pytest.raises(FormatError, match=r"provenance backends\[0\].version = None"):
        Provenance.from_dict(dict(record, backends=[{"id": "a", "spec": "b"}]), "x")
    assert Provenance.from_dict(record, "x").to_dict() == record


# -- the pipeline ------------------------------------------------------------------------


def _specialized(src: Path, **kw: Any) -> bytes:
    import uuid

    dst = f"memory://prov-{uuid.uuid4().hex}/out.pte"
    ptestore.specialize(
        src, dst, backends=kw.pop("backends", ["passthrough"]), provenance=True, **kw
    )
    loader = open_loader(dst)
    try:
        return bytes(loader.load(0, loader.size()))
    finally:
        loader.close()


@pytest.mark.parametrize(
    "fx", [f for f in all_fixtures() if f.pte_path is not None], ids=lambda f: f.name
)
def test_every_fixture_gets_one_trailer_and_parses(fx: Any, tmp_path: Path) -> None:
    src = _path(fx)
    original = src.read_bytes()
    out = tmp_path / "out.pte"
    ptd = (fx.ptd_path, tmp_path / "out.ptd") if fx.ptd_path else None
    ptestore.specialize(src, out, ptd=ptd, backends=["passthrough"], device=DEVICE, provenance=True)
    data = out.read_bytes()
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    # The container before the trailer is what passthrough without provenance gives.
    plain = tmp_path / "plain.pte"
    ptestore.specialize(src, plain, backends=["passthrough"], provenance=False)
    assert data[: trailer.content_size] == plain.read_bytes()
    # ptestore parses it; the parsed sizes ignore the trailer.
    parsed = read_container(without_trailer(BytesLoader(data)))
    assert parsed.container.file_size == trailer.content_size
    # Re-specializing the artifact replaces the trailer (one trailer, not two) ...
    again = tmp_path / "again.pte"
    ptestore.specialize(out, again, backends=["passthrough"], device=DEVICE, provenance=True)
    redo = again.read_bytes()
    second = read_trailer(BytesLoader(redo))
    assert second is not None and second.content_size == trailer.content_size
    assert redo[: trailer.content_size] == data[: trailer.content_size]
    assert redo.count(b"PTSTPROV") == 1
    prov = read_provenance(BytesLoader(redo))
    assert prov is not None and prov.source.sha256 == tree(data)
    # ... and without provenance drops it.
    bare = tmp_path / "bare.pte"
    ptestore.specialize(out, bare, backends=["passthrough"], provenance=False)
    assert bare.read_bytes() == plain.read_bytes()
    assert src.read_bytes() == original  # the source itself is never modified


def test_record_contents_and_ptd_trailer(tmp_path: Path) -> None:
    assert EXT.ptd_path is not None
    out, out_ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    ptestore.specialize(
        _path(EXT),
        out,
        ptd=(EXT.ptd_path, out_ptd),
        backends=["support.fleet_backend:Scaler=3.1"],
        device=DEVICE,
        provenance=True,
    )
    prov = read_provenance(open_loader(out))
    assert prov is not None
    src = _path(EXT).read_bytes()
    assert prov.role == "pte"
    assert prov.source.sha256 == tree(src)
    assert prov.source.size == len(src) and prov.source.etag is None
    assert prov.ptd_source is not None
    assert prov.ptd_source.sha256 == tree(EXT.ptd_path.read_bytes())
    assert [(b.spec, b.version) for b in prov.requested] == [
        ("support.fleet_backend:Scaler=3.1", "3.1")
    ]
    assert [(b.id, b.version, b.compatibility) for b in prov.backends] == [
        ("XnnpackBackend", "3.1", "scaler;soc=sm8650;v=3.1")
    ]
    assert prov.device is not None and prov.device.name == "pixel9"
    assert prov.device.digest == DEVICE.digest()
    assert prov.ptestore_version == ptestore.__version__
    assert prov.created.endswith("Z")
    ptd_prov = read_provenance(open_loader(out_ptd))
    assert ptd_prov is not None and ptd_prov.role == "ptd" and ptd_prov.key() == prov.key()
    shown = provenance_json(open_loader(out))
    assert shown is not None and shown["trailer"]["offset"] + shown["trailer"]["size"] == (
        out.stat().st_size
    )
    assert shown["device"] == {
        "name": "pixel9",
        "digest": DEVICE.digest(),
        "options": dict(DEVICE.options),
    }
    # Bound to the bytes: the record names this file's content and the pair's .ptd.
    data, ptd_data = out.read_bytes(), out_ptd.read_bytes()
    end = shown["trailer"]["offset"]
    assert prov.content is not None and prov.content.size == end
    assert prov.content.sha256 == tree(data[:end])
    assert prov.content.crc32 == zlib.crc32(data[:end])
    ptd_trailer = read_trailer(open_loader(out_ptd))
    assert ptd_trailer is not None and ptd_prov.content is not None
    ptd_end = ptd_trailer.content_size
    assert ptd_prov.content.sha256 == tree(ptd_data[:ptd_end])
    assert prov.ptd_output == ptd_prov.content and ptd_prov.ptd_output is None
    assert prov.job is None
    assert provenance_json(BytesLoader(src)) is None


def test_provenance_json_reports_a_damaged_trailer() -> None:
    data = bytearray(_specialized(_path(MLP)))
    data[-100] ^= 1
    shown = provenance_json(BytesLoader(bytes(data), name="b.pte"))
    assert shown is not None and shown["error"].startswith("b.pte: provenance trailer checksum")


def test_header_less_pte_gets_its_trailer_after_the_program() -> None:
    src = _path(PORTABLE_EXT)
    original = src.read_bytes()
    data = _specialized(src)
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None and data[: trailer.content_size] == original
    assert replace_trailer(data, {"x": 1})[: trailer.content_size] == original
    assert read_trailer(BytesLoader(replace_trailer(data, {"x": 1}))).record() == {"x": 1}  # type: ignore[union-attr]


# -- devices, versions, compatibility ----------------------------------------------------


class Seen(BackendInterface):
    name = "XnnpackBackend"
    version = "7"

    def __init__(self) -> None:
        self.device: DeviceProfile | None = None

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        self.device = context.device


def test_device_reaches_backends_and_versions(tmp_path: Path) -> None:
    seen = Seen()
    ptestore.specialize(
        _path(MLP), tmp_path / "o.pte", backends=[seen], device=DEVICE, allow_unchanged=True
    )
    assert seen.device == DEVICE and seen.device.options == {"soc": "sm8650", "scale": 2.0}
    assert seen.version == "7"
    assert PassthroughBackend().version == ptestore.__version__
    assert distribution_version(Seen) == "unknown"  # a test module: no distribution
    assert distribution_version(int) == "unknown"
    p = PassthroughBackend()
    p.version = "9.9"
    assert p.version == "9.9" and PassthroughBackend().version == ptestore.__version__
    assert PassthroughBackend().compatibility_info(None) == ""  # type: ignore[arg-type]
    assert PassthroughBackend().check_compatibility("", None) is Compatibility.OPTIMAL
    assert Compatibility("prefer_respecialization") is Compatibility.PREFER_RESPECIALIZATION


def test_command_backend_gets_the_device_in_its_environment(tmp_path: Path) -> None:
    log = tmp_path / "env.jsonl"
    script = (
        "import json, os, sys; sys.stdin.buffer.read(); "
        f"open({str(log)!r}, 'a').write(json.dumps([os.environ['PTESTORE_DEVICE'], "
        "os.environ['PTESTORE_DEVICE_OPTIONS'], os.environ['PTESTORE_DEVICE_DIGEST']]) + '\\n')"
    )
    backend = CommandBackend([sys.executable, "-c", script])
    ptestore.specialize(
        _path(MLP), tmp_path / "o.pte", backends=[backend], device=DEVICE, allow_unchanged=True
    )
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines and all(
        x == ["pixel9", '{"scale":2.0,"soc":"sm8650"}', DEVICE.digest()] for x in lines
    )
    log.unlink()
    ptestore.specialize(_path(MLP), tmp_path / "p.pte", backends=[backend], allow_unchanged=True)
    assert all(json.loads(x) == ["", "{}", ""] for x in log.read_text().splitlines())


def test_device_profile_validation() -> None:
    assert DeviceProfile("a", {"x": 1}).digest() == DeviceProfile("b", {"x": 1}).digest()
    assert DeviceProfile("a", {"x": 1}).digest() != DeviceProfile("a", {"x": 2}).digest()
    assert hash(DeviceProfile("a", {"x": [1]})) == hash(DeviceProfile("a", {"x": [1]}))
    with pytest.raises(ConfigurationError, match="device name must be a non-empty string, got ''"):
        DeviceProfile("", {})
    with pytest.raises(ConfigurationError, match="device 'd': options must be a mapping, got list"):
        DeviceProfile("d", [])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="device 'd': options must be JSON values"):
        DeviceProfile("d", {"x": object()})
    assert parse_device_options(["soc=sm8650", "n=4", "f=[1]"]) == {
        "soc": "sm8650",
        "n": 4,
        "f": [1],
    }
    with pytest.raises(ConfigurationError, match="--device-option: expected KEY=VALUE, got 'soc'"):
        parse_device_options(["soc"])


class BadCompat(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        pass

    def compatibility_info(self, context: Any) -> str:
        return 42  # type: ignore[return-value]


class RaisingCompat(BadCompat):
    def compatibility_info(self, context: Any) -> str:
        raise RuntimeError("no SDK")


def test_compatibility_info_errors_name_the_backend(tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.specialize(_path(MLP), tmp_path / "o.pte", backends=[BadCompat()], provenance=True)
    assert str(err.value) == (
        "backend 'XnnpackBackend' (provenance.test_provenance:BadCompat): "
        "compatibility_info returned int, not str"
    )
    with pytest.raises(BackendError) as err:
        ptestore.specialize(
            _path(MLP), tmp_path / "o.pte", backends=[RaisingCompat()], provenance=True
        )
    assert str(err.value) == (
        "backend 'XnnpackBackend' (provenance.test_provenance:RaisingCompat): "
        "compatibility_info failed: RuntimeError: no SDK"
    )
    assert not (tmp_path / "o.pte").exists()


def test_cli_specialize_device_and_provenance(tmp_path: Path) -> None:
    from ptestore.cli import main

    out = tmp_path / "o.pte"
    code = main(
        [
            "specialize",
            str(_path(MLP)),
            str(out),
            "--backend",
            "passthrough",
            "--device",
            "pixel9",
            "--device-option",
            "soc=sm8650",
            "--device-option",
            "scale=2.0",
            "-q",
        ]
    )
    assert code == 0
    prov = read_provenance(open_loader(out))
    assert prov is not None and prov.device is not None and prov.device.digest == DEVICE.digest()
    assert main(["specialize", str(_path(MLP)), str(out), "--device-option", "a=1", "-q"]) == 2


def test_provenance_is_the_default_and_a_no_op_stays_one(tmp_path: Path) -> None:
    """``ptestore.specialize`` writes a trailer unless told not to; a pass-through onto
    its own source still changes nothing."""
    src = _path(MLP)
    out = tmp_path / "default.pte"
    ptestore.specialize(src, out, backends=["passthrough"], device=DEVICE)
    with open_loader(out) as loader:
        prov = read_provenance(loader)
    assert prov is not None and prov.device is not None and prov.device.name == "pixel9"
    bare = tmp_path / "bare.pte"
    ptestore.specialize(src, bare, backends=["passthrough"], provenance=False)
    assert bare.read_bytes() == src.read_bytes()
    same = tmp_path / "same.pte"
    same.write_bytes(src.read_bytes())
    report = ptestore.specialize(same, same, backends=["passthrough"], allow_unchanged=True)
    assert [f.status for f in report.files] == ["unchanged"]
    assert same.read_bytes() == src.read_bytes()  # no trailer added to an unchanged file
