"""Every "is the source unchanged" check asks the store, never a listing cached earlier
in the same process (fsspec shares filesystem instances per option set, and s3fs
answers ``info`` from a listing an application made with ``ls``). The loader's options
turn botocore's retries off (one retry layer), so it shares the instance of an
application that passes the same ``config_kwargs`` (:func:`_options`)."""

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
    assert loader.fs is fsspec.filesystem("s3", **_options(s3_server))  # shared
    # an application's filesystem without them is its own (s3fs's retries kept): the
    # loader opened with the plain options still builds the one above
    assert open_loader(url, **s3_server.storage_options).fs is loader.fs
    plain = fsspec.filesystem("s3", **s3_server.storage_options)
    assert plain is not loader.fs and (plain.retries, loader.fs.retries) == (5, 1)
    new = s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=b"b" * 100)["ETag"]
    with pytest.raises(StorageError) as info:
        loader.check_unchanged()
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
