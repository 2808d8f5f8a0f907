"""``ensure INDEX`` falling back to the model's portable source, with the entry of that
source made by a ptestore before record version 3: its record names the sources by
their whole SHA-256 (``sha256:``), the index a current run wrote by their chunks' root
(``sha256-tree:``), two kinds of digest that cannot be compared without reading the
sources. Such a hit is made again, once (it was refused as "another version" of the
source on every call, and running the fleet job again changed nothing). The entry an
older ptestore made is this test's: the current entry's manifest given the record
version 2 wrote (version 2, the sources named by ``sha256:``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.fleetrun import fleet_run

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.errors import IntegrityError

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
Z = DeviceProfile("z", {"soc": "q", "scale": 5.0})  # no build of the job fits it


def _job(tmp: Path) -> Path:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\n'
        f'backends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n'
    )
    return job


def _as_made_before_version_3(cache: Path, key: str) -> None:
    """The entry ``key``'s manifest as an older ptestore stored it: record version 2,
    the sources named by their whole SHA-256."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    path = cache / "entries" / key / "manifest.json"
    manifest = json.loads(path.read_text())
    record = manifest["provenance"]
    record["version"] = 2
    for role, src in (("source", EXT.pte_path), ("ptd_source", EXT.ptd_path)):
        record[role]["sha256"] = "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest))


def test_an_entry_made_before_version_3_is_made_again_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = fleet_run(_job(tmp_path), capsys)
    cache = tmp_path / "cache"
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    assert made.created and made.choice is not None and made.choice["kind"] == "source"
    _as_made_before_version_3(cache, made.key)
    old = ptestore.ensure(index, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    assert old.created and old.key == made.key  # made again, not refused
    assert old.provenance is not None and old.provenance.version == 3
    assert old.provenance.source.sha256.startswith("sha256-tree:")
    hit = ptestore.ensure(index, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    assert not hit.created and hit.pte == old.pte  # once


def _as_written_before_version_3(index: Path, tmp: Path) -> Path:
    """A copy of the version 2 ``index`` naming the sources as a runner before record
    version 3 wrote them (their whole SHA-256)."""
    data = json.loads(index.read_text())
    for entry in data["entries"]:
        for role in ("source", "ptd_source"):
            named = entry.get(role)
            if isinstance(named, dict) and named.get("url"):
                whole = hashlib.sha256(Path(named["url"]).read_bytes()).hexdigest()
                named["sha256"] = f"sha256:{whole}"
    other = tmp / "other" / "ptestore-index.json"
    other.parent.mkdir()
    other.write_text(json.dumps(data))
    return other


def test_an_entry_made_now_against_an_older_runners_index_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other way round (the entry made now names ``sha256-tree:``, an index an
    older runner wrote ``sha256:``): refused, as before, without making the entry again
    and without removing it (made again, refused and removed on every call, the two
    indexes undid each other's entry)."""
    job = _job(tmp_path)
    job.write_text("index_version = 2\n" + job.read_text())
    index = fleet_run(job, capsys)
    cache = tmp_path / "cache"
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    assert made.created
    older = _as_written_before_version_3(Path(index), tmp_path)
    for _ in range(2):
        with pytest.raises(IntegrityError, match=r"the portable source has sha256-tree:"):
            ptestore.ensure(older, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    hit = ptestore.ensure(index, cache_dir=cache, model="m", device=Z, backends=[SPEC])
    assert not hit.created and hit.pte == made.pte  # kept, never made again
