"""Every "is the source unchanged" check asks the store, never a listing cached earlier
in the same process (s3fs answers ``info`` from a listing an application made with
``ls`` on the same filesystem instance). An S3 loader ``open_loader`` makes shares
ptestore's own filesystem for its options (:mod:`ptestore.storage.filesystems`), never
the application's from fsspec's instance cache; a loader handed the application's
filesystem asks the store all the same."""

from __future__ import annotations

from typing import Any

import fsspec
import pytest

from ptestore.errors import StorageError
from ptestore.storage.loaders import FsspecLoader, open_loader
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3


def _options(s3_server: S3TestServer) -> dict[str, Any]:
    """The server's options with botocore's retries off, as the loader builds them."""
    retries = {"total_max_attempts": 1, "mode": "standard"}
    return {**s3_server.storage_options, "config_kwargs": {"retries": retries}}


def _listed(s3_server: S3TestServer) -> tuple[str, str, str]:
    """A bucket with one object, listed by the application's own filesystem."""
    bucket = s3_server.new_bucket()
    etag = s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=b"a" * 100)["ETag"]
    fs = fsspec.filesystem("s3", **_options(s3_server))
    assert [e["name"] for e in fs.ls(bucket, detail=True)] == [f"{bucket}/m.pte"]
    return bucket, f"s3://{bucket}/m.pte", etag


def test_a_listed_source_replaced_before_the_check_is_caught(s3_server: S3TestServer) -> None:
    bucket, url, etag = _listed(s3_server)
    loader = open_loader(url, **_options(s3_server))
    assert isinstance(loader, FsspecLoader) and loader.etag == etag
    app = fsspec.filesystem("s3", **_options(s3_server))  # the one that listed
    assert loader.fs is not app and open_loader(url, **_options(s3_server)).fs is loader.fs
    assert (app.retries, loader.fs.retries) == (5, 1)  # the application's retries its own
    handed = FsspecLoader(app, f"{bucket}/m.pte", url)  # a loader on the listed filesystem
    new = s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=b"b" * 100)["ETag"]
    for each in (loader, handed):
        with pytest.raises(StorageError) as info:
            each.check_unchanged()
        assert str(info.value) == (
            f"{url}: replaced while being read (size 100 -> 100, etag {etag} -> {new}); its "
            "content may be a mix of two versions"
        )


def test_a_listed_source_replaced_before_opening_is_read_as_it_is_now(
    s3_server: S3TestServer,
) -> None:
    bucket, url, _ = _listed(s3_server)
    new = s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=b"b" * 120)["ETag"]
    loader = open_loader(url, **_options(s3_server))
    assert isinstance(loader, FsspecLoader)
    assert (loader.etag, loader.size()) == (new, 120)
    assert loader.load(0, 120) == b"b" * 120
    loader.check_unchanged()
