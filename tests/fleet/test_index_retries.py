"""One retry layer for the fleet's own fsspec calls beside gc's and the re-use check's
(tests/fleet/test_gc_retries.py): the index store's listings (a version 3 index's model
directories, the shard directories beside a version 2 index) and its removal of a tree
(a migration's copy it does not keep), and the preflight's deletion of its marker. Each
request is retried by ptestore's :class:`~ptestore._retry.RetryPolicy` of the
``retry_*`` storage options alone: ``retry_attempts=3`` is 3 requests, never s3fs's or
botocore's own attempts (the options were dropped, and their loops left on), and a
failure is a ``StorageError`` naming the URL and the request. On moto and SeaweedFS,
faults injected by a botocore hook on the session the storage options pass."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from support.fixtures import get_fixture
from support.s3job import s3_options_toml
from writers.s3_faults import Fault

from ptestore.errors import StorageError
from ptestore.fleet import load_job
from ptestore.fleet.index import load_index, open_index, publish_entries
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.job import JobError
from ptestore.fleet.preflight import MARKER_PREFIX, preflight
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer

from .retrykit import FAST, dead_endpoint, faulty_session, retried

pytestmark = pytest.mark.s3

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"


def _index(s3_server: S3TestServer, version: int = 3) -> tuple[str, str]:
    """``(bucket, index URL)``: an index of two models under ``s3://bucket/fleet``."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    root = f"s3://{bucket}/fleet"
    entries = [synthetic_entry(m, "d", root=root) for m in ("m1", "m2")]
    publish_entries(url, entries, s3_server.storage_options, version=version)
    return bucket, url


def _models_listing(url: str) -> bool:
    """Whether botocore's ``url`` lists a version 3 index's model directories."""
    return re.search(r"prefix=fleet/ptestore-index\.v3-[0-9a-f]+/m/&", unquote(url)) is not None


def _models_dir(url: str, s3_server: S3TestServer) -> str:
    _, sharded, _ = open_index(url, s3_server.storage_options)
    assert sharded is not None
    return f"{sharded.directory}/m/"


@pytest.mark.parametrize("kind", ["reset", "503"])
def test_the_model_listing_that_keeps_failing_is_made_as_often_as_the_policy_says(
    s3_server: S3TestServer, kind: str
) -> None:
    """Reading a version 3 index whole lists its model directories: 3 requests with
    ``retry_attempts=3``, then a StorageError naming the directory and the request."""
    _, url = _index(s3_server)
    where = _models_dir(url, s3_server)
    fault = Fault("ListObjectsV2", kind, times=-1)
    session = faulty_session("ListObjectsV2", fault, _models_listing)
    with pytest.raises(StorageError) as info:
        load_index(url, **s3_server.storage_options, **FAST, session=session)
    assert str(info.value).startswith(f"{where}: ListObjectsV2 failed: "), str(info.value)
    if kind == "503":
        assert (
            str(info.value) == f"{where}: ListObjectsV2 failed: SlowDown (HTTP 503): injected 503"
        )
    assert fault.calls == 3


def test_the_model_listing_that_fails_twice_is_retried_by_the_policy(
    s3_server: S3TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _index(s3_server)
    where = _models_dir(url, s3_server)
    fault = Fault("ListObjectsV2", "500", times=2)
    session = faulty_session("ListObjectsV2", fault, _models_listing)
    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        index = load_index(url, **s3_server.storage_options, **FAST, session=session)
    assert [e["model"] for e in index["entries"]] == ["m1", "m2"]
    assert (fault.calls, fault.injected) == (3, 2)
    assert retried(caplog, f"{where}: ListObjectsV2") == [
        f"{where}: ListObjectsV2: attempt {n} of 3 failed (InternalError (HTTP 500): injected "
        "500); retrying in 0.00s"
        for n in (1, 2)
    ]


def test_the_model_listing_of_a_dead_endpoint_stops_after_the_policys_attempts(
    s3_server: S3TestServer,
) -> None:
    _, url = _index(s3_server)
    where = _models_dir(url, s3_server)
    endpoint = dead_endpoint()
    counted = Fault("ListObjectsV2", "500", times=0)  # counts, injects nothing
    session = faulty_session("ListObjectsV2", counted, lambda u: True)
    options = {**s3_server.storage_options, **FAST, "endpoint_url": endpoint, "session": session}
    store = IndexStore(url, options)
    with pytest.raises(StorageError) as info:
        store.list_names(where)
    assert str(info.value).startswith(
        f"{where}: ListObjectsV2 failed: Could not connect to the endpoint URL: "
    ), str(info.value)
    assert counted.calls == 3


def test_the_listing_beside_a_version_2_index_is_retried_by_the_policy(
    s3_server: S3TestServer,
) -> None:
    """Opening a version 2 index lists the shard directories beside it (one a version 3
    root named makes it not the whole index): failing every time, 3 requests, and the
    index is read as it is (the listing is a check, left out when it fails); failing
    twice, retried and made."""

    def beside(url: str) -> bool:
        return "prefix=fleet/ptestore-index.v3-&" in unquote(url)

    _, url = _index(s3_server, version=2)
    for times, injected in ((-1, 3), (2, 2)):
        fault = Fault("ListObjectsV2", "503", times=times)
        session = faulty_session("ListObjectsV2", fault, beside)
        root, sharded, _ = open_index(
            url, {**s3_server.storage_options, **FAST, "session": session}
        )
        assert (root["version"], sharded) == (2, None)
        assert (fault.calls, fault.injected) == (3, injected)


def _tree(s3_server: S3TestServer) -> tuple[str, str, list[str]]:
    """``(bucket, directory URL, keys)``: three objects under a directory."""
    bucket = s3_server.new_bucket()
    keys = [f"fleet/ptestore-index.v3-dead/m/x~0/t{i}.json" for i in range(3)]
    for key in keys:
        s3_server.client().put_object(Bucket=bucket, Key=key, Body=b"{}")
    return bucket, f"s3://{bucket}/fleet/ptestore-index.v3-dead", keys


def _left(s3_server: S3TestServer, bucket: str) -> list[str]:
    listed = s3_server.client().list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in listed.get("Contents", [])]


