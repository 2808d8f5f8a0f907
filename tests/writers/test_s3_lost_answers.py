"""S3 publish retries after an attempt that may have taken effect.

A conditional PutObject or CompleteMultipartUpload lands, its answer is lost, and
another writer replaces (or deletes) the object before the retry: the retry is refused
(412, 409, 404) and the ``HEAD`` shows someone else's object. Our output *was*
published, so "nothing was published, retry" (``PreconditionFailed``,
``AlreadyExists``) would make a caller following the documented retry loop apply its
change twice: it is ``PublishUncertain``. A first attempt the service turned away before
doing anything (503 ``SlowDown``) leaves the plain conflict.

And an interrupt (Ctrl-C) while CreateMultipartUpload is in flight: the service makes
the upload all the same; the writer waits for the answer and aborts it.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ptestore.errors import AlreadyExists, PreconditionFailed, PublishUncertain, StorageError
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import S3Writer, WriterState, open_writer
from ptestore.writers.s3 import MIN_PART_SIZE
from ptestore.writers.s3.publish import may_have_applied

from .s3_faults import Fault, error_response, fake_response, sequence

FAST = {"retry_initial": 0.001, "retry_max": 0.01, "skip_instance_cache": True}
LOST = re.escape("an earlier attempt's answer was lost (ReadTimeoutError: Read timeout on")


class Env:
    def __init__(self, server: S3TestServer, bucket: str, client: Any) -> None:
        self.server, self.bucket, self.client = server, bucket, client
        self.part = max(MIN_PART_SIZE, server.min_part_size)
        self.key = f"m/{uuid.uuid4().hex}.json"
        self.url = f"s3://{bucket}/{self.key}"

    def writer(self, **kw: Any) -> S3Writer:
        opts = {**self.server.storage_options, "part_size": self.part, **FAST, **kw}
        w = open_writer(self.url, **opts)
        assert isinstance(w, S3Writer)
        return w

    def put(self, body: bytes) -> str:
        """Another writer's object (its ETag)."""
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body)
        return str(self.client.head_object(Bucket=self.bucket, Key=self.key)["ETag"])

    def get(self) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body

    def uploads(self) -> list[str]:
        resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.key)
        return [u["UploadId"] for u in resp.get("Uploads", [])]

    def payload(self, multipart: bool) -> bytes:
        return random.Random(7).randbytes(2 * self.part + 1) if multipart else b"ours"


@pytest.fixture
def env(s3_server: S3TestServer, s3_bucket: str, s3_client: Any) -> Env:
    return Env(s3_server, s3_bucket, s3_client)


class FirstAttempt:
    """A ``before-send`` hook: the first attempt of the operation ends as ``first``
    decides, after ``meanwhile`` (another writer's move) ran; later attempts are
    answered ``retry`` (a key of ``s3_faults.ERRORS``), or by the server when None."""

    def __init__(self, first: str, meanwhile: Callable[[], None], retry: str | None = None) -> None:
        self.first, self.meanwhile, self.retry = first, meanwhile, retry
        self.calls = 0
        self._http = urllib3.PoolManager()

    def __call__(self, request: Any, **_kwargs: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            return None if self.retry is None else error_response(request.url, self.retry)
        if self.first == "lost":  # it reaches the service; its answer never comes back
            body = request.body.read() if hasattr(request.body, "read") else request.body
            headers = dict(request.headers)
            self._http.request(request.method, request.url, body=body, headers=headers)
        self.meanwhile()
        if self.first == "lost":
            raise ReadTimeoutError(endpoint_url=request.url)
        return error_response(request.url, self.first)

    def install(self, w: S3Writer, operation: str) -> FirstAttempt:
        w.client.meta.events.register(f"before-send.s3.{operation}", self)
        return self


def _start(env: Env, mode: str) -> str | None:
    """The object the publish in ``mode`` expects (its ETag for if-match)."""
    return env.put(b"v0") if mode == "if-match" else None


def _publish(w: S3Writer, mode: str, expected: str | None) -> None:
    if mode == "if-match":
        w.publish("if-match", expected=expected)
    else:
        w.publish("create")


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["if-match", "create"])
def test_put_lost_then_replaced_is_uncertain(env: Env, mode: str) -> None:
    """Our PutObject landed (answer lost), another writer replaced it, our retry is
    refused by the server itself (412): uncertain, naming what is there now."""
    expected = _start(env, mode)
    theirs: list[str] = []
    w = env.writer()
    hook = FirstAttempt("lost", lambda: theirs.append(env.put(b"theirs"))).install(w, "PutObject")
    w.write(b"ours", 0)
    with pytest.raises(PublishUncertain) as info:
        _publish(w, mode, expected)
    assert hook.calls == 2
    message = str(info.value)
    prefix = f"{env.url}: a retry of PutObject was refused (PreconditionFailed (HTTP 412)"
    assert message.startswith(prefix)
    assert re.search(f"\\), but {LOST}", message)
    assert (
        f"and that attempt may have published this writer's output; the object there now "
        f"(ETag {theirs[0]}) is not this writer's: this writer's output may have been "
        "published and replaced or deleted since, or never published. Read the object "
        "before redoing the change (a blind retry could apply it twice)"
    ) in message
    assert w.state is WriterState.DISCARDED
    assert env.get() == b"theirs"


