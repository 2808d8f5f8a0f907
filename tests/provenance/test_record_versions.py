"""A provenance record keeps the version it was read with: one read from a version 1 or 2
trailer is reported (``inspect``, ``verify``, ``ensure`` ``--json``) and stored (a cache
manifest) as that version, never as version 3 (it was: a version-3 record naming its
bytes by their whole SHA-256, without chunks, which docs/concepts.md says a reader
refuses, and which was then read back); a dict that says 3 and does not name its bytes by
its chunks' root is refused. The artifacts are the committed ``data/v1_trailer`` and
``data/v2_trailer`` pairs (made by ptestore before record version 2 and at 3917b44)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.fleet_backend import specialized_pair

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index_entry import entry_for
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.record import Provenance
from ptestore.storage.loaders import open_loader

DATA = Path(__file__).parent / "data"


def _pair(tmp: Path, version: int) -> Path:
    """The committed pair whose .pte has a version-``version`` trailer, copied into
    ``tmp`` (its .ptd beside it); the .pte."""
    for suffix in (".pte", ".ptd"):
        shutil.copyfile(DATA / f"v{version}_trailer{suffix}", tmp / f"v{version}_trailer{suffix}")
    return tmp / f"v{version}_trailer.pte"


def _record(path: Path) -> dict[str, Any]:
    trailer = read_trailer(open_loader(path))
    assert trailer is not None
    record: dict[str, Any] = trailer.record()
    return record


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main([*argv, "--json"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_a_record_is_reported_as_the_version_it_was_read_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int
) -> None:
    pte = _pair(tmp_path, version)
    assert _record(pte)["version"] == version
    prov = read_provenance(open_loader(pte))
    assert prov is not None and prov.version == version
    assert prov.to_dict()["version"] == version
    assert Provenance.from_dict(prov.to_dict(), "again") == prov  # and reads back
    assert _json(["inspect", str(pte)], capsys)["provenance"]["version"] == version
    report = _json(["verify", str(pte)], capsys)
    assert (report["status"], report["provenance"]["version"]) == ("intact", version)


def test_a_record_made_now_is_version_3(tmp_path: Path) -> None:
    pte, _ = specialized_pair(tmp_path, "a", 2.0)
    prov = read_provenance(open_loader(pte))
    assert prov is not None and prov.version == 3 and prov.to_dict()["version"] == 3


def test_a_dict_that_says_3_without_its_chunks_root_is_refused(tmp_path: Path) -> None:
    """What ``to_dict`` wrote of a version 1 or 2 record: refused on reading."""
    v1, v2 = _record(_pair(tmp_path, 1)), _record(_pair(tmp_path, 2))
    said = v1["content"]["sha256"]
    with pytest.raises(FormatError) as info:
        Provenance.from_dict({**v1, "version": 3}, "m.json")
    assert str(info.value) == (
        f"m.json: provenance content.sha256 = {said!r}: must be the root of its chunks "
        "(content.chunks.root)"
    )
    prov = Provenance.from_dict(v2, "v2")
    assert prov.content is not None and prov.content.chunks is not None
    assert prov.ptd_output is not None and prov.ptd_output.chunks is not None
    root = prov.content.chunks.digest
    with pytest.raises(FormatError) as info:
        Provenance.from_dict({**v2, "version": 3}, "m.json")
    assert str(info.value) == (
        f"m.json: provenance content.sha256 = {v2['content']['sha256']!r}: must be {root}, "
        "the root of its chunks"
    )
    ptd_root = prov.ptd_output.chunks.digest
    rooted = {**v2["content"], "sha256": root}  # the content as version 3 names it
    with pytest.raises(FormatError) as info:
        Provenance.from_dict({**v2, "version": 3, "content": rooted}, "m.json")
    assert str(info.value) == (
        f"m.json: provenance ptd_output.sha256 = {v2['ptd_output']['sha256']!r}: must be "
        f"{ptd_root}, the root of its chunks"
    )


def _index(tmp: Path, pte: Path) -> Path:
    """A version 2 index whose one entry (model ``m``) is the pair at ``pte``."""
    entry = {**entry_for(str(pte), str(pte.with_suffix(".ptd")), {}, None), "model": "m"}
    index = tmp / "ptestore-index.json"
    index.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [entry]}))
    return index


def test_the_cache_stores_the_version_read_and_serves_what_an_earlier_ptestore_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ensure INDEX`` of a version-1 artifact: its manifest and ``--json`` say 1, and
    the entry is a hit. One whose manifest an earlier ptestore wrote saying 3 (refused
    now) is a miss, fetched again, and served offline meanwhile."""
    pte = _pair(tmp_path, 1)
    index = _index(tmp_path, pte)
    argv = ["ensure", str(index), "--cache-dir", str(tmp_path / "cache"), "--model", "m"]
    argv += ["--device", "a"]
    made = _json(argv, capsys)
    assert (made["created"], made["provenance"]["version"]) == (True, 1)
    manifest = Path(made["pte"]).with_name("manifest.json")
    assert json.loads(manifest.read_text())["provenance"]["version"] == 1
    hit = _json(argv, capsys)
    assert (hit["created"], hit["provenance"]["version"]) == (False, 1)

    stored = json.loads(manifest.read_text())
    stored["provenance"]["version"] = 3  # as ptestore from a2e86c8 stored it
    manifest.write_text(json.dumps(stored))
    index.rename(tmp_path / "moved.json")
    # listed ready, kept by prune (it was "broken", and removed: nothing left offline)
    from ptestore.device import list_entries, prune

    assert [e.state for e in list_entries(tmp_path / "cache")] == ["ready"]
    prune(tmp_path / "cache")
    assert manifest.exists()
    offline = _json(argv, capsys)
    assert offline["choice"]["offline"].startswith("served from the cache offline: ")
    assert offline["provenance"]["version"] == 1
    (tmp_path / "moved.json").rename(index)
    again = _json(argv, capsys)  # a miss: fetched again, stored as read
    assert (again["created"], again["provenance"]["version"]) == (True, 1)
    assert json.loads(manifest.read_text())["provenance"]["version"] == 1


