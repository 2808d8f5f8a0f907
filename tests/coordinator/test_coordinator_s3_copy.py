"""The coordinator S3 to S3: unchanged parts of the .pte and the .ptd are copied by the
service; the outputs are byte for byte those of a local run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.testing.moto import MotoS3, small_s3_parts
from ptestore.testing.s3_traffic import Traffic

pytestmark = pytest.mark.s3

PART = 512  # the fixtures are a few KiB: small parts (moto's minimum lowered, test-only)


class Reverse(BackendInterface):
    """Replaces one named blob by its bytes reversed (same size)."""

    name = "XnnpackBackend"

    def __init__(self, key: str | None) -> None:
        self.key = key

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        if self.key is not None:
            data = bytes(context.get_named_data_map().get_data(self.key))
            output.write_named_data(self.key, BackendData(data[::-1]))


def session_with(traffic: Traffic) -> Any:
    import aiobotocore.session

    session = aiobotocore.session.AioSession()
    traffic.attach(session)  # every client made from the session counts
    return session


def put(moto: MotoS3, bucket: str, path: Path) -> str:
    key = f"in/{uuid.uuid4().hex}{path.suffix}"
    moto.client().put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{key}"


def get(moto: MotoS3, url: str) -> bytes:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    body: bytes = moto.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


@pytest.mark.parametrize("replace", [False, True], ids=["passthrough", "one-blob"])
def test_pair_is_copied_server_side(moto_s3: MotoS3, tmp_path: Path, replace: bool) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    key = fx.facts["ptd"]["named_data"][1]["key"] if replace else None
    ptestore.specialize(
        fx.pte_path,
        tmp_path / "out.pte",
        ptd=(fx.ptd_path, tmp_path / "out.ptd"),
        backends=[Reverse(key)],
        allow_unchanged=True,  # Reverse(None) writes nothing: a declined, unchanged copy
        provenance=False,
    )
    bucket = moto_s3.new_bucket()
    pte, ptd = put(moto_s3, bucket, fx.pte_path), put(moto_s3, bucket, fx.ptd_path)
    traffic = Traffic()
    options = {**moto_s3.storage_options, "session": session_with(traffic)}
    out_pte, out_ptd = f"s3://{bucket}/out.pte", f"s3://{bucket}/out.ptd"
    with small_s3_parts():
        ptestore.specialize(
            pte,
            out_pte,
            ptd=(ptd, out_ptd),
            backends=[Reverse(key)],
            allow_unchanged=True,
            storage_options=options,
            dst_storage_options={"part_size": PART},
            provenance=False,
        )
    assert get(moto_s3, out_pte) == (tmp_path / "out.pte").read_bytes()
    assert get(moto_s3, out_ptd) == (tmp_path / "out.ptd").read_bytes()
    copies = traffic.params["UploadPartCopy"]
    sources = {p["CopySource"]["Key"] for p in copies}
    assert sources == {pte.split("/", 3)[3], ptd.split("/", 3)[3]}  # both files
    # Every copy is pinned to the ETag the loader read at the start.
    etags = {
        u.split("/", 3)[3]: moto_s3.client().head_object(Bucket=bucket, Key=u.split("/", 3)[3])[
            "ETag"
        ]
        for u in (pte, ptd)
    }
    assert all(p["CopySourceIfMatch"] == etags[p["CopySource"]["Key"]] for p in copies)
    size = fx.pte_path.stat().st_size + fx.ptd_path.stat().st_size
    uploaded = traffic.sent["UploadPart"]
    assert uploaded < size  # not everything went through the client