@pytest.mark.s3
def test_put_lost_then_deleted_is_uncertain(env: Env) -> None:
    """The same with the object deleted before the retry: the server refuses the
    If-Match (404 on AWS and moto, 412 on SeaweedFS) and there is no object."""
    expected = env.put(b"v0")
    w = env.writer()
    delete = lambda: env.client.delete_object(Bucket=env.bucket, Key=env.key)  # noqa: E731
    FirstAttempt("lost", delete).install(w, "PutObject")
    w.write(b"ours", 0)
    with pytest.raises(PublishUncertain, match=f"\\), but {LOST}") as info:
        w.publish("if-match", expected=expected)
    assert "; there is no object there now: this writer's output may have been" in str(info.value)
    assert env.get() is None


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["if-match", "create"])
@pytest.mark.parametrize("retry", ["412", "409"])
def test_complete_lost_then_replaced_is_uncertain(env: Env, mode: str, retry: str) -> None:
    """CompleteMultipartUpload landed (answer lost), another writer replaced the object,
    our retry is refused as AWS refuses a condition that no longer holds (412, or 409
    ConditionalRequestConflict; injected: moto and SeaweedFS answer NoSuchUpload)."""
    expected = _start(env, mode)
    theirs: list[str] = []
    w = env.writer()
    hook = FirstAttempt("lost", lambda: theirs.append(env.put(b"theirs")), retry)
    hook.install(w, "CompleteMultipartUpload")
    w.write(env.payload(multipart=True), 0)
    with pytest.raises(PublishUncertain, match=f"\\), but {LOST}") as info:
        _publish(w, mode, expected)
    assert str(info.value).startswith(f"{env.url}: a retry of CompleteMultipartUpload was ")
    assert f"the object there now (ETag {theirs[0]}) is not this writer's" in str(info.value)
    assert hook.calls == 2
    assert env.get() == b"theirs"
    assert env.uploads() == []


def _complete_lost_then_replaced(env: Env, mode: str) -> None:
    expected = _start(env, mode)
    w = env.writer()
    FirstAttempt("lost", lambda: env.put(b"theirs")).install(w, "CompleteMultipartUpload")
    w.write(env.payload(multipart=True), 0)
    with pytest.raises(PublishUncertain, match=re.escape(env.url)):
        _publish(w, mode, expected)
    assert env.get() == b"theirs"
    assert env.uploads() == []


@pytest.mark.s3
def test_complete_lost_then_replaced_retry_answered_by_the_server(env: Env) -> None:
    """The same in create mode, the retry answered by the server: uncertain too."""
    _complete_lost_then_replaced(env, "create")


@pytest.mark.s3
def test_complete_if_match_lost_then_replaced_retry_answered_by_the_server(env: Env) -> None:
    """The same in if-match mode (SeaweedFS: the upload is gone; moto: a second Complete
    of a completed upload is a 500, its KeyError, to the last retry: uncertain too)."""
    _complete_lost_then_replaced(env, "if-match")


@pytest.mark.s3
@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
@pytest.mark.parametrize("mode", ["if-match", "create"])
def test_a_first_answer_of_503_leaves_a_plain_conflict(
    env: Env, mode: str, multipart: bool
) -> None:
    """503 SlowDown is answered before anything is done: the retry's refusal is the
    conflict it is (the caller reads again and retries)."""
    expected = _start(env, mode)
    theirs: list[str] = []
    w = env.writer()
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    FirstAttempt("503", lambda: theirs.append(env.put(b"theirs")), "412").install(w, op)
    w.write(env.payload(multipart), 0)
    if mode == "create":
        with pytest.raises(AlreadyExists):
            _publish(w, mode, expected)
    else:
        with pytest.raises(PreconditionFailed) as info:
            _publish(w, mode, expected)
        assert (info.value.expected, info.value.found) == (expected, theirs[0])
        assert "nothing was published" in str(info.value)
    assert env.get() == b"theirs"
    assert env.uploads() == []


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["if-match", "create"])
def test_a_first_answer_of_500_may_have_published(env: Env, mode: str) -> None:
    """500 InternalError may come after the write was done: uncertain."""
    expected = _start(env, mode)
    w = env.writer()
    FirstAttempt("500", lambda: env.put(b"theirs"), "412").install(w, "PutObject")
    w.write(b"ours", 0)
    with pytest.raises(PublishUncertain) as info:
        _publish(w, mode, expected)
    assert "an earlier attempt's answer was lost (InternalError (HTTP 500): injected 500)" in str(
        info.value
    )


