"""Artifacts bound to their bytes: the provenance names the SHA-256 of the container it
follows and of the pair's .ptd; ``verify`` catches a flipped byte anywhere (segment,
FlatBuffer, .ptd), says ``intact`` when there is nothing to compare with, and calls a
.pte whose .ptd belongs to another pair stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore import verify
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.format.reader import read_container
from ptestore.provenance import read_trailer
from ptestore.provenance.trailer import ContentView
from ptestore.storage.loaders import open_loader

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
A = DeviceProfile("a", {"soc": "x", "scale": 2.0})
B = DeviceProfile("b", {"soc": "x", "scale": 3.0})


def _make(tmp: Path, device: DeviceProfile) -> tuple[Path, Path]:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte, ptd = tmp / device.name / "m.pte", tmp / device.name / "m.ptd"
    pte.parent.mkdir(parents=True, exist_ok=True)
    ptestore.specialize(
        EXT.pte_path, pte, ptd=(EXT.ptd_path, ptd), backends=[SPEC], device=device, provenance=True
    )
    return pte, ptd


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return _make(tmp_path, A)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _segment_offset(path: Path) -> int:
    loader = open_loader(path)
    trailer = read_trailer(loader)
    assert trailer is not None
    c = read_container(ContentView(loader, trailer.content_size)).container
    seg = next(s for s in c.segments if s.size > 0)
    return c.absolute(seg) + seg.size // 2


def test_intact_current_and_quick(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pte, ptd = pair
    report = verify(pte)
    assert report.status == "intact" and report.exit_code == 0 and report.content_checked
    assert report.ptd == str(ptd)
    assert report.message() == (
        f"{pte}: intact; nothing to compare with (give --source, --backend, --device or "
        "--job to tell current from stale)"
    )
    assert verify(pte, device=A, backends=[SPEC]).status == "current"
    quick = verify(pte, quick=True)
    assert quick.status == "intact" and not quick.content_checked
    assert main(["verify", str(pte), "--quick"]) == 0
    assert capsys.readouterr().out.startswith(
        f"{pte}: intact (--quick: content SHA-256 not checked);"
    )


@pytest.mark.parametrize("where", ["segment", "flatbuffer", "ptd"])
def test_a_flipped_byte_is_caught(
    pair: tuple[Path, Path], where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pte, ptd = pair
    if where == "segment":
        _flip(pte, _segment_offset(pte))
    elif where == "flatbuffer":
        _flip(pte, 40)  # inside the FlatBuffer program, after the root table offset
    else:
        _flip(ptd, _segment_offset(ptd))
    report = verify(pte)
    assert report.status == "invalid" and report.exit_code == 2
    damaged = ptd if where == "ptd" else pte
    assert report.error is not None
    if where != "flatbuffer" or "content.sha256" in report.error:
        assert report.error.startswith(f"{damaged}: content.sha256 = 'sha256-tree:")
        assert "the artifact was damaged or changed after it was made" in report.error
    assert main(["verify", str(pte), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["status"] == "invalid"
    if where == "segment":
        # --quick reads only the structure and the trailer, and says what it skipped.
        assert verify(pte, quick=True).exit_code == 0


def test_a_ptd_without_a_trailer_swapped_for_another_is_stale(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """At a path that is no content address, a .ptd without a trailer that is not the
    one the .pte names (another size, or the same size and other bytes) is another
    pair's: stale on ptd_output.sha256 (exit 1), not damage; --quick says it compared
    such a .ptd by size only."""
    pte, ptd = pair
    assert EXT.ptd_path is not None
    loader = open_loader(ptd)
    trailer = read_trailer(loader)
    loader.close()
    assert trailer is not None
    own = ptd.read_bytes()[: trailer.content_size]
    other = get_fixture("mlp_portable_ext").ptd_path
    assert other is not None and other.stat().st_size != len(own)
    shutil.copyfile(EXT.ptd_path, ptd)  # the source's: same size, other bytes
    assert EXT.ptd_path.stat().st_size == len(own)
    report = verify(pte)
    assert (report.status, report.exit_code) == ("stale", 1)
    assert [f.field for f in report.findings] == ["ptd_output.sha256"]
    assert report.findings[0].message.startswith(f"{ptd} holds sha256-tree:")
    assert report.findings[0].message.endswith(": it belongs to another pair or device")
    quick = verify(pte, quick=True)
    assert quick.status == "intact"
    assert f"; {ptd} has no trailer: compared by size only;" in quick.message()
    made = quick.provenance
    assert made is not None and made.ptd_output is not None
    shutil.copyfile(other, ptd)  # another model's: another size
    for q in (False, True):
        report = verify(pte, quick=q)
        assert (report.status, report.exit_code) == ("stale", 1)
        assert [f.message for f in report.findings] == [
            f"{ptd} holds {other.stat().st_size} bytes, not the {len(own)} of the .ptd this "
            f".pte was made with ({made.ptd_output.sha256}): it belongs to another pair or "
            "device"
        ]
    ptd.write_bytes(own)  # its own bytes, without the trailer (as fetch stores a shared one)
    assert verify(pte).message() == (
        f"{pte}: intact; nothing to compare with (give --source, --backend, --device or "
        "--job to tell current from stale)"
    )


def test_a_ptd_of_another_device_is_stale(pair: tuple[Path, Path], tmp_path: Path) -> None:
    pte, ptd = pair
    _, other_ptd = _make(tmp_path, B)
    shutil.copyfile(other_ptd, ptd)
    report = verify(pte)
    assert report.status == "stale" and report.exit_code == 1
    fields = [f.field for f in report.findings]
    assert fields == ["ptd_output.sha256", "ptd_output.key"]
    assert "belongs to another pair or device" in report.findings[0].message
    assert "device is b (" in report.findings[1].message
    ptd.unlink()
    missing = verify(pte)
    assert [f.message for f in missing.findings] == [
        f"the .pte was made with a .ptd, and there is none at {ptd}"
    ]


def test_device_options_and_names_on_the_cli(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pte, _ = pair
    base = ["verify", str(pte), "--backend", SPEC, "--device", "a"]
    # The named device reaches check_compatibility (its soc decides the rating).
    assert main([*base, "--device-option", "soc=x", "--device-option", "scale=2.0"]) == 0
    assert capsys.readouterr().out.strip() == f"{pte}: current"
    assert main([*base, "--device-option", "soc=x", "--device-option", "scale=5.0"]) == 1
    assert "(options changed: scale 2.0 -> 5.0)" in capsys.readouterr().err
    # The name only: the backends rate it with the options recorded for 'a' (the
    # artifact is correct, so it is current, not stale for want of repeating them).
    assert main([*base, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["findings"]) == ("current", [])
    assert shown["compatibility"] == {"XnnpackBackend": "optimal"}
    assert verify(pte, backends=[SPEC], device="a").status == "current"
    assert main(["verify", str(pte), "--device-option", "soc=x"]) == 2
    assert "--device-option needs --device NAME" in capsys.readouterr().err


def test_a_device_name_the_record_keeps_no_options_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Another name than the record's: the backends get a profile without options, and
    # the finding says which option to give, besides the name's own finding.
    pte, _ = _make(tmp_path, A)
    report = verify(pte, backends=[SPEC], device="zz")
    assert [f.field for f in report.findings] == ["backends.compatibility", "device.name"]
    assert report.findings[0].message == (
        "support.fleet_backend:Scaler=1.0 rates the XnnpackBackend data unsupported for "
        "'zz' (stamped 'scaler;soc=x;v=1.0'); no options were given: give the profile's "
        "options (--device-option K=V)"
    )
    assert report.findings[1].message == "made for 'a', expected 'zz'"


def test_no_provenance_and_the_pass_through_no_op(tmp_path: Path) -> None:
    assert EXT.pte_path is not None
    src = tmp_path / "m.pte"
    shutil.copyfile(EXT.pte_path, src)
    before = src.read_bytes()
    # In place, nothing replaced: still a no-op (no trailer added), provenance or not.
    report = ptestore.specialize(src, src, backends=["passthrough"], strict=False, provenance=True)
    assert [f.status for f in report.files] == ["unchanged"] and src.read_bytes() == before
    out = tmp_path / "bare.pte"
    assert (
        main(
            [
                "specialize",
                str(EXT.pte_path),
                str(out),
                "--backend",
                "passthrough",
                "--allow-unchanged",
                "--no-provenance",
            ]
        )
        == 0
    )
    assert out.read_bytes() == before
    stamped = tmp_path / "stamped.pte"
    assert (
        main(
            [
                "specialize",
                str(EXT.pte_path),
                str(stamped),
                "--backend",
                "passthrough",
                "--allow-unchanged",
            ]
        )
        == 0
    )
    assert verify(stamped).status == "intact"


def test_the_compatibility_example_in_the_docs_works_without_a_device() -> None:
    import types

    from ptestore.backends.compat import Compatibility

    text = (Path(__file__).parents[2] / "docs" / "fleet.md").read_text()
    section = text[text.index("## Compatibility, for backend authors") :]
    start = section.index("```python\n") + 10
    code = section[start : section.index("\n```", start)]
    scope: dict[str, object] = {}
    exec(compile(code, "docs/fleet.md", "exec"), scope)
    backend = scope["NpuBackend"]()  # type: ignore[operator]
    info = backend.compatibility_info(types.SimpleNamespace(device=None))
    assert info == "sdk=2.31;arch=generic"
    assert backend.check_compatibility(info, None) is Compatibility.OPTIMAL
    npu = DeviceProfile("npu", {"soc": "sm8650"})
    assert backend.check_compatibility(info, npu) is Compatibility.UNSUPPORTED
    made = backend.compatibility_info(types.SimpleNamespace(device=npu))
    assert backend.check_compatibility(made, npu) is Compatibility.OPTIMAL


def test_a_record_without_device_options_says_to_give_them(pair: tuple[Path, Path]) -> None:
    from ptestore.provenance.profile import named_profile
    from ptestore.provenance.record import Provenance

    pte, _ = pair
    trailer = read_trailer(open_loader(pte))
    assert trailer is not None
    record = trailer.record()
    assert named_profile("a", Provenance.from_dict(record, str(pte))) == (A, "")
    del record["device"]["options"]  # as records of older versions, which kept only the digest
    profile, hint = named_profile("a", Provenance.from_dict(record, str(pte)))
    assert profile == DeviceProfile("a")
    assert hint == (
        "; the record keeps no options of the device it was made for: give the profile's "
        "options (--device-option K=V)"
    )
