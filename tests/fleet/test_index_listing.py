"""The index store's listings and removals (:mod:`ptestore.fleet.index_listing`) go
through one filesystem per option set (the process's shared one, bounded: made on the
first listing): before, each listing made an s3fs filesystem of its own, with an S3
client, an aiohttp session and, on a server that keeps connections alive (SeaweedFS),
an open socket, none of them closed until the garbage collector's next pass found the
filesystem (about 0.1 s more per listing, most of it the client). A listing still
sees what is stored now, never a listing cached earlier. On moto and SeaweedFS; the
clients counted by the aiobotocore session the storage options pass
(``creating-client-class``), the open sessions by the collector."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from ptestore.fleet.index_store import IndexStore
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3

LISTINGS = 10


def _counting_session() -> tuple[Any, list[str]]:
    """An aiobotocore session and the S3 clients made from it since (one entry each)."""
    import aiobotocore.session

    made: list[str] = []
    session = aiobotocore.session.AioSession()
    session.register("creating-client-class.s3", lambda **_: made.append("s3"))
    return session, made


def _open_sessions() -> int:
    """The aiohttp sessions alive and not closed in this process (the clients' pools)."""
    import aiohttp

    return sum(1 for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed)


def _store(s3_server: S3TestServer, session: Any) -> tuple[IndexStore, str, str]:
    """``(store, bucket, directory URL)``: an index store beside a directory of two
    objects."""
    bucket = s3_server.new_bucket()
    for key in ("fleet/d/a.json", "fleet/d/b.json"):
        s3_server.client().put_object(Bucket=bucket, Key=key, Body=b"{}")
    options = {**s3_server.storage_options, "session": session}
    store = IndexStore(f"s3://{bucket}/fleet/ptestore-index.json", options)
    return store, bucket, f"s3://{bucket}/fleet/d"


def test_listings_of_one_store_make_one_client(s3_server: S3TestServer) -> None:
    """10 listings of one store: one S3 client made (was 10), and no aiohttp session
    more left open than that one (was 10 until a collection, with the collector off as
    a busy process may leave it between passes; fewer when making it dropped, and
    closed, another test's from the bounded cache)."""
    session, made = _counting_session()
    store, _, directory = _store(s3_server, session)
    gc.collect()
    gc.disable()
    try:
        open_before = _open_sessions()
        for _ in range(LISTINGS):
            assert store.list_names(directory) == ["a.json", "b.json"]
        assert len(made) == 1 and _open_sessions() - open_before <= 1
    finally:
        gc.enable()


def test_a_listing_sees_what_is_stored_now(s3_server: S3TestServer) -> None:
    """The store's one filesystem keeps no listing between two: an object put or removed
    since the last listing is seen by the next, with or without a prefix; its removal of
    a tree removes it."""
    session, made = _counting_session()
    store, bucket, directory = _store(s3_server, session)
    assert store.list_names(directory) == ["a.json", "b.json"]
    assert store.list_names(directory, "b") == ["b.json"]
    s3_server.client().put_object(Bucket=bucket, Key="fleet/d/b2.json", Body=b"{}")
    assert store.list_names(directory) == ["a.json", "b.json", "b2.json"]
    assert store.list_names(directory, "b") == ["b.json", "b2.json"]
    s3_server.client().delete_object(Bucket=bucket, Key="fleet/d/a.json")
    assert store.list_names(directory) == ["b.json", "b2.json"]
    assert store.list_names(f"s3://{bucket}/fleet") == ["d"]
    store.remove_tree(directory)
    left = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="fleet/d/")
    assert not left.get("Contents")
    assert len(made) == 1
