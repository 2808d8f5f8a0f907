"""One retry layer for gc and a fleet run's re-use check on S3: every request of
``collect_orphans`` (the listing, the server's clock, an object's ``HEAD``, its
conditional delete) and the listing of the shared ``.ptd`` objects before a run
(``hold_reused``) is retried by ptestore's :class:`~ptestore._retry.RetryPolicy` of the
``retry_*`` storage options alone: ``retry_attempts=3`` is 3 requests, never s3fs's 5
times botocore's 5, and a failure is a ``StorageError`` naming the URL and the request.
On moto and SeaweedFS, faults injected by a botocore hook on the session the storage
options pass (every client made from it has the hook); a dead endpoint is a port
nothing listens on."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.fixtures import get_fixture
from support.s3job import s3_options_toml
from writers.s3_faults import Fault

from ptestore.coordinator.targets import target_identity
from ptestore.errors import StorageError
from ptestore.fleet import load_job, plan_job
from ptestore.fleet.index import publish_entries
from ptestore.fleet.orphans import collect_orphans
from ptestore.fleet.reuse import hold_reused
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer

from .retrykit import FAST, dead_endpoint, faulty_session, retried

pytestmark = pytest.mark.s3

#: An orphan gc removes: a shared object by its content address that no index names.
ORPHAN = "fleet/_shared/sha256-tree/" + "ab" * 32 + ".ptd"

#: gc's own requests, by the URL botocore sends (the index reads go through the
#: loader, whose one retry layer tests/storage/test_loaders.py pins).
GC_REQUESTS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "listing": ("ListObjectsV2", lambda url: "prefix=fleet%2F&delimiter=&" in url),
    "clock": ("ListObjectsV2", lambda url: "prefix=fleet&max-keys=1&" in url),
    "head": ("HeadObject", lambda url: urlsplit(url).path.endswith("/" + ORPHAN)),
    "delete": ("DeleteObject", lambda url: urlsplit(url).path.endswith("/" + ORPHAN)),
}
#: How a failure of each of gc's requests is reported: raised, or the orphan's action.
RAISED = {"listing", "clock"}
CHANGED = "skipped: changed since listed"


def _store(s3_server: S3TestServer) -> tuple[str, str]:
    """``(bucket, root)``: an index at ``root`` and one orphan under it."""
    bucket = s3_server.new_bucket()
    root = f"s3://{bucket}/fleet"
    entry = synthetic_entry("m", "d", root=root)
    publish_entries(f"{root}/ptestore-index.json", [entry], s3_server.storage_options)
    s3_server.client().put_object(Bucket=bucket, Key=ORPHAN, Body=b"orphan")
    return bucket, root


def _stored(s3_server: S3TestServer, bucket: str, key: str) -> bool:
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=key)
    return any(o["Key"] == key for o in listed.get("Contents", []))


@pytest.mark.parametrize("kind", ["reset", "503"])
@pytest.mark.parametrize("request_", sorted(GC_REQUESTS))
def test_a_gc_request_that_keeps_failing_is_made_as_often_as_the_policy_says(
    s3_server: S3TestServer, request_: str, kind: str
) -> None:
    """``retry_attempts=3``: 3 requests (was 25: s3fs's 5 times botocore's 5, the
    option ignored), then a StorageError naming the URL and the request: raised for
    the listing and the clock, the orphan's ``failed:`` action for its HEAD and delete
    (nothing removed)."""
    bucket, root = _store(s3_server)
    operation, only = GC_REQUESTS[request_]
    fault = Fault(operation, kind, times=-1)
    options = {
        **s3_server.storage_options,
        **FAST,
        "session": faulty_session(operation, fault, only),
    }
    where = f"{root}/" if request_ in RAISED else f"s3://{bucket}/{ORPHAN}"
    failed = rf"{re.escape(where)}: {operation} failed: "
    if kind == "503":
        failed += r"SlowDown \(HTTP 503\): injected 503$"
    if request_ in RAISED:
        with pytest.raises(StorageError, match=f"^{failed}"):
            collect_orphans(root, grace=0, **options)
    else:
        [entry] = collect_orphans(root, grace=0, **options)
        assert entry.location == where
        assert re.match(f"^failed: {failed}", entry.action), entry.action
    assert fault.calls == 3
    assert _stored(s3_server, bucket, ORPHAN)


@pytest.mark.parametrize("request_", sorted(GC_REQUESTS))
def test_a_gc_request_that_fails_twice_is_retried_by_the_policy(
    s3_server: S3TestServer, request_: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two 500s, then the answer: the policy retried (its records on
    ``ptestore.retry``), not botocore, and gc goes on as without them: the orphan is
    removed by its conditional delete."""
    bucket, root = _store(s3_server)
    operation, only = GC_REQUESTS[request_]
    fault = Fault(operation, "500", times=2)
    options = {
        **s3_server.storage_options,
        **FAST,
        "session": faulty_session(operation, fault, only),
    }
    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        [entry] = collect_orphans(root, grace=0, **options)
    assert (entry.location, entry.action) == (f"s3://{bucket}/{ORPHAN}", "removed")
    assert (fault.calls, fault.injected) == (3, 2)
    where = f"{root}/" if request_ in RAISED else f"s3://{bucket}/{ORPHAN}"
    assert retried(caplog, f"{where}: {operation}") == [
        f"{where}: {operation}: attempt {n} of 3 failed (InternalError (HTTP 500): injected "
        "500); retrying in 0.00s"
        for n in (1, 2)
    ]
    assert not _stored(s3_server, bucket, ORPHAN)


