"""Provenance records a hostile (or damaged, yet checksummed) trailer carries: every one
is a FormatError naming the file, the field, the value and the limit, never a raw
RecursionError, struct.error, ValueError or UnicodeEncodeError. Built from a real
specialized file whose trailer is rewritten (its checksum made right again)."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.errors import ConfigurationError, FormatError
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.trailer import FOOTER_SIZE, MAGIC, MAX_RECORD_DEPTH
from ptestore.storage.loaders import BytesLoader

MLP = get_fixture("mlp_xnnpack").pte_path
assert MLP is not None


@pytest.fixture(scope="module")
def specialized(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("hostile") / "out.pte"
    ptestore.specialize(
        str(MLP), str(out), backends=["passthrough"], device=DeviceProfile("dev", {"a": 1})
    )
    return out.read_bytes()


def record_of(data: bytes) -> dict[str, Any]:
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    return trailer.record()


def with_payload(data: bytes, payload: bytes) -> bytes:
    """``data``'s container with ``payload`` as its trailer's (checksum right)."""
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    content = data[: trailer.content_size]
    footer = struct.pack(
        "<QQ32sII8s",
        len(content),
        len(payload),
        hashlib.sha256(payload).digest(),
        2,
        FOOTER_SIZE,
        MAGIC,
    )
    return content + payload + footer


def with_record(data: bytes, record: dict[str, Any]) -> bytes:
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))  # ASCII: escapes kept
    return with_payload(data, text.encode())


def refused(data: bytes, name: str = "h.pte") -> str:
    with pytest.raises(FormatError) as err:
        read_trailer(BytesLoader(data, name))
    return str(err.value)


def cli_refuses(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``inspect`` says of the record: the container is shown, the provenance line
    says the trailer is unreadable (and ``verify`` refuses it, exit 2)."""
    path = tmp_path / "h.pte"
    path.write_bytes(data)
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "\nsegments" in out
    assert main(["verify", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    return out.partition("\nprovenance: unreadable: ")[2]


# -- nesting (defect 3) ------------------------------------------------------------------


def test_deeply_nested_payload_is_a_format_error(
    specialized: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = with_payload(specialized, b"[" * 200_000)
    assert refused(data) == (
        "h.pte: provenance trailer payload (nesting depth) = 200000: must be <= 64 levels "
        "of arrays and objects"
    )
    assert "nesting depth) = 200000" in cli_refuses(tmp_path, data, capsys)


def test_nesting_past_the_limit_in_device_options_is_refused(specialized: bytes) -> None:
    record = record_of(specialized)

    def nested(levels: int) -> bytes:
        # the record is level 1, device 2, options 3: the innermost list is ``levels``
        record["device"]["options"] = {"a": json.loads("[" * (levels - 3) + "]" * (levels - 3))}
        return with_record(specialized, record)

    assert read_provenance(BytesLoader(nested(MAX_RECORD_DEPTH))) is not None
    assert refused(nested(MAX_RECORD_DEPTH + 1)) == (
        "h.pte: provenance trailer payload (nesting depth) = 65: must be <= 64 levels of "
        "arrays and objects"
    )
    # strings are not brackets: a deep-looking string is fine
    record["device"]["options"] = {"a": "[" * 1000}
    assert read_provenance(BytesLoader(with_record(specialized, record))) is not None


def test_the_payload_is_decoded_once(specialized: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = json.loads

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counted)
    trailer = read_trailer(BytesLoader(specialized))
    assert trailer is not None
    first = trailer.record()
    first["created"] = "changed"  # a copy: the trailer's own is untouched
    assert trailer.record()["created"] != "changed"
    assert calls[0] == 1


def test_device_options_nested_too_deep_to_record_are_refused() -> None:
    DeviceProfile("d", {"a": json.loads("[" * 31 + "]" * 31)})  # 32 levels: fine
    with pytest.raises(ConfigurationError) as err:
        DeviceProfile("d", {"a": json.loads("[" * 32 + "]" * 32)})
    assert str(err.value) == (
        "device 'd': options nest more than 32 levels of lists and tables (provenance "
        "records them as JSON)"
    )
    deep: list[Any] = []
    for _ in range(5000):  # json.dumps would hit the recursion limit
        deep = [deep]
    with pytest.raises(ConfigurationError, match="options nest more than 32 levels"):
        DeviceProfile("d", {"a": deep})


# -- text that is not UTF-8 (defect 6) ---------------------------------------------------


@pytest.mark.parametrize("field", ["created", "ptestore_version"])
def test_a_lone_surrogate_in_a_record_string_is_refused(
    specialized: bytes, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of(specialized)
    record[field] = "x\ud800"
    data = with_record(specialized, record)
    message = (
        f"provenance {field} = 'x\\ud800': must be UTF-8 text (character '\\ud800' at "
        "index 1 is a lone surrogate)"
    )
    assert refused(data) == f"h.pte: {message}"
    assert message in cli_refuses(tmp_path, data, capsys)


def test_a_lone_surrogate_in_a_nested_key_is_refused(specialized: bytes) -> None:
    record = record_of(specialized)
    record["device"]["options"] = {"ok": [{"\udcff": 1}]}
    assert refused(with_record(specialized, record)) == (
        "h.pte: provenance device.options.ok[0] (a key) = '\\udcff': must be UTF-8 text "
        "(character '\\udcff' at index 0 is a lone surrogate)"
    )


# -- sizes (defect 4) --------------------------------------------------------------------


def _content_claiming(record: dict[str, Any], size: int) -> None:
    """``record``'s content claims ``size`` bytes with a chunk list of the right count
    (so only the size itself can be wrong)."""
    from ptestore.provenance.chunks import chunk_size_for

    content = record["content"]
    content["size"] = size
    chunk = chunk_size_for(size)
    count = max(0, -(-size // chunk))
    content["chunks"]["size"] = chunk
    content["chunks"]["sha256"] = base64.b64encode(bytes(32) * min(count, 1 << 14)).decode()
    content.pop("crcs", None)


@pytest.mark.parametrize("size", [-1, 1 << 64])
def test_a_content_size_no_file_can_have_is_refused(
    specialized: bytes, size: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of(specialized)
    _content_claiming(record, size)
    data = with_record(specialized, record)
    message = f"provenance content.size = {size}: must be an integer in [0, 2**64)"
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(data, "h.pte"))
    assert str(err.value) == f"h.pte: {message}"
    path = tmp_path / "h.pte"
    path.write_bytes(data)
    report = ptestore.verify(str(path))
    assert (report.status, report.error) == ("invalid", f"{path}: {message}")
    capsys.readouterr()
    assert main(["verify", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("where", ["source", "ptd_output"])
def test_other_recorded_sizes_are_checked_too(specialized: bytes, where: str) -> None:
    record = record_of(specialized)
    if where == "ptd_output":
        record["ptd_output"] = dict(record["content"], chunks=None, crcs=None)
    record[where]["size"] = -5
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(with_record(specialized, record), "h.pte"))
    assert str(err.value) == (
        f"h.pte: provenance {where}.size = -5: must be an integer in [0, 2**64)"
    )


# -- digests (defect 5) ------------------------------------------------------------------

DIGEST_RULE = "must be 'sha256:' or 'sha256-tree:' followed by 64 lowercase hex digits"


@pytest.mark.parametrize(
    "bad", ["md5:0123", "", "SHA256:" + "a" * 64, "sha256:" + "A" * 64, "sha256:" + "a" * 63]
)
def test_a_content_digest_no_check_can_compute_is_refused(
    specialized: bytes, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of(specialized)
    record["content"]["sha256"] = bad
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))
    message = f"provenance content.sha256 = {bad!r}: {DIGEST_RULE}"
    report = ptestore.verify(str(path))
    assert (report.status, report.error) == ("invalid", f"{path}: {message}")
    capsys.readouterr()
    assert main(["verify", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("where", ["source", "ptd_source", "ptd_output"])
def test_other_recorded_digests_are_checked_too(specialized: bytes, where: str) -> None:
    record = record_of(specialized)
    if where == "ptd_source":
        record["ptd_source"] = dict(record["source"])
    if where == "ptd_output":
        record["ptd_output"] = dict(record["content"], chunks=None, crcs=None)
    record[where]["sha256"] = "sha1:" + "0" * 40
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(with_record(specialized, record), "h.pte"))
    assert str(err.value) == f"h.pte: provenance {where}.sha256 = 'sha1:{'0' * 40}': {DIGEST_RULE}"


def test_recorded_digests_of_every_version_are_accepted() -> None:
    data_dir = Path(__file__).parent / "data"
    for path in sorted(data_dir.iterdir()):
        assert read_provenance(BytesLoader(path.read_bytes(), path.name)) is not None


# -- a record claiming other bytes than its trailer (defect 7) -------------------------


@pytest.mark.parametrize("extra", [10, 1 << 40])
def test_a_record_claiming_more_bytes_than_precede_its_trailer_is_refused(
    specialized: bytes, extra: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore.provenance.check import check_bytes
    from ptestore.provenance.chunks import ChunkDigests, chunk_size_for

    real = len(specialized) - read_trailer(BytesLoader(specialized)).size  # type: ignore[union-attr]
    claimed = real + extra
    chunk = chunk_size_for(claimed)
    chunks = ChunkDigests(chunk, claimed, (hashlib.sha256(b"x").digest(),) * -(-claimed // chunk))
    record = record_of(specialized)
    record["content"].update(size=claimed, sha256=chunks.digest, chunks=chunks.to_dict())
    record["content"].pop("crcs", None)  # self-consistent: only the size lies
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))
    message = (
        f"provenance content.size = {claimed}: must be {real}, the bytes before the "
        "provenance trailer (its footer's content_size)"
    )
    for quick in (True, False):
        report = ptestore.verify(str(path), quick=quick)
        assert (report.status, report.error) == ("invalid", f"{path}: {message}")
    with pytest.raises(FormatError) as err:
        check_bytes(BytesLoader(path.read_bytes(), "h.pte"), (0, 100))
    assert str(err.value) == f"h.pte: {message}"
    capsys.readouterr()
    for argv in (["--quick"], ["--range", "0:100"]):
        assert main(["verify", *argv, str(path)]) == 2
        assert message in capsys.readouterr().err


# -- the job file's and the device's digests, CRC-32s --------------------------------

WHOLE_RULE = "must be 'sha256:' followed by 64 lowercase hex digits"


@pytest.mark.parametrize(
    "bad", ["sha256-tree:" + "a" * 64, "md5:0123", "", "sha256:" + "A" * 64, "sha256:" + "a" * 65]
)
@pytest.mark.parametrize("where", ["job.sha256", "device.digest"])
def test_a_job_or_device_digest_of_another_form_is_refused(
    specialized: bytes, where: str, bad: str
) -> None:
    record = record_of(specialized)
    record["job"] = {"path": "fleet/job.toml", "sha256": "sha256:" + "0" * 64}
    assert read_provenance(BytesLoader(with_record(specialized, record))) is not None
    table, key = where.split(".")
    record[table][key] = bad
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(with_record(specialized, record), "h.pte"))
    assert str(err.value) == f"h.pte: provenance {where} = {bad!r}: {WHOLE_RULE}"


@pytest.mark.parametrize("value", [-1, 1 << 32, 1 << 70])
@pytest.mark.parametrize("where", ["content", "ptd_output"])
def test_a_crc32_no_file_can_have_is_refused(
    specialized: bytes, where: str, value: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of(specialized)
    if where == "ptd_output":
        record["ptd_output"] = dict(record["content"], crcs=None)
    for fine in (0, (1 << 32) - 1):
        record[where]["crc32"] = fine
        assert read_provenance(BytesLoader(with_record(specialized, record))) is not None
    record[where]["crc32"] = value
    data = with_record(specialized, record)
    message = f"provenance {where}.crc32 = {value}: must be an integer in [0, 2**32)"
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(data, "h.pte"))
    assert str(err.value) == f"h.pte: {message}"
    path = tmp_path / "h.pte"
    path.write_bytes(data)
    report = ptestore.verify(str(path), quick=True)
    assert (report.status, report.error) == ("invalid", f"{path}: {message}")
    capsys.readouterr()
    assert main(["verify", "--quick", str(path)]) == 2
    assert message in capsys.readouterr().err


# -- values too large to show whole --------------------------------------------------------
# A record field holding 1 MB made a 1 MB error message: verify printed a 1,000,149-char
# line and inspect a 1 MB report. Messages show a value's first 80 characters and its size.


def test_a_huge_value_is_shown_cut_in_messages(
    specialized: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_of(specialized)
    record["format"] = "x" * 1_000_000
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))
    message = (
        f"{path}: provenance format = '{'x' * 80}'... (1000000 characters): must be "
        "'ptestore.provenance'"
    )
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(path.read_bytes(), str(path)))
    assert str(err.value) == message
    assert main(["verify", str(path)]) == 2
    assert capsys.readouterr().err == f"{path}: invalid: {message}\n"
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert message in out and len(out) < 4000
    assert main(["verify", "--json", str(path)]) == 2
    assert len(capsys.readouterr().out) < 4000


def test_a_huge_object_is_shown_cut_in_messages(specialized: bytes) -> None:
    record = record_of(specialized)
    record["source"] = ["z" * 10] * 50_000
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(with_record(specialized, record), "h.pte"))
    shown = repr(["z" * 10] * 50_000)
    assert str(err.value) == (
        f"h.pte: provenance source = {shown[:80]}... ({len(shown)} characters): must be an object"
    )


def test_record_strings_are_escaped_in_verify_findings(
    specialized: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A finding quotes the record: a spec holding a newline and escape sequences forged
    # a second verdict line and drove the terminal.
    record = record_of(specialized)
    record["requested"][0]["spec"] = "x\x1b[2J\nh.pte: current"
    record["backends"][0]["spec"] = "y\x1b[2J\nsource: forged"
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))
    assert main(["verify", str(path), "--backend", "passthrough"]) == 1
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err
    assert f"{path}: stale: backends.spec: made with [x\\x1b[2J\\nh.pte: current], expected " in (
        out + err
    )
    assert "\nh.pte: current" not in out + err
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nsource: forged" not in out
    assert "  backend XnnpackBackend: y\\x1b[2J\\nsource: forged 0.1.0\n" in out


# A record string well formed but huge (1 MB) was printed whole by verify's findings and
# inspect's provenance lines (a 1,000,067-character line): cut to 300 characters and its
# length there; --json keeps it whole.
BIG = "x" * 1_000_000
CUT = f"{'x' * 300}... (1000000 characters)"
QUOTED_CUT = f"'{'x' * 300}'... (1000000 characters)"


def _set(record: dict[str, Any], where: str, value: str) -> None:
    *path, last = where.split(".")
    target: Any = record
    for part in path:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value


@pytest.mark.parametrize(
    ("where", "argv", "finding", "provenance_line"),
    [
        (
            "requested.0.spec",
            ["--backend", "passthrough"],
            f"backends.spec: made with [{CUT}], expected [passthrough]",
            None,
        ),
        (
            "device.name",
            ["--device", "dev"],
            f"device.name: made for {QUOTED_CUT}, expected 'dev'",
            f"  device: {CUT} (sha256:",
        ),
        (
            "source.url",
            ["--source", str(get_fixture("conv_portable").pte_path)],
            f"source.sha256: the artifact was made from {CUT} (6048 bytes, sha256-tree:",
            f"  source: {CUT} (sha256-tree:",
        ),
        (
            "backends.0.compatibility",
            None,
            None,
            f"  backend XnnpackBackend: passthrough 0.1.0, compatibility {QUOTED_CUT}\n",
        ),
    ],
)
def test_a_huge_record_string_is_cut_in_findings_and_reports(
    specialized: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
    argv: list[str] | None,
    finding: str | None,
    provenance_line: str | None,
) -> None:
    record = record_of(specialized)
    _set(record, where, BIG)
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))
    capsys.readouterr()
    if argv is not None:
        assert main(["verify", str(path), *argv]) == 1
        out, err = capsys.readouterr()
        assert f"{path}: stale: {finding}" in err and len(out + err) < 4000
        assert main(["verify", str(path), *argv, "--json"]) == 1
        findings = json.loads(capsys.readouterr().out)["findings"]
        assert [f for f in findings if BIG in f["message"]]  # whole
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert len(out) < 6000
    if provenance_line is not None:
        assert provenance_line in out
    assert main(["inspect", str(path), "--json"]) == 0
    assert BIG in capsys.readouterr().out  # whole


def test_a_record_version_true_is_refused(specialized: bytes) -> None:
    """``True == 1`` in Python: a record whose version was ``true`` was read as
    version 1."""
    record = record_of(specialized)
    record["version"] = True
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(with_record(specialized, record), "h.pte"))
    assert str(err.value) == (
        "h.pte: provenance version = True: must be 1, 2 or 3 (this ptestore's)"
    )


