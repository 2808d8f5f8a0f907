"""A fleet artifact whose record's ``content.size`` is one byte off the trailer's own
``content_size`` (hostile or damaged: it claims other bytes than precede it, its digests
and its trailer's checksum otherwise right) is trusted nowhere: the plan redoes it
(``binding.py``), no index entry is made from it (``index.py``: publishing the pair's
entry and a ``fetch`` of its URL refuse it), and a fetch from an index that pins its
trailer refuses it before any content byte (``chunked.py``). A delta base carrying such
a record is hashed instead: ``tests/fleet/test_delta_fetch.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.fleetrun import fleet_run
from support.forged import forge

import ptestore
from ptestore.cli import main
from ptestore.errors import FormatError, IntegrityError
from ptestore.fleet import load_job, plan_job
from ptestore.fleet.index import artifact_entry, publish_pairs, update_index
from ptestore.provenance import read_trailer
from ptestore.storage.loaders import BytesLoader

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _made(tmp: Path, capsys: Any) -> tuple[Path, str, Path, str]:
    """A job of one pair run once: the job file, its index, and its .pte with a record
    forged to claim one byte more; with the message that refuses it."""
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n'
    )
    index = fleet_run(job, capsys)
    pte = tmp / "out" / "a" / "m.pte"
    trailer = read_trailer(BytesLoader(pte.read_bytes()))
    assert trailer is not None
    real = trailer.content_size
    forge(pte)
    message = (
        f"{pte}: provenance content.size = {real + 1}: must be {real}, the bytes before the "
        "provenance trailer (its footer's content_size)"
    )
    return job, index, pte, message


def test_the_plan_redoes_a_destination_whose_record_claims_other_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, _, pte, message = _made(tmp_path, capsys)
    (planned,) = plan_job(load_job(job)).pairs
    assert (planned.action, planned.reason) == ("run", f"damaged provenance trailer: {message}")
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] == 1
    assert ptestore.verify(str(pte)).status == "intact"


def test_no_index_entry_is_made_from_a_record_claiming_other_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, _, pte, message = _made(tmp_path, capsys)
    with pytest.raises(FormatError) as err:
        artifact_entry(str(pte), {})
    assert str(err.value) == message
    assert publish_pairs(load_job(job), [("m", "a")]) == (None, message, None)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(FormatError) as err:
        ptestore.fetch(pte, dest)  # the artifact's URL: its entry is made from its trailer
    assert str(err.value) == message
    assert not dest.exists() and not dest.with_suffix(".ptd").exists()


def test_fetch_refuses_a_pinned_trailer_whose_record_claims_other_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index pins the forged trailer (its checksum and the file's size) and still
    names the real content's digest, which a whole-file check would accept: refused
    before any content byte is downloaded."""
    _, index, pte, message = _made(tmp_path, capsys)
    data = pte.read_bytes()
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None

    def pin(entry: dict[str, Any]) -> dict[str, Any]:
        pinned = {"size": len(data), "trailer_sha256": "sha256:" + trailer.sha256}
        return {**entry, "pte": {**entry["pte"], **pinned}}

    update_index(index, pin)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(err.value) == message  # the URL once
    assert not dest.exists() and not dest.with_suffix(".ptd").exists()


def test_an_artifact_of_another_device_is_never_indexed_as_the_pairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pair (m, a)'s destination holds pair (m, b)'s artifact (a copy, another job):
    indexing (m, a) leaves (m, b)'s entry alone and says why (m, a) was not indexed;
    the other pairs are indexed."""
    from ptestore.backends.compat import DeviceProfile
    from ptestore.fleet.index import find_entry

    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\n'
        "[devices.a]\nx = 1\n[devices.b]\nx = 2\n[devices.c]\nx = 3\n"
    )
    index = fleet_run(job, capsys)
    out = tmp_path / "out"
    (out / "a" / "m.pte").write_bytes((out / "b" / "m.pte").read_bytes())
    message = (
        f"{out}/a/m.pte: provenance device = ('b', "
        f"{DeviceProfile('b', {'x': 2}).digest()!r}): must be the pair (m, a)'s device, "
        f"('a', {DeviceProfile('a', {'x': 1}).digest()!r}) (not indexed)"
    )
    url, why, _ = publish_pairs(load_job(job), [("m", "a"), ("m", "c")])
    assert (url, why) == (index, message)
    entry = find_entry(index, "m", "b")
    assert entry is not None and entry["pte"]["url"] == f"{out}/b/m.pte"
    entry = find_entry(index, "m", "a")
    assert entry is not None and entry["pte"]["url"] == f"{out}/a/m.pte"
    assert publish_pairs(load_job(job), [("m", "a")]) == (None, message, None)