def test_a_gc_whose_endpoint_is_dead_stops_after_the_policys_attempts(
    s3_server: S3TestServer,
) -> None:
    bucket, root = _store(s3_server)
    endpoint = dead_endpoint()
    counted = Fault("ListObjectsV2", "500", times=0)  # counts, injects nothing
    session = faulty_session("ListObjectsV2", counted, lambda url: True)
    options = {**s3_server.storage_options, **FAST, "endpoint_url": endpoint, "session": session}
    with pytest.raises(StorageError) as info:
        collect_orphans(root, grace=0, **options)
    assert type(info.value) is StorageError
    assert str(info.value).startswith(
        f"{root}/: ListObjectsV2 failed: Could not connect to the endpoint URL: "
        f'"{endpoint}/{bucket}?list-type=2&prefix=fleet%2F'
    )
    assert counted.calls == 3


# ------------------------------------------------------------ a run's re-use check

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nscale = 2.0\n'
#: The listing of the shared objects a run's pairs may find stored.
SHARED_LISTING = "prefix=out%2F_shared%2Fsha256-tree%2F&"


def _planned(s3_server: S3TestServer, tmp_path: Path) -> tuple[Any, str, str]:
    """``(plan, bucket, shared object)``: a job on S3 whose two pairs run and share
    their ``.ptd``, planned, and a shared object stored that no index names."""
    assert EXT.ptd_path is not None
    bucket, opts = s3_server.new_bucket(), s3_server.storage_options
    path = tmp_path / "job.toml"
    path.write_text(
        f'destination = "s3://{bucket}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'{s3_options_toml(opts)}[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\n'
        f'ptd = "{EXT.ptd_path}"\n{TWO}'
    )
    key = "out/_shared/sha256-tree/" + "cd" * 32 + ".ptd"
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=b"orphan")
    plan = plan_job(load_job(path))
    assert [(p.action, bool(p.task and p.task.shared_root)) for p in plan.pairs] == [
        ("run", True),
        ("run", True),
    ]
    return plan, bucket, f"s3://{bucket}/{key}"


def _with_options(plan: Any, **options: Any) -> None:
    """``plan``'s job with ``options`` over its storage options."""
    job = plan.job
    plan.job = dataclasses.replace(job, storage_options={**job.storage_options, **options})


def _unlisted(plan: Any, bucket: str, caplog: pytest.LogCaptureFixture) -> str:
    """The warning of a re-use check that could not list the shared objects (each
    pair then holds what it finds)."""
    with caplog.at_level(logging.WARNING, logger="ptestore.fleet.reuse"):
        assert hold_reused(plan) == 0
    assert [p.task.hold_shared for p in plan.pairs] == [None, None]
    [warned] = [
        r.getMessage()
        for r in caplog.records
        if r.name == "ptestore.fleet.reuse" and "cannot list the shared objects" in r.getMessage()
    ]
    prefix = (
        f"{plan.job.path}: cannot list the shared objects, each one found is held: "
        f"s3://{bucket}/out/_shared/sha256-tree/: ListObjectsV2 failed: "
    )
    assert warned.startswith(prefix), warned
    return warned[len(prefix) :]