def test_verify_as_planned_calls_a_record_from_before_version_3_stale_as_a_plan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fleet plan compares a pair's sources by the digest ptestore names them by now
    (``sha256-tree:``), so it makes an artifact of a version 1 or 2 record again, once;
    ``verify`` by the digest the record names (its sources unchanged: current), unless
    ``as_planned`` (``verify --job``), which judges as the plan does (it said current)."""
    from support.fixtures import get_fixture

    from ptestore import verify
    from ptestore.backends.compat import DeviceProfile
    from ptestore.fleet import load_job
    from ptestore.fleet.plan import plan_job
    from ptestore.provenance.chunks import tree_digest

    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    out = tmp_path / "out" / "a"
    out.mkdir(parents=True)
    for suffix in (".pte", ".ptd"):  # the committed pair: this job's pair, made before v2
        shutil.copyfile(DATA / f"v1_trailer{suffix}", out / f"m{suffix}")
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        'backends = ["support.fleet_backend:Scaler=1.0"]\n'
        f'[[models]]\nname = "m"\nsource = "{ext.pte_path}"\nptd = "{ext.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n'
    )
    (planned,) = plan_job(load_job(job)).pairs
    record = _record(out / "m.pte")
    assert planned.action == "run"
    assert planned.reason.startswith(f"stale: source.sha256 is {record['source']['sha256']}, ")
    given: dict[str, Any] = {
        "source": ext.pte_path,
        "backends": ["support.fleet_backend:Scaler=1.0"],
        "device": DeviceProfile("a", {"soc": "x", "scale": 2.0}),
        "ptd_source": ext.ptd_path,
    }
    assert verify(out / "m.pte", **given).status == "current"
    report = verify(out / "m.pte", **given, as_planned=True)
    assert report.status == "stale" and report.exit_code == 1
    messages = {f.field: f.message for f in report.findings}
    for role, src in (("source", ext.pte_path), ("ptd_source", ext.ptd_path)):
        made = record[role]
        assert messages.pop(f"{role}.sha256") == (
            f"the record names {made['url']} by its whole SHA-256 ({made['sha256']}: a record "
            f"from before version 3), a fleet plan compares {src} by "
            f"{tree_digest(src.read_bytes())}: it makes the pair again"
        )
    assert messages == {}
    # the command line's verify --job judges so (it said current)
    from ptestore.cli import main

    assert main(["verify", "--job", str(job), "--json"]) == 1
    (pair,) = json.loads(capsys.readouterr().out)["pairs"]
    assert pair["status"] == "stale", pair
