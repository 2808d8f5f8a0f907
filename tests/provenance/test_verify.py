"""``ptestore.verify`` and ``ptestore verify``: current, stale (naming the field),
invalid (bad input or a corrupt artifact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore import verify
from ptestore.backends.compat import Compatibility, DeviceProfile
from ptestore.cli import main
from ptestore.errors import ConfigurationError, ObjectNotFound

MLP = get_fixture("mlp_xnnpack")
CONV = get_fixture("conv_xnnpack")
DEVICE = DeviceProfile("pixel9", {"soc": "sm8650", "scale": 2.0})
SPEC = "support.fleet_backend:Scaler=1.0"


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    assert MLP.pte_path is not None
    out = tmp_path / "pixel9" / "mlp.pte"
    out.parent.mkdir()
    ptestore.specialize(MLP.pte_path, out, backends=[SPEC], device=DEVICE, provenance=True)
    return out


def test_current(artifact: Path) -> None:
    report = verify(artifact, source=MLP.pte_path, backends=[SPEC], device=DEVICE)
    assert report.status == "current" and report.exit_code == 0 and report.ok
    assert report.findings == []
    assert report.compatibility == {"XnnpackBackend": Compatibility.OPTIMAL}
    assert report.message() == f"{artifact}: current"
    assert verify(artifact).exit_code == 0  # integrity only


def test_wrong_source(artifact: Path) -> None:
    report = verify(artifact, source=CONV.pte_path)
    assert report.exit_code == 1 and report.status == "stale"
    assert [f.field for f in report.findings] == ["source.sha256"]
    assert f"not from {CONV.pte_path} ({CONV.pte_path.stat().st_size} bytes, sha256-tree:" in (  # type: ignore[union-attr]
        report.findings[0].message
    )


def test_backend_upgrade_is_stale(artifact: Path) -> None:
    report = verify(artifact, backends=["support.fleet_backend:Scaler=1.1"], device=DEVICE)
    assert report.exit_code == 1
    assert [f.field for f in report.findings] == ["backends.spec"]
    # The same spec at a new installed version: the version and the rating both say so.
    from support.fleet_backend import Scaler

    upgraded = Scaler("2.0")
    report = verify(artifact, backends=[upgraded], device=DEVICE)
    assert [f.field for f in report.findings] == ["backends.spec"]  # spec text differs too
    record = report.provenance
    assert record is not None and record.requested[0].version == "1.0"


def test_installed_version_change_names_version_and_compatibility(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support import fleet_backend

    original = fleet_backend.Scaler.__init__

    def newer(self: fleet_backend.Scaler, version: str = "1.0") -> None:
        original(self, "1.1" if version == "1.0" else version)

    monkeypatch.setattr(fleet_backend.Scaler, "__init__", newer)
    report = verify(artifact, backends=[SPEC], device=DEVICE)
    assert report.exit_code == 1
    assert [f.field for f in report.findings] == ["backends.version", "backends.compatibility"]
    assert report.findings[0].message == (
        f"{SPEC} made it at version 1.0; the installed version is 1.1"
    )
    assert report.compatibility == {"XnnpackBackend": Compatibility.PREFER_RESPECIALIZATION}
    assert "rates the XnnpackBackend data prefer_respecialization for 'pixel9'" in (
        report.findings[1].message
    )


def test_other_soc_is_unsupported(artifact: Path) -> None:
    other = DeviceProfile("pixel9", {"soc": "tensor-g4", "scale": 2.0})
    report = verify(artifact, backends=[SPEC], device=other)
    assert report.compatibility == {"XnnpackBackend": Compatibility.UNSUPPORTED}
    assert [f.field for f in report.findings] == ["backends.compatibility", "device.digest"]
    assert "(options changed: soc 'sm8650' -> 'tensor-g4')" in report.findings[1].message


def test_device_name(artifact: Path) -> None:
    report = verify(artifact, device="galaxy")
    assert [f.field for f in report.findings] == ["device.name"]
    assert report.findings[0].message == "made for 'pixel9', expected 'galaxy'"
    assert verify(artifact, device="pixel9").exit_code == 0


def test_invalid_inputs(artifact: Path, tmp_path: Path) -> None:
    # A missing file and bad arguments are errors, not a verdict on an artifact.
    with pytest.raises(ObjectNotFound) as missing:
        verify(tmp_path / "nope.pte")
    assert str(missing.value) == f"{tmp_path / 'nope.pte'}: no such file"
    with pytest.raises(ObjectNotFound) as missing:
        verify(artifact, source=tmp_path / "no-source.pte")
    assert str(missing.value) == f"{tmp_path / 'no-source.pte'}: no such file"
    assert MLP.pte_path is not None
    plain = verify(MLP.pte_path)
    assert plain.exit_code == 2
    assert plain.error is not None and "provenance trailer = None: must be present" in plain.error
    damaged = tmp_path / "damaged.pte"
    data = bytearray(artifact.read_bytes())
    data[-80] ^= 1
    damaged.write_bytes(bytes(data))
    report = verify(damaged)
    assert report.exit_code == 2 and "provenance trailer checksum" in str(report.error)
    broken = tmp_path / "broken.pte"
    data = bytearray(artifact.read_bytes())
    data[4:8] = b"XXXX"  # the container itself
    broken.write_bytes(bytes(data))
    report = verify(broken)
    assert report.exit_code == 2 and "file identifier" in str(report.error)
    with pytest.raises(ConfigurationError):
        verify(artifact, backends=["no_such_backend"])


def test_bad_input_is_an_error_not_a_verdict(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file, a malformed ``--range`` and ``--device-option`` with ``--job``
    printed a report, ``"status": "invalid"``, as if an artifact had been judged: they
    are errors, as every command's (the ``{"error": ...}`` object, exit 2); "invalid"
    is left for a file that is there and fails its checks."""
    missing = tmp_path / "nope.pte"
    job = tmp_path / "job.toml"
    job.write_text(f'destination = "{tmp_path}/{{device}}.pte"\n[devices.d]\n')
    cases = [
        (["verify", str(missing)], "ObjectNotFound", f"{missing}: no such file"),
        (
            ["verify", str(artifact), "--range", "x"],
            "ConfigurationError",
            "byte range 'x': expected START:END (bytes, END exclusive), e.g. 0:4194304",
        ),
        (
            ["verify", str(artifact), "--job", str(job), "--device-option", "k=v"],
            "ConfigurationError",
            "--device-option cannot be given with --job (the job file has the options)",
        ),
        (
            ["verify", str(artifact), "--source", str(missing)],
            "ObjectNotFound",
            f"{missing}: no such file",
        ),
    ]
    for argv, kind, message in cases:
        assert main([*argv, "--json"]) == 2, argv
        out, err = capsys.readouterr()
        error = json.loads(out)["error"]
        assert (error["type"], error["message"], error["exit_code"]) == (kind, message, 2)
        assert err.splitlines()[0] == f"ptestore verify: error: {message}"
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines()[0] == f"ptestore verify: error: {message}"


