"""A run's report names the digest its outputs' provenance records name
(``FileReport.content_digest``): what the fleet compares a destination's record with
after publishing instead of reading the file again."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.digests import tree
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.provenance import read_provenance
from ptestore.provenance.trailer import read_trailer
from ptestore.storage.loaders import open_loader

EXT = get_fixture("mlp_xnnpack_ext")
MLP = get_fixture("mlp_xnnpack")
SCALER = "support.fleet_backend:Scaler"
DOUBLE = DeviceProfile("d", {"soc": "x", "scale": 2.0})


def _recorded(path: Path) -> tuple[str, str]:
    """The digest the file's record names, and the tree digest of its bytes before the
    trailer."""
    loader = open_loader(str(path))
    try:
        trailer = read_trailer(loader)
        record = read_provenance(loader)
    finally:
        loader.close()
    assert trailer is not None and record is not None and record.content is not None
    return record.content.sha256, tree(path.read_bytes()[: trailer.content_size])


def test_a_pair_reports_the_digests_its_records_name(tmp_path: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    out, out_ptd = tmp_path / "o.pte", tmp_path / "o.ptd"
    report = ptestore.specialize(
        EXT.pte_path, out, ptd=(EXT.ptd_path, out_ptd), backends=[SCALER], device=DOUBLE
    )
    by_role = {f.role: f for f in report.files}
    for role, path in (("pte", out), ("ptd", out_ptd)):
        named, actual = _recorded(path)
        assert by_role[role].content_digest == named == actual, role
    assert by_role["pte"].content_digest != by_role["ptd"].content_digest


def test_in_place_reports_the_digest_its_record_names(tmp_path: Path) -> None:
    assert MLP.pte_path is not None
    target = tmp_path / "m.pte"
    shutil.copyfile(MLP.pte_path, target)
    report = ptestore.specialize(target, target, backends=[SCALER], device=DOUBLE, in_place=True)
    named, actual = _recorded(target)
    assert report.files[0].content_digest == named == actual
    assert named.startswith("sha256-tree:")


def test_no_provenance_no_digest(tmp_path: Path) -> None:
    assert MLP.pte_path is not None
    report = ptestore.specialize(
        MLP.pte_path, tmp_path / "o.pte", backends=[SCALER], device=DOUBLE, provenance=False
    )
    assert report.files[0].content_digest is None