def _answer(status: int, code: str) -> ClientError:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("exc", "applied"),
    [
        (ReadTimeoutError(endpoint_url="u"), True),
        (ConnectionClosedError(endpoint_url="u"), True),
        (_answer(500, "InternalError"), True),
        (_answer(200, "InternalError"), True),  # a 200 carrying an <Error>
        (_answer(502, "BadGateway"), True),
        (_answer(504, "GatewayTimeout"), True),
        (EndpointConnectionError(endpoint_url="u"), False),
        (ConnectTimeoutError(endpoint_url="u"), False),
        (_answer(503, "SlowDown"), False),
        (_answer(503, "ServiceUnavailable"), False),
        (_answer(503, "Unknown"), False),
        (_answer(429, "TooManyRequestsException"), False),
        (_answer(400, "RequestTimeout"), False),
        (_answer(412, "PreconditionFailed"), False),
        (_answer(404, "NoSuchKey"), False),
    ],
)
def test_which_failures_may_have_published(exc: BaseException, applied: bool) -> None:
    assert may_have_applied(exc) is applied


@pytest.mark.s3
def test_an_interrupt_while_the_upload_is_created_aborts_it(env: Env) -> None:
    """The request reaches the service (the upload exists), then SIGINT reaches the
    waiting thread; only once its handler ran does the answer come back. The writer
    raises the KeyboardInterrupt and leaves no pending upload (which, without its gc
    marker part, no ``ptestore gc`` would remove)."""
    w = env.writer()
    http = urllib3.PoolManager()
    interrupted = threading.Event()
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main  # signals go to this thread
    created: list[str] = []

    def on_sigint(_signum: int, _frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    def create(request: Any, **_kwargs: Any) -> Any:
        body = request.body.read() if hasattr(request.body, "read") else request.body
        r = http.request(request.method, request.url, body=body, headers=dict(request.headers))
        created.extend(env.uploads())
        signal.pthread_kill(main, signal.SIGINT)
        assert interrupted.wait(timeout=60)  # a bound, not a delay: set by the handler
        return fake_response(request.url, r.status, dict(r.headers), r.data)

    w.client.meta.events.register("before-send.s3.CreateMultipartUpload", create)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            w.write(env.payload(multipart=True)[: env.part], 0)  # a whole part: starts it
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(created) == 1  # the service made it
    assert w.state is WriterState.DISCARDED
    w.discard()
    assert env.uploads() == []


def _applied_then(kind: str) -> Callable[[Any], Any]:
    """A ``sequence`` handler: the attempt reaches the service (it does the write), then
    its answer is replaced by the error ``kind`` (a key of ``s3_faults.ERRORS``)."""
    http = urllib3.PoolManager()

    def handler(request: Any) -> Any:
        body = request.body.read() if hasattr(request.body, "read") else request.body
        http.request(request.method, request.url, body=body, headers=dict(request.headers))
        return error_response(request.url, kind)

    return handler


def _lost(request: Any) -> Any:
    """A ``sequence`` handler: the attempt reaches the service, its answer is lost."""
    return Fault("any", "lost")(request)


def _refused(kind: str) -> Callable[[Any], Any]:
    """A ``sequence`` handler: the attempt is answered ``kind`` without reaching the service."""
    return lambda request: error_response(request.url, kind)


def _unreachable(request: Any) -> Any:
    raise EndpointConnectionError(endpoint_url=request.url)


@pytest.mark.s3
@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
@pytest.mark.parametrize(
    "last",
    [_refused("503"), _refused("500"), _unreachable],
    ids=["503", "500", "unreachable"],
)
def test_lost_answer_then_a_failed_last_attempt_finds_our_object(
    env: Env, multipart: bool, last: Callable[[Any], Any]
) -> None:
    """An attempt landed and its answer was lost; the retries then failed (503 SlowDown,
    another 500, the endpoint unreachable): the last failure says nothing of the first,
    so the writer asks, finds its token, and the publish succeeded (a rerun in create
    mode would meet AlreadyExists for an object that is its own)."""
    w = env.writer(retry_attempts=3)
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    hook = sequence(_lost, _refused("503"), last)
    w.client.meta.events.register(f"before-send.s3.{op}", hook)
    data = env.payload(multipart)
    w.write(data, 0)
    result = w.publish("create")
    assert result.size == len(data)
    assert w.state is WriterState.PUBLISHED
    assert env.get() == data
    assert env.uploads() == []


@pytest.mark.s3
@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
def test_one_attempt_answered_500_after_the_write_finds_our_object(
    env: Env, multipart: bool
) -> None:
    """One attempt (retry_attempts=1): the service did the write and answered 500
    InternalError. The answer may come after the work: HEAD finds our token."""
    w = env.writer(retry_attempts=1)
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    w.client.meta.events.register(f"before-send.s3.{op}", sequence(_applied_then("500")))
    data = env.payload(multipart)
    w.write(data, 0)
    assert w.publish("create").size == len(data)
    assert env.get() == data
    assert env.uploads() == []


@pytest.mark.s3
@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
def test_one_attempt_answered_500_without_our_object_is_uncertain(
    env: Env, multipart: bool
) -> None:
    """One attempt answered 500 (here before anything was done) and no object of ours is
    there: uncertain, never "nothing was published"."""
    w = env.writer(retry_attempts=1)
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    w.client.meta.events.register(f"before-send.s3.{op}", sequence(_refused("500")))
    w.write(env.payload(multipart), 0)
    with pytest.raises(PublishUncertain) as info:
        w.publish("create")
    assert str(info.value) == (
        f"{env.url}: {op} failed (InternalError (HTTP 500): injected 500), an answer the "
        "service may give after doing the write, so that attempt may have published this "
        "writer's output; there is no object there now: this writer's output may have been "
        "published and replaced or deleted since, or never published. Read the object "
        "before redoing the change (a blind retry could apply it twice)"
    )
    assert w.state is WriterState.DISCARDED
    assert env.get() is None
    assert env.uploads() == []


@pytest.mark.s3
@pytest.mark.parametrize("multipart", [False, True], ids=["put", "complete"])
def test_lost_answer_then_503_without_our_object_is_uncertain(env: Env, multipart: bool) -> None:
    """An attempt that may have landed (a 500), then 503s to the end, and the object
    there is another writer's: uncertain (ours may have landed and been replaced),
    naming both failures and what is there."""
    env.put(b"theirs")
    w = env.writer(retry_attempts=3)
    op = "CompleteMultipartUpload" if multipart else "PutObject"
    hook = sequence(_refused("500"), _refused("503"), _refused("503"))
    w.client.meta.events.register(f"before-send.s3.{op}", hook)
    w.write(env.payload(multipart), 0)
    with pytest.raises(PublishUncertain) as info:
        w.publish("overwrite")
    etag = env.client.head_object(Bucket=env.bucket, Key=env.key)["ETag"]
    assert str(info.value) == (
        f"{env.url}: {op} failed (SlowDown (HTTP 503): injected 503), but an earlier "
        "attempt's answer was lost (InternalError (HTTP 500): injected 500) and that attempt "
        f"may have published this writer's output; the object there now (ETag {etag}) is "
        "not this writer's: this writer's output may have been published and replaced or "
        "deleted since, or never published. Read the object before redoing the change (a "
        "blind retry could apply it twice)"
    )
    assert env.get() == b"theirs"
    assert env.uploads() == []


@pytest.mark.s3
def test_lost_answer_then_503_with_the_head_failing_is_uncertain(env: Env) -> None:
    """The same when the follow-up HEAD fails too: uncertain, saying so."""
    w = env.writer(retry_attempts=2)
    hook = sequence(_refused("500"), _refused("503"))
    w.client.meta.events.register("before-send.s3.PutObject", hook)
    w.client.meta.events.register(
        "before-send.s3.HeadObject", lambda request, **_: error_response(request.url, "403")
    )
    w.write(b"ours", 0)
    with pytest.raises(PublishUncertain) as info:
        w.publish("create")
    message = str(info.value)
    assert message.startswith(
        f"{env.url}: PutObject failed (SlowDown (HTTP 503): injected 503), but an earlier "
        "attempt's answer was lost (InternalError (HTTP 500): injected 500) and that attempt "
        "may have published this writer's output; the follow-up HEAD failed ("
    )
    assert message.endswith(
        "): this writer's output may have been published and replaced or deleted since, or "
        "never published. Read the object before redoing the change (a blind retry could "
        "apply it twice)"
    )


@pytest.mark.s3
def test_503s_alone_are_still_nothing_published(env: Env) -> None:
    """Every attempt turned away before anything was done (503): no HEAD, the plain
    failure (nothing was published)."""
    w = env.writer(retry_attempts=2)
    heads = Fault("HeadObject", "403", times=0).install(w.client)
    hook = sequence(_refused("503"), _refused("503"))
    w.client.meta.events.register("before-send.s3.PutObject", hook)
    w.write(b"ours", 0)
    with pytest.raises(StorageError) as info:
        w.publish("create")
    assert type(info.value) is StorageError
    assert str(info.value) == f"{env.url}: PutObject failed: SlowDown (HTTP 503): injected 503"
    assert heads.calls == 0
    assert env.get() is None
