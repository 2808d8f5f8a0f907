"""S3 faults: every call site fails in turn; runs end in success or a clean failure."""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from typing import Any

import pytest

from ptestore.errors import (
    AlreadyExists,
    ObjectNotFound,
    PermissionDenied,
    PreconditionFailed,
    PublishUncertain,
    StorageError,
)
from ptestore.gc import collect_s3
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, WriterState, open_writer
from ptestore.writers.s3 import MIN_PART_SIZE
from ptestore.writers.s3.strays import SLACK

from .s3_faults import Fault, error_response, sequence

pytestmark = pytest.mark.s3

PART = MIN_PART_SIZE  # S3's smallest part; multipart payloads span >= 3 parts
# Fast retries; a client of its own (s3fs shares clients): injected faults stay local.
FAST = {"retry_initial": 0.001, "retry_max": 0.01, "skip_instance_cache": True}
TRANSIENT = ["500", "503", "reset"]


def data_of(size: int) -> bytes:
    return random.Random(size).randbytes(size)


class Env:
    def __init__(self, server: S3TestServer, bucket: str, client: Any) -> None:
        self.server, self.bucket, self.client = server, bucket, client
        self.part = max(PART, server.min_part_size)
        self.key = f"m/{uuid.uuid4().hex}.pte"
        self.url = f"s3://{bucket}/{self.key}"

    def writer(self, **kw: Any) -> S3Writer:
        opts: dict[str, Any] = {**self.server.storage_options, "part_size": self.part, **FAST, **kw}
        w = open_writer(self.url, **opts)
        assert isinstance(w, S3Writer)
        return w

    def get(self) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body

    def uploads(self) -> list[str]:
        resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.key)
        return [u["UploadId"] for u in resp.get("Uploads", [])]


@pytest.fixture
def env(s3_server: S3TestServer, s3_bucket: str, s3_client: Any) -> Env:
    return Env(s3_server, s3_bucket, s3_client)


def _write_and_publish(w: S3Writer, data: bytes) -> None:
    w.write(data, 0)  # Create/UploadPart faults surface here, Complete ones at publish
    w.publish()


MULTIPART_OPS = ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "HeadObject"]
SINGLE_OPS = ["PutObject", "HeadObject"]


@pytest.mark.parametrize("kind", TRANSIENT)
@pytest.mark.parametrize("op", MULTIPART_OPS)
def test_multipart_transient_fault_is_retried(env: Env, op: str, kind: str) -> None:
    data = data_of(3 * env.part + 100)
    w = env.writer()
    fault = Fault(op, kind).install(w.client)
    w.write(data[env.part :], env.part)
    w.write(data[: env.part], 0)
    result = w.publish("create")
    assert fault.injected == 1
    assert fault.calls >= 2
    assert env.get() == data
    assert result.checksum is not None
    assert env.uploads() == []


@pytest.mark.parametrize("kind", TRANSIENT)
@pytest.mark.parametrize("op", SINGLE_OPS)
def test_single_put_transient_fault_is_retried(env: Env, op: str, kind: str) -> None:
    w = env.writer()
    fault = Fault(op, kind).install(w.client)
    w.write(b"small", 0)
    w.publish("create")
    assert fault.injected == 1
    assert env.get() == b"small"


@pytest.mark.parametrize("kind", TRANSIENT)
@pytest.mark.parametrize("op", ["AbortMultipartUpload", "ListParts"])
def test_discard_transient_fault_is_retried(env: Env, op: str, kind: str) -> None:
    w = env.writer()
    fault = Fault(op, kind).install(w.client)
    w.write(data_of(3 * env.part), 0)
    assert env.uploads() != []
    w.discard()
    assert fault.injected == 1
    assert env.uploads() == []
    assert env.get() is None


