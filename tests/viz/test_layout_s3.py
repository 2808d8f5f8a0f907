"""The layout map of objects on S3 (moto and SeaweedFS): the same regions and the same
change status as for the local files; the provenance trailer read with a ranged GET."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.large import ReplaceKey

import ptestore
from ptestore.testing.s3server import S3TestServer
from ptestore.viz.layout import layout_html

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tests" / "fixtures" / "mlp_xnnpack.pte"


def _files(html: str) -> list[dict[str, Any]]:
    found = re.search(r'<script type="application/json" id="ptestore-data">(.*?)</script>', html)
    assert found is not None
    files: list[dict[str, Any]] = json.loads(found.group(1))["files"]
    return files


def _shape(files: list[dict[str, Any]]) -> list[list[tuple[Any, ...]]]:
    return [
        [(r["kind"], r["start"], r["size"], r["label"], r.get("status")) for r in f["regions"]]
        for f in files
    ]


@pytest.mark.s3
def test_compare_on_s3_matches_local(s3_server: S3TestServer, tmp_path: Path) -> None:
    key = ptestore.describe(SRC)["named_data"][0]["key"]
    dst = tmp_path / "spec.pte"
    ptestore.specialize(
        SRC, dst, backends=[ReplaceKey("XnnpackBackend", key, extra=100)], provenance=True
    )
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="src.pte", Body=SRC.read_bytes())
    client.put_object(Bucket=bucket, Key="spec.pte", Body=dst.read_bytes())
    remote = _files(
        layout_html(
            f"s3://{bucket}/spec.pte",
            compare=f"s3://{bucket}/src.pte",
            **s3_server.storage_options,
        )
    )
    local = _files(layout_html(dst, compare=SRC))
    assert _shape(remote) == _shape(local)
    assert remote[1]["regions"][-1]["kind"] == "trailer"
    assert "grown" in {r.get("status") for r in remote[1]["regions"]}
