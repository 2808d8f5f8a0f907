"""``verify --range`` on S3 reads the chunks of the range a request per 8 MiB piece
(``REQUEST_PIECE``), not per 128 KiB (``HASH_PIECE``: the buffer a local file is hashed
in): a 4 MiB chunk is one ranged GET (it was 32), counted on moto."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.large import inflate

import ptestore
from ptestore.provenance.check import check_bytes
from ptestore.storage.loaders import open_loader
from ptestore.testing.moto import MotoS3
from ptestore.testing.s3_traffic import Traffic

MiB = 1 << 20


def _session(traffic: Traffic) -> Any:
    import aiobotocore.session

    session = aiobotocore.session.AioSession()
    traffic.attach(session)  # every client made from the session counts
    return session


@pytest.mark.s3
def test_a_range_on_s3_is_read_a_chunk_per_request(moto_s3: MotoS3, tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    src = tmp_path / "big.pte"
    inflate(fx.pte_path, src, 4 * MiB)  # 16 MiB and more: several 4 MiB chunks
    out = tmp_path / "out.pte"
    ptestore.specialize(src, out, backends=["passthrough"], allow_unchanged=True)
    bucket = moto_s3.new_bucket()
    key = f"{uuid.uuid4().hex}.pte"
    moto_s3.client().put_object(Bucket=bucket, Key=key, Body=out.read_bytes())
    traffic = Traffic()
    url = f"s3://{bucket}/{key}"
    loader = open_loader(url, **moto_s3.storage_options, session=_session(traffic))
    try:
        traffic.reset()
        checked = check_bytes(loader, (0, 8 * MiB))
        chunk_gets = [
            p["Range"]
            for p in traffic.params["GetObject"]
            if int(p["Range"].split("=")[1].split("-")[0]) < 8 * MiB
        ]
    finally:
        loader.close()
    assert checked.chunks == 2
    assert chunk_gets == [f"bytes=0-{4 * MiB - 1}", f"bytes={4 * MiB}-{8 * MiB - 1}"]
