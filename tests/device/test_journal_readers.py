"""Every path that reads a local model completes a committed journal first: a fleet
job whose source an in-place run left torn (marked ``PTJ~``, its journal committed)
plans and makes it from the completed bytes, as ``inspect`` would read them, and the pair
runner the fleet's workers call completes it too. A model name too long for its journal
(past 239 bytes) is refused in place as a name too long, exit 2, naming the limits."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import ptestore
from ptestore.cli import main
from ptestore.coordinator import specialize_pair
from ptestore.errors import ConfigurationError

from .test_journal_names import FX, SPEC, _staged, _torn, journal_paths

FLEET_SPEC = "support.fleet_backend:Scaler=1.0"


def _job(tmp_path: Path, source: Path) -> Path:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["{FLEET_SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{source}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n'
    )
    return job


def test_a_fleet_job_completes_a_torn_local_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torn = _torn(tmp_path)
    staged = _staged(tmp_path)
    job = _job(tmp_path, torn)
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    assert '"failed": 0' in capsys.readouterr().out
    assert torn.read_bytes() == staged
    assert not any(os.path.lexists(j) for j in journal_paths(torn))
    # The artifact was made from the completed bytes: current for the plan, and its
    # record names the source as it is now.
    assert main(["fleet", "plan", str(job)]) == 0
    assert "1 pairs: 0 to run, 1 to skip" in capsys.readouterr().out
    report = ptestore.verify(tmp_path / "out" / "a" / "mlp.pte", source=torn)
    assert report.status == "current", report


def test_the_pair_runner_completes_a_torn_source(tmp_path: Path) -> None:
    """What a fleet's worker calls (a task planned before the source was torn)."""
    torn = _torn(tmp_path)
    out = tmp_path / "out.pte"
    specialize_pair(torn, out, backends=[SPEC], provenance=False, allow_unchanged=True)
    assert torn.read_bytes() == _staged(tmp_path)
    assert not any(os.path.lexists(j) for j in journal_paths(torn))
    assert out.exists()


def test_verify_against_a_torn_source_completes_it_first(tmp_path: Path) -> None:
    """``verify --source``: the source an in-place run left torn is completed before its
    bytes are compared (it was hashed as it lay, marked, and called a different source)."""
    out = tmp_path / "out.pte"
    staged = _staged(tmp_path)
    (tmp_path / "copy").mkdir()
    made = tmp_path / "copy" / "torn.pte"
    made.write_bytes(staged)
    ptestore.specialize(made, out, backends=[FLEET_SPEC])
    torn = _torn(tmp_path)
    report = ptestore.verify(out, source=torn)
    assert report.status == "current", report
    assert torn.read_bytes() == staged
    assert not any(os.path.lexists(j) for j in journal_paths(torn))


@pytest.mark.parametrize("size", [240, 255])
def test_a_model_name_past_239_bytes_is_refused_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: int
) -> None:
    assert FX.pte_path is not None
    name = "m" * (size - 4) + ".pte"
    model = tmp_path / name
    shutil.copyfile(FX.pte_path, model)
    before = model.read_bytes()
    journal = journal_paths(model)[0]
    shown = f"'.{'m' * 39}'... ({size + 16} characters)"  # _text.shown(name, 40)
    expected = (
        f"{journal}: cannot create the journal: File name too long (the name {shown} is "
        f"{size + 16} bytes long, over the file system's limit of 255 bytes per name "
        "(NAME_MAX)); in place, the model's name is at most 239 bytes (its journal's, "
        ".NAME.ptestore-jrnl2, is 16 bytes longer): rename it, or specialize it to "
        "another file"
    )
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(model, model, backends=[SPEC], in_place=True, provenance=False)
    assert str(err.value) == expected
    assert main(["specialize", str(model), str(model), "--in-place", "--backend", SPEC]) == 2
    assert expected in capsys.readouterr().err
    assert model.read_bytes() == before and os.listdir(tmp_path) == [name]