# -- control characters in a verify verdict ------------------------------------------------


def test_a_record_key_with_control_characters_is_escaped_in_verify(
    specialized: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An "invalid" verdict quotes the record (a key in the field name): its control
    characters are escaped as a stale finding's are (they were printed as they were,
    driving the terminal), alone and with ``--job``."""
    key = "\x1b[2J\x1b[31mOWNED\r"
    record = record_of(specialized)
    record[key] = "\ud800"  # a lone surrogate: refused, the field naming the key
    path = tmp_path / "h.pte"
    path.write_bytes(with_record(specialized, record))  # json.dumps: ASCII, escapes kept
    said = (
        f"{path}: invalid: {path}: provenance \\x1b[2J\\x1b[31mOWNED\\r = '\\\\ud800': must "
        "be UTF-8 text (character '\\\\ud800' at index 0 is a lone surrogate)"
    )
    report = ptestore.verify(path)
    assert report.status == "invalid" and key in str(report.error)
    assert report.message() == said
    capsys.readouterr()
    assert main(["verify", str(path)]) == 2
    assert capsys.readouterr().err == said + "\n"
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/{{device}}/{{model}}.pte"\nbackends = ["passthrough"]\n'
        f'[[models]]\nname = "m"\nsource = "{MLP}"\n[devices.d]\na = 1\n'
    )
    (tmp_path / "d").mkdir()
    path.rename(tmp_path / "d" / "m.pte")
    assert main(["verify", "--job", str(job)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert "provenance \\x1b[2J\\x1b[31mOWNED\\r = " in err


# -- non-finite numbers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("literal", "field"),
    [
        ("NaN", "device.options.a"),
        ("-Infinity", "device.options.a"),
        ("[1e999]", "device.options.a[0]"),
    ],
)
def test_a_non_finite_number_in_a_record_is_refused(
    specialized: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    literal: str,
    field: str,
) -> None:
    """JSON has no NaN or Infinity (Python's json reads them, and 1e999 as inf): a record
    holding one is refused naming the field (``inspect --json`` ended in a traceback
    writing it back, ``verify --json`` printed ``NaN``, which is not JSON)."""
    text = json.dumps(record_of(specialized), sort_keys=True)
    assert '"a": 1' in text
    data = with_payload(specialized, text.replace('"a": 1', f'"a": {literal}').encode())
    value = literal.strip("[]")
    said = (
        f"h.pte: provenance {field} = {value!r}: must be a finite number (JSON has no NaN "
        "or Infinity, and a provenance record is JSON)"
    )
    assert refused(data) == said
    path = tmp_path / "h.pte"
    path.write_bytes(data)
    capsys.readouterr()
    assert main(["verify", str(path), "--json"]) == 2
    out = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)  # strict JSON
    assert (out["status"], out["error"]) == ("invalid", said.replace("h.pte", str(path), 1))
    assert main(["inspect", str(path), "--json"]) == 0  # the container, the record's error
    shown = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    assert shown["provenance"] == {"error": said.replace("h.pte", str(path), 1)}