@pytest.mark.parametrize("op", ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"])
def test_multipart_persistent_fault_fails_cleanly(env: Env, op: str) -> None:
    w = env.writer(retry_attempts=3)
    fault = Fault(op, "503", times=-1).install(w.client)
    with pytest.raises(StorageError, match=rf"{env.url}: {op}.* failed: SlowDown \(HTTP 503\)"):
        _write_and_publish(w, data_of(3 * env.part))
    assert fault.injected >= 3  # retry_attempts (per part for UploadPart)
    assert fault.injected % 3 == 0
    assert w.state is WriterState.DISCARDED
    assert env.get() is None
    assert env.uploads() == []


def test_put_persistent_fault_fails_cleanly(env: Env) -> None:
    """A connection closed on every attempt: the request may have been sent, so the
    outcome is uncertain (never "nothing was published"); here nothing was."""
    w = env.writer(retry_attempts=2)
    Fault("PutObject", "reset", times=-1).install(w.client)
    w.write(b"abc", 0)
    with pytest.raises(PublishUncertain) as info:
        w.publish()
    assert str(info.value) == (
        f"{env.url}: PutObject failed after its retries on a connection error "
        f"(ConnectionClosedError: Connection was closed before we received a valid response "
        f'from endpoint URL: "{env.server.endpoint_url}/{env.bucket}/{env.key}".); the '
        "request may have reached the service: the destination holds the old object or "
        "this writer's"
    )
    assert env.get() is None


@pytest.mark.parametrize("op", ["PutObject", "CompleteMultipartUpload"])
def test_connection_error_after_retries_is_publish_uncertain(env: Env, op: str) -> None:
    w = env.writer(retry_attempts=2)
    Fault(op, "reset", times=-1).install(w.client)
    w.write(b"abc" if op == "PutObject" else data_of(3 * env.part), 0)
    with pytest.raises(PublishUncertain, match=f"{op} failed after its retries on a connection"):
        w.publish()
    assert env.get() is None


def test_put_whose_every_answer_is_lost_is_reconciled(env: Env) -> None:
    """Every attempt reaches the service and times out: HEAD finds our object."""
    w = env.writer(retry_attempts=2)
    lost = Fault("PutObject", "lost", times=-1).install(w.client)
    w.write(b"tiny", 0)
    result = w.publish()
    assert lost.injected == 2
    assert result.size == 4
    assert env.get() == b"tiny"


def test_verify_head_failing_does_not_fail_a_done_publish(env: Env) -> None:
    w = env.writer(retry_attempts=2)
    Fault("HeadObject", "500", times=-1).install(w.client)
    w.write(b"abc", 0)
    result = w.publish()
    assert result.checksum is None  # could not verify, but it is published
    assert env.get() == b"abc"


def test_abort_failing_leaves_upload_for_gc(env: Env) -> None:
    w = env.writer(retry_attempts=2)
    Fault("AbortMultipartUpload", "503", times=-1).install(w.client)
    w.write(data_of(3 * env.part), 0)
    with pytest.raises(
        StorageError,
        match=r"cannot abort multipart upload \S+: AbortMultipartUpload failed: SlowDown "
        r"\(HTTP 503\): injected 503; it stays pending until `ptestore gc`",
    ):
        w.discard()
    assert len(env.uploads()) == 1
    entries = collect_s3(f"s3://{env.bucket}/m/", older_than=0, **env.server.storage_options)
    assert [e.action for e in entries] == ["removed"]
    assert env.uploads() == []


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("403", PermissionDenied, r"UploadPart 1 failed: AccessDenied \(HTTP 403\): injected 403"),
        ("404-bucket", ObjectNotFound, r"UploadPart 1 failed: NoSuchBucket \(HTTP 404\)"),
    ],
)
def test_permanent_errors_are_not_retried(env: Env, kind: str, error: type, message: str) -> None:
    w = env.writer()
    fault = Fault("UploadPart", kind, times=-1).install(w.client)
    w.write(data_of(env.part), 0)  # one complete part: uploaded in the background
    with pytest.raises(error, match=message):
        w.publish()
    assert fault.calls == 1
    assert env.uploads() == []
    assert env.get() is None


