"""--compare on a reflink file system: unchanged segments the writer cloned are "cloned"
(FIEMAP reports their extents shared), the replaced one "replaced"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate
from support.xfs import XfsMount, xfs_reflink_mount

import ptestore
from ptestore.viz.layout import layout_html, shared_ranges


@pytest.fixture(scope="module")
def xfs() -> Iterator[XfsMount]:
    with xfs_reflink_mount("1G") as mount:
        yield mount


@pytest.mark.reflink
def test_compare_shows_cloned_segments(xfs: XfsMount) -> None:
    src = xfs.path / "big.pte"
    inflate(get_fixture("mlp_xnnpack").pte_path or "", src, 1 << 20)
    key = ptestore.describe(src)["named_data"][1]["key"]
    dst = xfs.path / "one.pte"
    report = ptestore.specialize(src, dst, backends=[ReplaceKey("XnnpackBackend", key)])
    assert report.files[0].bytes_cloned > 0
    assert shared_ranges(str(dst))
    html = layout_html(dst, compare=src)
    found = re.search(r'<script type="application/json" id="ptestore-data">(.*?)</script>', html)
    assert found is not None
    artifact = json.loads(found.group(1))["files"][1]["regions"]
    status = {
        r["keys"][0] if r["keys"] else r["label"]: r["status"]
        for r in artifact
        if r["kind"] == "segment" and r["size"]
    }
    assert status.pop(key) == "replaced"
    assert status and set(status.values()) <= {"cloned", "unchanged", "moved"}
    weights = {
        r["keys"][0]: r["status"]
        for r in artifact
        if r["kind"] == "segment" and r["keys"] and r["size"] >= 1 << 20 and r["keys"][0] != key
    }
    assert weights and set(weights.values()) == {"cloned"}


def test_shared_ranges_of_a_plain_file(tmp_path: Path) -> None:
    """A file with no shared extents has none (or FIEMAP is unsupported: None)."""
    path = tmp_path / "plain.bin"
    path.write_bytes(b"x" * 100_000)
    assert shared_ranges(str(path)) in ([], None)
    assert shared_ranges(str(tmp_path / "missing")) is None
