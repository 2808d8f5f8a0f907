"""``DataWriter.add_object_metadata``: kept beside the object where the storage can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import WriterStateError
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer


@pytest.mark.s3
def test_s3_writer_stores_added_metadata(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    w = open_writer(f"s3://{s3_bucket}/m.pte", **s3_server.storage_options)
    assert w.add_object_metadata({"ptestore-key": "abc"}) is True
    w.write(b"payload", 0)
    with pytest.raises(WriterStateError, match="object metadata must be added before writing"):
        w.add_object_metadata({"late": "x"})
    w.publish()
    head = s3_client.head_object(Bucket=s3_bucket, Key="m.pte")
    assert head["Metadata"]["ptestore-key"] == "abc"
    assert "late" not in head["Metadata"]


def test_writers_without_object_metadata_say_so(tmp_path: Path) -> None:
    for url in (str(tmp_path / "m.pte"), "memory://meta/m.pte"):
        w = open_writer(url)
        assert w.add_object_metadata({"k": "v"}) is False
        w.discard()