def test_missing_bucket(s3_server: S3TestServer) -> None:
    w = open_writer(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/k", **s3_server.storage_options)
    w.write(b"x", 0)
    with pytest.raises(ObjectNotFound, match=r"PutObject failed: NoSuchBucket \(HTTP 404\)"):
        w.publish()


def test_complete_200_with_error_body_is_retried(env: Env) -> None:
    w = env.writer()
    fault = Fault("CompleteMultipartUpload", "200-error").install(w.client)
    data = data_of(3 * env.part + 5)
    w.write(data, 0)
    w.publish()
    assert fault.injected == 1
    assert env.get() == data


def test_complete_200_with_error_body_persistent(env: Env) -> None:
    """An InternalError may come after the work was done: with no object of ours there,
    uncertain (never "nothing was published")."""
    w = env.writer(retry_attempts=2)
    Fault("CompleteMultipartUpload", "200-error", times=-1).install(w.client)
    w.write(data_of(3 * env.part), 0)
    with pytest.raises(PublishUncertain) as info:
        w.publish()
    assert str(info.value) == (
        f"{env.url}: CompleteMultipartUpload failed (InternalError (HTTP 500): injected "
        "200-error), but an earlier attempt's answer was lost (InternalError (HTTP 500): "
        "injected 200-error) and that attempt may have published this writer's output; there "
        "is no object there now: this writer's output may have been published and replaced "
        "or deleted since, or never published. Read the object before redoing the change (a "
        "blind retry could apply it twice)"
    )
    assert env.get() is None
    assert env.uploads() == []


@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_lost_complete_response_is_reconciled(env: Env, mode: str) -> None:
    """Complete succeeds server-side, the answer is lost, the retry meets 412 (AWS with
    If-None-Match) or NoSuchUpload (MinIO): HEAD finds our token, so it is a success."""
    w = env.writer()
    lost = Fault("CompleteMultipartUpload", "lost")
    retry_kind = "412" if mode == "create" else "404-upload"
    w.client.meta.events.register(
        "before-send.s3.CompleteMultipartUpload",
        sequence(lost, lambda req: error_response(req.url, retry_kind)),
    )
    data = data_of(3 * env.part + 1)
    w.write(data, 0)
    result = w.publish(mode)  # type: ignore[arg-type]
    assert lost.injected == 1
    assert result.size == len(data)
    assert env.get() == data
    assert env.uploads() == []


def test_lost_put_response_in_create_mode_is_reconciled(env: Env) -> None:
    w = env.writer()
    lost = Fault("PutObject", "lost")
    w.client.meta.events.register(
        "before-send.s3.PutObject", sequence(lost, lambda req: error_response(req.url, "412"))
    )
    w.write(b"tiny", 0)
    w.publish("create")
    assert env.get() == b"tiny"


def test_complete_no_such_upload_for_someone_elses_object_is_uncertain(env: Env) -> None:
    w = env.writer()
    w.client.meta.events.register(
        "before-send.s3.CompleteMultipartUpload",
        sequence(
            lambda req: error_response(req.url, "500"),
            lambda req: error_response(req.url, "404-upload"),
        ),
    )
    env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"other writer")
    w.write(data_of(3 * env.part), 0)
    with pytest.raises(PublishUncertain, match=r"upload is gone \(NoSuchUpload\) .* token"):
        w.publish()
    assert env.get() == b"other writer"
    assert env.uploads() == []


@pytest.mark.parametrize("exists", [True, False])
def test_conditional_request_conflict(env: Env, exists: bool) -> None:
    w = env.writer()
    Fault("CompleteMultipartUpload", "409").install(w.client)
    if exists:
        env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"winner")
    w.write(data_of(3 * env.part), 0)
    if exists:
        with pytest.raises(AlreadyExists, match="already exists"):
            w.publish("create")
    else:
        with pytest.raises(PreconditionFailed, match=r"ConditionalRequestConflict \(HTTP 409\)"):
            w.publish("create")
    assert env.uploads() == []


def test_lost_put_response_in_if_match_mode_is_reconciled(env: Env) -> None:
    """The conditional PutObject took effect, its answer was lost, the retry meets 412
    (the object is no longer the version expected: it is ours): a success, not a
    conflict."""
    env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"v1")
    etag = env.client.head_object(Bucket=env.bucket, Key=env.key)["ETag"]
    w = env.writer()
    lost = Fault("PutObject", "lost")
    w.client.meta.events.register(
        "before-send.s3.PutObject", sequence(lost, lambda req: error_response(req.url, "412"))
    )
    w.write(b"v2", 0)
    assert w.publish("if-match", expected=etag).size == 2
    assert lost.injected == 1
    assert env.get() == b"v2"


def test_lost_complete_response_in_if_match_mode_is_reconciled(env: Env) -> None:
    env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"v1")
    etag = env.client.head_object(Bucket=env.bucket, Key=env.key)["ETag"]
    w = env.writer()
    lost = Fault("CompleteMultipartUpload", "lost")
    w.client.meta.events.register(
        "before-send.s3.CompleteMultipartUpload",
        sequence(lost, lambda req: error_response(req.url, "412")),
    )
    data = data_of(3 * env.part + 1)
    w.write(data, 0)
    assert w.publish("if-match", expected=etag).size == len(data)
    assert env.get() == data
    assert env.uploads() == []


