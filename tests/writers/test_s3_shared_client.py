"""``skip_instance_cache=False``: S3 writers share fsspec's cached filesystem and its
client, and none of them closes it (the fleet index writes hundreds of small objects
that way); by default each writer has a client of its own and closes it when published."""

from __future__ import annotations

import pytest

from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer


@pytest.mark.s3
def test_writers_share_a_cached_client_and_leave_it_open(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    shared = {**s3_server.storage_options, "skip_instance_cache": False}
    writers = []
    for i in range(3):  # each publishes on the client the previous ones left open
        w = open_writer(f"s3://{bucket}/shared/{i}.json", **shared)
        w.write(b"{}", 0)
        w.publish("create")
        writers.append(w)
    assert writers[0].client is writers[1].client is writers[2].client
    assert not any(w.conn.owned for w in writers)
    own = [
        open_writer(f"s3://{bucket}/own/{i}.json", **s3_server.storage_options) for i in range(2)
    ]
    assert own[0].client is not own[1].client and all(w.conn.owned for w in own)
    for w in own:
        w.write(b"{}", 0)
        w.publish("create")
    keys = s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(k["Key"] for k in keys) == [
        "own/0.json",
        "own/1.json",
        "shared/0.json",
        "shared/1.json",
        "shared/2.json",
    ]