def test_cli_exit_codes_and_json(
    artifact: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert MLP.pte_path is not None and CONV.pte_path is not None
    assert main(["verify", str(artifact), "--source", str(MLP.pte_path)]) == 0
    assert capsys.readouterr().out.strip() == f"{artifact}: current"
    assert main(["verify", str(artifact), "--source", str(CONV.pte_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{artifact}: stale: source.sha256: the artifact was made from")
    assert main(["verify", str(tmp_path / "none.pte"), "--json"]) == 2
    shown = json.loads(capsys.readouterr().out)  # an error, as every command's
    assert (shown["error"]["type"], shown["error"]["exit_code"]) == ("ObjectNotFound", 2)
    # Without a device profile (only --job gives its options) this backend cannot
    # confirm the SoC, and says so.
    assert main(["verify", str(artifact), "--backend", SPEC, "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["compatibility"] == {"XnnpackBackend": "unsupported"}
    assert [f["field"] for f in shown["findings"]] == ["backends.compatibility"]
    assert shown["provenance"]["device"]["name"] == "pixel9"


def test_cli_with_a_job(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert MLP.pte_path is not None and CONV.pte_path is not None
    job = tmp_path / "job.toml"
    dest = str(tmp_path / "{device}" / "{model}.pte")
    text = (
        f'destination = "{dest}"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        '[devices.pixel9]\nsoc = "sm8650"\nscale = 2.0\n'
    )
    job.write_text(text)
    assert main(["verify", str(artifact), "--job", str(job)]) == 0
    assert main(["verify", str(artifact), "--job", str(job), "--device", "pixel9"]) == 0
    job.write_text(text.replace("scale = 2.0", "scale = 3.0"))
    assert main(["verify", str(artifact), "--job", str(job)]) == 1
    assert "stale: device.digest" in capsys.readouterr().err
    assert main(["verify", str(artifact), "--job", str(job), "--device", "nope"]) == 2
    assert "no device 'nope' (devices: pixel9)" in capsys.readouterr().err


def test_cli_with_a_job_matches_any_spelling_of_the_destination(
    artifact: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pixel9/mlp.pte``, ``/abs//pixel9/mlp.pte`` and ``file:///abs/pixel9/mlp.pte`` are
    one file: each gets the job's source and device checks, not just the job's spelling."""
    assert MLP.pte_path is not None and CONV.pte_path is not None
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.toml"
    text = (
        f'destination = "{tmp_path}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        '[devices.pixel9]\nsoc = "sm8650"\nscale = 3.0\n'
    )
    job.write_text(text)
    spellings = [
        "pixel9/mlp.pte",
        f"{tmp_path}//pixel9//mlp.pte",
        f"{tmp_path}/pixel9/./mlp.pte",
        f"file://{tmp_path}/pixel9/mlp.pte",
    ]
    for url in spellings:
        assert main(["verify", url, "--job", str(job)]) == 1, url
        assert "stale: device.digest" in capsys.readouterr().err
    job.write_text(
        text.replace("scale = 3.0", "scale = 2.0").replace(str(MLP.pte_path), str(CONV.pte_path))
    )
    for url in spellings:
        assert main(["verify", url, "--job", str(job)]) == 1, url
        assert "stale: source" in capsys.readouterr().err


def _tamper_digit(artifact: Path, *, fix_checksum: bool) -> None:
    """Change one hex digit of the recorded source digest; the JSON stays valid."""
    import hashlib

    from ptestore.provenance.trailer import _FOOTER, FOOTER_SIZE

    data = bytearray(artifact.read_bytes())
    footer = _FOOTER.unpack(bytes(data[-FOOTER_SIZE:]))
    content_size, payload_size = footer[0], footer[1]
    payload = bytes(data[content_size : content_size + payload_size])
    record = json.loads(payload)
    digest = record["source"]["sha256"]
    at = payload.index(digest.encode()) + len(digest) - 1
    data[content_size + at] = ord("0") if payload[at] != ord("0") else ord("1")
    json.loads(bytes(data[content_size : content_size + payload_size]))  # still valid JSON
    if fix_checksum:
        new_payload = bytes(data[content_size : content_size + payload_size])
        fields = list(footer)
        fields[2] = hashlib.sha256(new_payload).digest()
        data[-FOOTER_SIZE:] = _FOOTER.pack(*fields)
    artifact.write_bytes(bytes(data))


def test_a_tampered_record_that_stays_valid_json_fails_the_integrity_check(
    artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MLP.pte_path is not None
    _tamper_digit(artifact, fix_checksum=False)
    assert main(["verify", str(artifact), "--source", str(MLP.pte_path)]) == 2
    err = capsys.readouterr().err
    assert "provenance trailer checksum" in err and "the trailer was damaged" in err


def test_a_consistently_rewritten_digest_is_stale_against_the_source(
    artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checksum recomputed too: the record no longer matches the real source."""
    assert MLP.pte_path is not None
    _tamper_digit(artifact, fix_checksum=True)
    assert main(["verify", str(artifact), "--source", str(MLP.pte_path)]) == 1
    assert "stale: source" in capsys.readouterr().err


def test_cli_with_a_job_compares_the_ptd_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model's .ptd source is part of what its pairs were made from: once it changes,
    ``verify --job`` and ``verify URL --job`` say stale (``ptd_source.sha256``), as
    ``fleet plan`` does."""
    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    (tmp_path / "m.pte").write_bytes(ext.pte_path.read_bytes())
    ptd = tmp_path / "m.ptd"
    ptd.write_bytes(ext.ptd_path.read_bytes())
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{tmp_path}/m.pte"\nptd = "{ptd}"\n[devices.a]\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()
    made = "sha256-tree:" + tree_hex(ptd.read_bytes())
    data = bytearray(ptd.read_bytes())
    data[-1] ^= 0xFF  # a new export of the weights
    ptd.write_bytes(bytes(data))
    now = "sha256-tree:" + tree_hex(bytes(data))
    finding = (
        f"{tmp_path}/out/a/m.pte: stale: ptd_source.sha256: the artifact was made from "
        f"{ptd} ({len(data)} bytes, {made}), not from {ptd} ({len(data)} bytes, {now})"
    )
    assert main(["verify", "--job", str(job)]) == 1
    assert capsys.readouterr().err == finding + "\n"
    assert main(["verify", f"{tmp_path}/out/a/m.pte", "--job", str(job)]) == 1
    assert capsys.readouterr().err == finding + "\n"


def tree_hex(data: bytes) -> str:
    from support.digests import tree

    return tree(data).partition(":")[2]


def test_cli_with_a_job_reports_a_storage_failure_per_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pair's storage failing (here: its artifact replaced while verified, as
    ``verify`` raises it) is that pair's line, exit 1; the other pairs are still checked
    and reported (the first such error ended the whole command, no pair reported)."""
    assert MLP.pte_path is not None
    (tmp_path / "m.pte").write_bytes(MLP.pte_path.read_bytes())
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{tmp_path}/m.pte"\n[devices.a]\n[devices.b]\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    import ptestore.verification as verification

    real = verification.verify
    failing = f"{tmp_path}/out/b/m.pte"
    error = f"{failing}: changed while being verified (verify it again): replaced"

    def verify_b_changes(url: str, **kwargs: object) -> verification.VerifyReport:
        if str(url) == failing:
            raise ptestore.StorageError(error)
        return real(url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verification, "verify", verify_b_changes)
    capsys.readouterr()
    assert main(["verify", "--job", str(job)]) == 1
    out, err = capsys.readouterr()
    assert err == f"{failing}: not verified: {error}\n"
    assert out == (
        f"{tmp_path}/out/a/m.pte: current\n2 pairs: 1 current, 0 stale, 0 invalid, 1 not verified\n"
    )
    assert main(["verify", "--job", str(job), "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == f"{failing}: not verified: {error}\n"  # as without --json
    shown = json.loads(out)
    assert [(p["status"], p["exit_code"], p["error"]) for p in shown["pairs"]] == [
        ("current", 0, None),
        ("unverified", 1, error),
    ]


def test_a_shared_ptd_is_at_most_intact_whatever_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fleet's content-addressed .ptd has no record: given a source, backends or a
    device, nothing can be compared with it, so it is intact, never current (it said
    "current", exit 0, having compared nothing)."""
    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.ptd_path is not None
    data = ext.ptd_path.read_bytes()
    shared = tmp_path / "_shared" / "sha256-tree" / f"{tree_hex(data)}.ptd"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(data)
    report = verify(shared, source=ext.ptd_path, backends=[SPEC], device=DEVICE)
    assert report.status == "intact" and report.exit_code == 0 and report.shared
    assert report.findings == [] and report.content_checked
    said = (
        f"{shared}: intact; a shared content-addressed .ptd has no record of its own: "
        "nothing given could be compared with it (verify the .pte files that use it)"
    )
    assert report.message() == said
    assert verify(shared).message() == said  # nothing given: the same answer
    args = ["verify", str(shared), "--source", str(ext.ptd_path), "--device", "pixel9"]
    assert main(args) == 0
    assert capsys.readouterr().out == said + "\n"
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["exit_code"], out["shared"]) == ("intact", 0, True)
    # --range: the digests of a range are a record's, which a shared .ptd has none of
    # by design; it said "no provenance record ... (made without provenance, or by an
    # older ptestore)", which is not why.
    assert main(["verify", str(shared), "--range", "0:100"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"ptestore verify: error: {shared}: --range checks bytes against the chunk digests "
        "of a provenance record, and a shared content-addressed .ptd carries none by "
        "design (a fleet stores it once, named by the digest of its bytes, without a "
        "trailer): verify it without --range (all its bytes against its content "
        "address), or verify the .pte files that use it\n"
    )


def test_json_says_the_reason_of_a_failed_verdict_on_stderr_too(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify --json`` printed a failed verdict's report on stdout and nothing on
    stderr, unlike the text output and every other command's ``--json`` (whose one-line
    message stays on stderr): its lines are on stderr now, as without ``--json``."""
    damaged = tmp_path / "damaged.pte"
    data = bytearray(artifact.read_bytes())
    data[4:8] = b"XXXX"  # the container's file identifier
    damaged.write_bytes(bytes(data))
    assert main(["verify", str(damaged), "--json"]) == 2
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert shown["status"] == "invalid" and "file identifier" in shown["error"]
    assert err == f"{damaged}: invalid: {shown['error']}\n"
    assert main(["verify", str(damaged)]) == 2
    assert capsys.readouterr() == ("", err)  # the same line as the text output's
    # stale: one line per finding, as the text output
    assert CONV.pte_path is not None
    args = ["verify", str(artifact), "--source", str(CONV.pte_path)]
    assert main(args) == 1
    text_err = capsys.readouterr().err
    assert text_err.startswith(f"{artifact}: stale: source.sha256: the artifact was made from")
    assert main([*args, "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "stale" and err == text_err
    # intact or current: nothing on stderr
    assert main(["verify", str(artifact), "--json"]) == 0
    assert capsys.readouterr().err == ""