@pytest.mark.parametrize("kind", ["reset", "503"])
def test_the_reuse_listing_that_keeps_failing_is_made_as_often_as_the_policy_says(
    s3_server: S3TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    plan, bucket, _ = _planned(s3_server, tmp_path)
    fault = Fault("ListObjectsV2", kind, times=-1)
    only = faulty_session("ListObjectsV2", fault, lambda url: SHARED_LISTING in url)
    _with_options(plan, **FAST, session=only)
    detail = _unlisted(plan, bucket, caplog)
    if kind == "503":
        assert detail == "SlowDown (HTTP 503): injected 503"
    assert fault.calls == 3


def test_the_reuse_listing_that_fails_twice_is_retried_by_the_policy(
    s3_server: S3TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan, bucket, stored = _planned(s3_server, tmp_path)
    fault = Fault("ListObjectsV2", "500", times=2)
    _with_options(
        plan,
        **FAST,
        session=faulty_session("ListObjectsV2", fault, lambda url: SHARED_LISTING in url),
    )
    with caplog.at_level(logging.WARNING):
        assert hold_reused(plan) == 0
    unnamed = frozenset({target_identity(stored)})
    assert [p.task.hold_shared for p in plan.pairs] == [unnamed, unnamed]
    assert (fault.calls, fault.injected) == (3, 2)
    what = f"s3://{bucket}/out/_shared/sha256-tree/: ListObjectsV2"
    assert len(retried(caplog, what)) == 2


def test_the_reuse_listing_of_a_dead_endpoint_stops_after_the_policys_attempts(
    s3_server: S3TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan, bucket, _ = _planned(s3_server, tmp_path)
    endpoint = dead_endpoint()
    counted = Fault("ListObjectsV2", "500", times=0)  # counts, injects nothing
    session = faulty_session("ListObjectsV2", counted, lambda url: SHARED_LISTING in url)
    _with_options(plan, **FAST, endpoint_url=endpoint, session=session)
    detail = _unlisted(plan, bucket, caplog)
    assert detail.startswith(
        f'Could not connect to the endpoint URL: "{endpoint}/{bucket}?list-type=2&{SHARED_LISTING}'
    ), detail
    assert counted.calls == 3


# ------------------------------------------------- a delete whose answer was lost


def _fault_on_delete(s3_server: S3TestServer, fault: Any) -> dict[str, Any]:
    """The storage options of a gc whose orphan's deletes go through ``fault``."""
    only = GC_REQUESTS["delete"][1]
    return {
        **s3_server.storage_options,
        **FAST,
        "session": faulty_session("DeleteObject", fault, only),
    }


def test_a_delete_whose_answer_was_lost_is_counted_removed(s3_server: S3TestServer) -> None:
    """The first delete reaches the service and its answer is lost (a read timeout):
    the retry finds the object gone (404, or SeaweedFS's 412 for a key that is not
    there), gone by gc's own attempt: ``removed``. Before, ``skipped: already gone``
    (moto) or ``skipped: changed since listed`` (SeaweedFS), and a summary that counted
    nothing removed."""
    bucket, root = _store(s3_server)
    fault = Fault("DeleteObject", "lost", times=1)
    [entry] = collect_orphans(root, grace=0, **_fault_on_delete(s3_server, fault))
    assert (entry.location, entry.action) == (f"s3://{bucket}/{ORPHAN}", "removed")
    assert (fault.calls, fault.injected) == (2, 1)
    assert not _stored(s3_server, bucket, ORPHAN)


def test_a_lost_answer_then_an_object_stored_since_is_kept(s3_server: S3TestServer) -> None:
    """The first delete's answer is lost (a closed connection: it may or may not have
    reached the service, here it did not) and a run stores other bytes at the key
    before the retry, which is refused (``If-Match``: 412): the object there is not
    the one listed, ``skipped: changed since listed``, kept; a lost answer alone never
    makes a refusal a removal."""
    bucket, root = _store(s3_server)
    client = s3_server.client()
    reset = Fault("DeleteObject", "reset", times=1)

    def store_then_reset(request: Any, **kwargs: Any) -> Any:
        if reset.remaining:
            client.put_object(Bucket=bucket, Key=ORPHAN, Body=b"a run's new bytes")
        return reset(request, **kwargs)

    [entry] = collect_orphans(root, grace=0, **_fault_on_delete(s3_server, store_then_reset))
    assert (entry.location, entry.action) == (f"s3://{bucket}/{ORPHAN}", CHANGED)
    assert (reset.calls, reset.injected) == (2, 1)
    body = client.get_object(Bucket=bucket, Key=ORPHAN)["Body"].read()
    assert body == b"a run's new bytes"


@pytest.mark.parametrize("kind", ["503", "403"])
def test_an_object_removed_by_another_after_a_refused_delete_is_already_gone(
    s3_server: S3TestServer, kind: str
) -> None:
    """The first delete is turned away before anything is done (a 503 is retried, a 403
    ends the call) and another gc removes the object meanwhile: gc's own attempt
    removed nothing. After the 503 the retry finds it gone: ``skipped: already gone``
    (was ``skipped: changed since listed`` on SeaweedFS, which answers 412 for a key
    that is not there: the object is looked at again after a 412)."""
    bucket, root = _store(s3_server)
    client = s3_server.client()
    refused = Fault("DeleteObject", kind, times=1)

    def remove_then_refuse(request: Any, **kwargs: Any) -> Any:
        if refused.remaining:
            client.delete_object(Bucket=bucket, Key=ORPHAN)
        return refused(request, **kwargs)

    [entry] = collect_orphans(root, grace=0, **_fault_on_delete(s3_server, remove_then_refuse))
    if kind == "503":
        assert entry.action == "skipped: already gone"
        assert refused.calls == 2
    else:
        where = f"s3://{bucket}/{ORPHAN}"
        assert entry.action == (
            f"failed: {where}: DeleteObject failed: AccessDenied (HTTP 403): injected 403"
        )
        assert refused.calls == 1
