"""What S3 says of an object without sending it (:class:`~ptestore.storage.s3checksum.S3Object`:
the checksum ``HEAD``, ``GetObjectAttributes``) is asked under the retry policy of the
loader's ``retry_*`` options, as every other request ptestore makes: a transient failure
(a dropped connection, a 500, a 503) is asked again, ``retry_attempts=3`` is 3 requests,
and a permanent one (403, 404) is asked once. When no answer comes, nothing is reported
(the caller reads the bytes instead), as before. On moto and SeaweedFS, faults injected
by a botocore hook on the loader's own client."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from writers.s3_faults import Fault, sequence

from ptestore.storage.loaders import FsspecLoader, open_loader
from ptestore.storage.s3checksum import S3Object, s3_object
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3

DATA = random.Random(3).randbytes(10_000)
#: The caller's policy: three attempts, no back-off (no wall-clock waits); a client of
#: its own (s3fs shares filesystems per option set): the hooks stay in the test.
THREE = {"retry_attempts": 3, "retry_initial": 0.0, "retry_max": 0.0, "skip_instance_cache": True}


def _object(s3_server: S3TestServer, **options: Any) -> tuple[FsspecLoader, S3Object, str]:
    """``(loader, S3Object, CRC-32 stored)`` of a new object put with a CRC-32."""
    bucket = s3_server.new_bucket()
    put = s3_server.client().put_object(
        Bucket=bucket, Key="m.pte", Body=DATA, ChecksumAlgorithm="CRC32"
    )
    url = f"s3://{bucket}/m.pte"
    loader = open_loader(url, **s3_server.storage_options, **{**THREE, **options})
    assert isinstance(loader, FsspecLoader)
    obj = s3_object(loader)
    assert obj is not None
    return loader, obj, put["ChecksumCRC32"]


@pytest.mark.parametrize(
    ("kind", "calls"),
    [("reset", 3), ("500", 3), ("503", 3), ("403", 1), ("404-bucket", 1)],
)
def test_the_checksum_head_that_keeps_failing_is_made_as_often_as_the_policy_says(
    s3_server: S3TestServer, kind: str, calls: int
) -> None:
    """``retry_attempts=3``: a checksum ``HEAD`` that keeps failing on a transient error
    is sent 3 times (was once: one 503 cost a full read), a permanent one once; then no
    checksum is reported (the caller reads), every request counted."""
    loader, obj, _ = _object(s3_server)
    fault = Fault("HeadObject", kind, times=-1).install(loader.fs.s3)
    assert obj.checksum() is None
    assert fault.calls == obj.requests == calls


def test_a_checksum_head_that_fails_twice_is_retried_and_answers(
    s3_server: S3TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 503, a dropped connection, then the answer: the stored checksum, 3 requests,
    each retry logged on ``ptestore.retry`` naming the object and the request."""
    loader, obj, stored = _object(s3_server)
    counted = Fault("HeadObject", "503", times=0).install(loader.fs.s3)  # counts only
    failing = sequence(Fault("HeadObject", "503"), Fault("HeadObject", "reset"))
    loader.fs.s3.meta.events.register("before-send.s3.HeadObject", failing)
    with caplog.at_level(logging.WARNING, logger="ptestore.retry"):
        got = obj.checksum()
    assert got is not None and (got.algorithm, got.value) == ("CRC32", stored)
    assert obj.size == len(DATA)
    assert counted.calls == obj.requests == 3
    messages = [r.getMessage() for r in caplog.records if r.name == "ptestore.retry"]
    assert messages[0] == (
        f"{loader.name}: HeadObject: attempt 1 of 3 failed (SlowDown (HTTP 503): injected 503); "
        "retrying in 0.00s"
    )
    assert messages[1].startswith(f"{loader.name}: HeadObject: attempt 2 of 3 failed ("), messages
    assert len(messages) == 2


def test_one_attempt_is_one_request(s3_server: S3TestServer) -> None:
    """``retry_attempts=1``: the checksum ``HEAD`` failing on a 503 is asked once."""
    loader, obj, _ = _object(s3_server, retry_attempts=1)
    fault = Fault("HeadObject", "503", times=-1).install(loader.fs.s3)
    assert obj.checksum() is None
    assert fault.calls == obj.requests == 1


@pytest.mark.parametrize(
    ("times", "kind"), [(-1, "503"), (2, "500"), (2, "reset"), (-1, "403"), (-1, "501")]
)
def test_the_parts_request_is_retried_by_the_policy(
    s3_server: S3TestServer, times: int, kind: str
) -> None:
    """``GetObjectAttributes`` (the part sizes) under the same policy: failing on a
    transient error every time, 3 requests (then part 1's ``HEAD`` is asked, as when
    the server lists no parts); failing twice, retried, and the parts are what they are
    without a fault; a 403 asked once, and a 501 ``NotImplemented`` (a server without
    the request: asking again changes nothing, though a 5xx)."""
    loader, obj, _ = _object(s3_server)
    assert obj.checksum() is not None  # the size, which part 1's HEAD needs
    without = obj.parts("CRC32")
    fault = Fault("GetObjectAttributes", kind, times=times).install(loader.fs.s3)
    got = obj.parts("CRC32")
    assert fault.calls == (1 if kind in ("403", "501") else 3)
    if times == 2:
        assert got == without
