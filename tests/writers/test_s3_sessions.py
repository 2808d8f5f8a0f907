"""S3 writers share their process's aiobotocore session (the costly part of a client)
and nothing that belongs to one writer: credentials, hooks, the client itself; a
forked process makes sessions of its own."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import uuid
from typing import Any

import pytest

from ptestore.errors import PteStoreError
from ptestore.storage import filesystems
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, open_writer
from ptestore.writers.s3 import config

pytestmark = pytest.mark.s3


@pytest.fixture
def url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/models/{uuid.uuid4().hex}.pte"


def _open(url: str, **options: Any) -> S3Writer:
    w = open_writer(url, **options)
    assert isinstance(w, S3Writer)
    return w


def _access_key(w: S3Writer) -> str:
    key: str = w.client._request_signer._credentials.access_key
    return key


def test_writers_with_other_credentials_share_the_session_not_the_credentials(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    good = _open(f"s3://{s3_bucket}/creds/good", **s3_server.storage_options)
    bad_options = {**s3_server.storage_options, "key": "not-the-key", "secret": "nor-this"}
    bad = _open(f"s3://{s3_bucket}/creds/bad", **bad_options, retry_attempts=1)
    assert good.conn.fs.session is bad.conn.fs.session  # the cached, costly part
    assert good.client is not bad.client
    assert _access_key(good) == s3_server.storage_options["key"]
    assert _access_key(bad) == "not-the-key"
    good.write(b"good", 0)
    good.publish()
    assert s3_client.get_object(Bucket=s3_bucket, Key="creds/good")["Body"].read() == b"good"
    if s3_server.name == "seaweedfs":  # moto takes any credentials
        bad.write(b"bad", 0)
        with pytest.raises(PteStoreError, match=r"s3://.*/creds/bad"):
            bad.publish()
        # ... and a writer opened after it with the good credentials still has them.
        again = _open(f"s3://{s3_bucket}/creds/again", **s3_server.storage_options)
        again.write(b"again", 0)
        again.publish()
    bad.discard()


def test_a_hook_on_one_writer_with_a_shared_session_reaches_no_other(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    a = _open(f"s3://{s3_bucket}/hooks/a", **s3_server.storage_options)
    b = _open(f"s3://{s3_bucket}/hooks/b", **s3_server.storage_options)
    assert a.conn.fs.session is b.conn.fs.session
    seen: list[str] = []
    a.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: seen.append(request.url) and None
    )
    b.write(b"b", 0)
    b.publish()
    assert seen == []
    a.write(b"a", 0)
    a.publish()
    assert len(seen) == 1 and seen[0].endswith("/hooks/a")


def test_the_session_follows_the_environment(
    s3_server: S3TestServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    first = config.session_key({})
    assert config.shared_session({}) is config.shared_session({})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second-key")
    assert config.session_key({}) != first
    assert config.session_key({"profile": "p"}) != config.session_key({})
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    w = _open(url)
    assert _access_key(w) == "second-key"
    w.discard()


def _publish_in_child(url: str, options: dict[str, Any], parent_session: int) -> tuple[int, bool]:
    w = _open(url, **options)
    w.write(b"from a forked worker", 0)
    w.publish()
    return os.getpid(), id(w.conn.fs.session) == parent_session


def test_a_forked_worker_makes_its_own_session_and_publishes(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    parent = _open(f"s3://{s3_bucket}/fork/parent", **s3_server.storage_options)
    parent.write(b"parent", 0)
    parent.publish()  # the parent's session and its client were used
    key = f"fork/{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        fut = pool.submit(
            _publish_in_child,
            f"s3://{s3_bucket}/{key}",
            s3_server.storage_options,
            id(parent.conn.fs.session),
        )
        pid, inherited = fut.result(timeout=60)
    assert pid != os.getpid()
    assert not inherited
    body = s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    assert body == b"from a forked worker"
    # The parent's writer works on after the fork.
    again = _open(f"s3://{s3_bucket}/fork/again", **s3_server.storage_options)
    assert again.conn.fs.session is parent.conn.fs.session
    again.write(b"again", 0)
    again.publish()


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystems, "_sessions", type(filesystems._sessions)())
    made = [
        config.shared_session({"profile": f"p{i}"}) for i in range(config.SESSION_CACHE_SIZE + 2)
    ]
    assert len(filesystems._sessions) == config.SESSION_CACHE_SIZE
    assert config.shared_session({"profile": "p0"}) is not made[0]  # dropped, made again
    last = f"p{config.SESSION_CACHE_SIZE + 1}"
    assert config.shared_session({"profile": last}) is made[-1]