def test_conditional_request_conflict_in_if_match_mode_is_a_conflict(env: Env) -> None:
    """409 ConditionalRequestConflict (AWS: a concurrent conflicting write) is the one
    conflict error, naming the version found, so the caller reads again and retries."""
    env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"v1")
    etag = env.client.head_object(Bucket=env.bucket, Key=env.key)["ETag"]
    w = env.writer()
    Fault("CompleteMultipartUpload", "409").install(w.client)
    w.write(data_of(3 * env.part), 0)
    with pytest.raises(PreconditionFailed) as info:
        w.publish("if-match", expected=etag)
    assert str(info.value) == (
        f"{env.url}: publish(mode='if-match') expected version {etag}, found version {etag} "
        "(the service answered ConditionalRequestConflict: a concurrent write); nothing was "
        "published (read it again, redo the change and retry)"
    )
    assert info.value.refused_by == "storage"
    assert env.get() == b"v1"
    assert env.uploads() == []


@pytest.mark.parametrize("mode", ["overwrite", "if-match"])
def test_an_object_replaced_right_after_its_publish_is_logged_by_mode(
    env: Env, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another writer replaces the object between the PutObject and the check that
    follows it: after an overwrite a warning; after a compare-and-swap (the index's
    small objects, whose writers take turns by design) a debug line."""
    import logging

    env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"v1")
    etag = env.client.head_object(Bucket=env.bucket, Key=env.key)["ETag"]
    w = env.writer()

    def replace(**_: Any) -> None:
        env.client.put_object(Bucket=env.bucket, Key=env.key, Body=b"theirs")

    w.client.meta.events.register("after-call.s3.PutObject", replace)
    w.write(b"v2", 0)
    with caplog.at_level(logging.DEBUG, "ptestore.writers.s3"):
        if mode == "overwrite":
            w.publish()
        else:
            w.publish("if-match", expected=etag)
    assert env.get() == b"theirs"
    (record,) = [r for r in caplog.records if "replaced or deleted" in r.getMessage()]
    if mode == "overwrite":
        assert record.levelname == "WARNING"
        assert record.getMessage() == (
            f"{env.url}: published, but replaced or deleted by someone else since"
        )
    else:
        assert record.levelname == "DEBUG"
        assert record.getMessage() == (
            f"{env.url}: published, but replaced or deleted by someone else since (a "
            "conditional write, if-match: another writer's came after it)"
        )


# -- a retried CreateMultipartUpload whose first answer was lost ---------------------------

LEFT_BEHIND = re.compile(
    r"(?P<url>\S+): aborted upload (?P<id>\S+), left behind by a retried CreateMultipartUpload"
)
MOTO_ONE_INITIATED = "moto 5.2 lists every upload as initiated at 2010-11-10T20:48:33Z"
SEAWEED_NO_FIELDS = (
    "SeaweedFS 4.48 lists no storage class, owner, initiator or checksum of an upload"
)


def _foreign_upload(env: Env, key: str, *, algorithm: str | None, part: bool = False) -> str:
    """A pending upload another tool started (with ``algorithm``: as the writer does)."""
    kw: dict[str, Any] = {}
    if algorithm is not None:
        kw = {"ChecksumAlgorithm": algorithm, "ChecksumType": "FULL_OBJECT"}
    upload_id: str = env.client.create_multipart_upload(Bucket=env.bucket, Key=key, **kw)[
        "UploadId"
    ]
    if part:
        env.client.upload_part(
            Bucket=env.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=1,
            Body=b"theirs",
            **({"ChecksumAlgorithm": algorithm} if algorithm else {}),
        )
    return upload_id


def _abort_all(env: Env, key: str, upload_ids: list[str]) -> None:
    for upload_id in upload_ids:
        env.client.abort_multipart_upload(Bucket=env.bucket, Key=key, UploadId=upload_id)


def test_lost_create_answer_leaves_no_other_upload(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """CreateMultipartUpload reaches the service and its answer is lost: the retry makes
    a second upload, and the first (empty, without the gc marker, so out of gc's reach)
    is aborted by the writer once its own upload holds the marker."""
    w = env.writer()
    lost = Fault("CreateMultipartUpload", "lost").install(w.client)
    data = data_of(3 * env.part + 1)
    with caplog.at_level(logging.INFO, "ptestore.writers.s3"):
        w.write(data, 0)
    assert lost.injected == 1
    assert env.uploads() == [w.upload_id]  # the first attempt's upload is gone already
    (message,) = [r.getMessage() for r in caplog.records if "left behind" in r.getMessage()]
    found = LEFT_BEHIND.fullmatch(message)
    assert found is not None, message
    assert found["url"] == env.url
    assert found["id"] != w.upload_id
    w.publish()
    assert env.get() == data
    assert env.uploads() == []


def test_a_retried_create_leaves_uploads_with_parts_and_other_keys_alone(env: Env) -> None:
    """Started just before the writer (inside its window), with the writer's checksum:
    an upload of the same key that holds a part, and an empty one of a longer key the
    listing by prefix also returns. Neither is the writer's to abort."""
    w = env.writer()
    theirs = _foreign_upload(env, env.key, algorithm=w.algorithm, part=True)
    longer = f"{env.key}.x"
    other = _foreign_upload(env, longer, algorithm=w.algorithm)
    lost = Fault("CreateMultipartUpload", "lost").install(w.client)
    w.write(data_of(3 * env.part), 0)
    assert lost.injected == 1
    assert set(env.uploads()) == {theirs, other, w.upload_id}
    w.publish()
    assert set(env.uploads()) == {theirs, other}
    _abort_all(env, env.key, [theirs])
    _abort_all(env, longer, [other])


@pytest.mark.s3_xfail("moto", reason=MOTO_ONE_INITIATED)
def test_a_retried_create_leaves_an_older_empty_upload_alone(env: Env) -> None:
    """An empty upload of the key, made as the writer makes its own, initiated well
    before the writer's create began: outside the window, so not the writer's."""
    w = env.writer()
    older = _foreign_upload(env, env.key, algorithm=w.algorithm)
    time.sleep(SLACK + 2)  # Initiated has a resolution of one second (SeaweedFS)
    Fault("CreateMultipartUpload", "lost").install(w.client)
    w.write(data_of(3 * env.part), 0)
    w.publish()
    assert env.uploads() == [older]
    _abort_all(env, env.key, [older])


@pytest.mark.s3_xfail("seaweedfs", reason=SEAWEED_NO_FIELDS)
def test_a_retried_create_leaves_another_tools_empty_upload_alone(env: Env) -> None:
    """An empty upload of the key started by a tool without checksums, inside the
    window: its listing entry differs from the writer's upload (no checksum type)."""
    w = env.writer()
    theirs = _foreign_upload(env, env.key, algorithm=None)
    Fault("CreateMultipartUpload", "lost").install(w.client)
    w.write(data_of(3 * env.part), 0)
    w.publish()
    assert env.uploads() == [theirs]
    _abort_all(env, env.key, [theirs])


def _client_closed(w: S3Writer) -> bool:
    """Whether the writer's client closed its connection pool (aiobotocore's HTTP session
    is left unusable, ``_sessions`` None, once closed)."""
    return w.client._endpoint.http_session._sessions is None


@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
def test_a_failed_publish_closes_the_client(env: Env, multipart: bool) -> None:
    """A publish that fails discards the writer and closes its client at once (not left
    to garbage collection, which closes it from whatever thread collects it); a discard
    afterwards closes nothing twice and fails nothing."""
    w = env.writer()
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    Fault(op, "403", times=-1).install(w.client)
    w.write(data_of(3 * env.part) if multipart else b"abc", 0)
    assert not _client_closed(w)
    with pytest.raises(PermissionDenied):
        w.publish()
    assert w.state is WriterState.DISCARDED
    assert _client_closed(w)
    w.discard()
    w.discard()
    assert _client_closed(w)
    assert env.uploads() == []


def test_a_failed_write_closes_the_client(env: Env) -> None:
    """A part upload refused while writing discards the writer: its client is closed."""
    w = env.writer()
    Fault("UploadPart", "403", times=-1).install(w.client)
    w.write(data_of(env.part), 0)  # one complete part: uploaded in the background
    with pytest.raises(PermissionDenied):
        w.wait_uploads()
    assert w.state is WriterState.DISCARDED
    assert _client_closed(w)
    w.discard()
    assert env.uploads() == []


@pytest.mark.parametrize("end", ["publish", "discard"])
def test_the_client_is_closed_when_the_writer_ends(env: Env, end: str) -> None:
    w = env.writer()
    w.write(b"abc", 0)
    if end == "publish":
        w.publish()
    else:
        w.discard()
    assert _client_closed(w)
