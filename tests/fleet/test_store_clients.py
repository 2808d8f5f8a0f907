"""The fleet's own S3 clients in a long-running process: the index store's reads,
writes and listings follow a credentials file a sidecar rewrites (they share one client
per option set and credentials' state, :mod:`ptestore.storage.filesystems`: before,
fsspec's instance cache kept the client made first, with the key before the rotation),
and gc's store closes the client of its own when the collection ends (before, it was
left to the garbage collector). On moto and SeaweedFS (which refuses a key it does not
know: a 403 before the rotation, the index read after it)."""

from __future__ import annotations

import gc
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.aws_credentials import use_credentials_file, write_credentials
from writers.s3_faults import Fault

from ptestore.errors import PermissionDenied, StorageError
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.orphan_store import OrphanStore
from ptestore.fleet.orphans import collect_orphans
from ptestore.storage import filesystems
from ptestore.testing.s3server import S3TestServer

from .retrykit import faulty_session

pytestmark = pytest.mark.s3


def _signed_with(session: Any) -> list[str]:
    """The access key of every S3 request sent by a client made from ``session`` from
    now on (from its ``Authorization`` header)."""
    keys: list[str] = []

    def sent(request: Any, **_: Any) -> None:
        auth = request.headers.get("Authorization") or b""
        text = auth.decode() if isinstance(auth, bytes) else str(auth)
        found = re.search(r"Credential=([^/]+)/", text)
        keys.append(found.group(1) if found else "")

    session.register("before-send.s3", sent)
    return keys


def test_the_index_store_follows_a_credentials_rotation(
    s3_server: S3TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = s3_server.storage_options
    creds = tmp_path / "credentials"
    use_credentials_file(monkeypatch, creds)
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="fleet/d/a.json", Body=b"{}")
    options = {
        "endpoint_url": good["endpoint_url"],
        "client_kwargs": good["client_kwargs"],
        "retry_attempts": 1,
    }
    store = IndexStore(f"s3://{bucket}/fleet/ptestore-index.json", options)
    a, d = f"s3://{bucket}/fleet/d/a.json", f"s3://{bucket}/fleet/d"
    old_key = f"rotated-out-{uuid.uuid4().hex[:8]}"
    write_credentials(creds, old_key, "the-old-secret")
    before = _signed_with(filesystems.shared_session({}))  # the session of that state
    if s3_server.name == "seaweedfs":
        with pytest.raises(PermissionDenied):
            store.read(a)
    else:
        assert store.read(a)[0] == b"{}" and store.list_names(d) == ["a.json"]
        assert set(before) == {old_key}
    sent_before = len(before)
    write_credentials(creds, good["key"], good["secret"])  # the sidecar's rotation
    after = _signed_with(filesystems.shared_session({}))
    store.write(f"s3://{bucket}/fleet/d/b.json", {"b": 1}, "create")
    assert store.read(f"s3://{bucket}/fleet/d/b.json")[0] == b'{"b":1}'
    assert store.list_names(d) == ["a.json", "b.json"]
    assert after and set(after) == {good["key"]}
    assert len(before) == sent_before  # nothing more signed with the old key


def test_gc_closes_the_client_of_its_store(
    s3_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc's listing (and its clock, each look and delete) go through a client of the
    collection's own, closed when the collection ends, whichever way: with the collector
    off (a busy process between passes) none of them stays open (was: each left to the
    garbage collector)."""
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="fleet/m.pte", Body=b"not ours")
    made: list[Any] = []
    real = OrphanStore.__init__

    def spy(self: OrphanStore, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        made.append(self.fs)

    monkeypatch.setattr(OrphanStore, "__init__", spy)
    gc.collect()
    gc.disable()
    try:
        assert collect_orphans(f"s3://{bucket}/fleet", grace=0, **s3_server.storage_options) == []
        fault = Fault("ListObjectsV2", "503", times=-1)
        failing = {
            **s3_server.storage_options,
            "retry_attempts": 1,
            "session": faulty_session("ListObjectsV2", fault, lambda url: True),
        }
        with pytest.raises(StorageError, match="ListObjectsV2 failed"):  # closed all the same
            collect_orphans(f"s3://{bucket}/fleet", grace=0, **failing)
        assert fault.calls == 1
        assert len(made) == 2 and made[0] is not made[1]
        assert all(fs._s3 is not None for fs in made)  # connected: gc listed the prefix
        assert all(fs.s3._endpoint.http_session._sessions is None for fs in made)  # closed
    finally:
        gc.enable()
