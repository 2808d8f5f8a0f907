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