@pytest.mark.parametrize(("times", "kept"), [(-1, True), (2, False)])
def test_the_removal_of_a_tree_is_retried_by_the_policy(
    s3_server: S3TestServer, times: int, kept: bool
) -> None:
    """The index store's removal of a directory (a migration's copy another migration
    beat) deletes its objects in one ``DeleteObjects``: failing every time, 3 requests
    and the objects left (best effort, as before); failing twice, retried and gone."""
    bucket, directory, keys = _tree(s3_server)
    fault = Fault("DeleteObjects", "503", times=times)
    session = faulty_session("DeleteObjects", fault, lambda url: True)
    store = IndexStore(
        f"s3://{bucket}/fleet/ptestore-index.json",
        {**s3_server.storage_options, **FAST, "session": session},
    )
    store.remove_tree(directory)
    assert (fault.calls, fault.injected) == (3, 3 if kept else 2)
    assert _left(s3_server, bucket) == (keys if kept else [])


# -------------------------------------------------------------- the preflight's marker


def _job(s3_server: S3TestServer, tmp_path: Path, **options: Any) -> tuple[Any, str]:
    """``(job, bucket)``: a job on S3 with ``options`` over its storage options."""
    bucket = s3_server.new_bucket()
    path = tmp_path / "job.toml"
    path.write_text(
        f'destination = "s3://{bucket}/f/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'{s3_options_toml(s3_server.storage_options)}[[models]]\nname = "mlp"\n'
        f'source = "{MLP.pte_path}"\n[devices.a]\nsoc = "x"\n'
    )
    job = load_job(path)
    return dataclasses.replace(job, storage_options={**job.storage_options, **options}), bucket


def _marker(url: str) -> bool:
    return MARKER_PREFIX in url


@pytest.mark.parametrize("kind", ["reset", "503"])
def test_the_marker_deletion_that_keeps_failing_is_made_as_often_as_the_policy_says(
    s3_server: S3TestServer, tmp_path: Path, kind: str
) -> None:
    """The preflight's marker cannot be deleted: 3 ``DeleteObject`` requests with
    ``retry_attempts=3``, then the job-wide error naming the destination, the marker
    and the request (was s3fs's and botocore's attempts, the option dropped)."""
    fault = Fault("DeleteObject", kind, times=-1)
    job, bucket = _job(
        s3_server, tmp_path, **FAST, session=faulty_session("DeleteObject", fault, _marker)
    )
    with pytest.raises(JobError) as info:
        preflight(job, write=True)
    message = str(info.value)
    lead = (
        f"{job.path}: destination s3://{bucket}/f/ is not writable (a marker could not be "
        f"created and deleted): s3://{bucket}/f/{MARKER_PREFIX}"
    )
    assert message.startswith(lead), message
    marker, detail = message[len(lead) :].split(": ", 1)
    assert re.fullmatch("[0-9a-f]{32}", marker), marker
    assert detail.startswith("DeleteObject failed: "), detail
    if kind == "503":
        assert detail == "DeleteObject failed: SlowDown (HTTP 503): injected 503"
    assert fault.calls == 3


def test_the_marker_deletion_that_fails_twice_is_retried_by_the_policy(
    s3_server: S3TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fault = Fault("DeleteObject", "500", times=2)
    job, bucket = _job(
        s3_server, tmp_path, **FAST, session=faulty_session("DeleteObject", fault, _marker)
    )
    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        preflight(job, write=True)
    assert (fault.calls, fault.injected) == (3, 2)
    assert _left(s3_server, bucket) == []
    records = [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"]
    assert len(records) == 2 and all(": DeleteObject: attempt " in r for r in records), records
