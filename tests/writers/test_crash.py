"""Crash safety: children SIGKILLed at random moments while writing and publishing.

Children are forked from the test process (no interpreter start-up per run), write a
large output in random order from a source file, and publish it. After every kill the
destination must hold the old content or the complete new content, the source must be
untouched, and ``gc`` must clean up whatever staging the dead child left.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import AlreadyExists
from ptestore.loaders import LocalFileLoader
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer
from ptestore.writers.gc import collect_local, collect_s3
from ptestore.writers.local import TEMP_NAME_RE
from ptestore.writers.s3 import MIN_PART_SIZE

RUNS = 60
CHILD_DEADLINE = 120.0
SIZE = 8 << 20
CHUNK = 256 * 1024


def new_content(src: bytes) -> bytes:
    """What the child publishes: the source with its chunks reversed and a header."""
    chunks = [src[o : o + CHUNK] for o in range(0, len(src), CHUNK)]
    body = b"".join(reversed(chunks))
    return b"NEW!" + body[4:]


def child_write(src_path: str, dest: str, options: dict[str, Any]) -> None:
    loader = LocalFileLoader(src_path)
    n = loader.size() // CHUNK
    order = list(range(n))
    random.shuffle(order)
    w = open_writer(dest, **options)
    for i in order:  # chunk i of the source goes to slot n-1-i
        w.copy_from(loader, i * CHUNK, CHUNK, (n - 1 - i) * CHUNK)
    w.write(b"NEW!", 0)
    w.publish("overwrite")


def fork_and_kill(target: Callable[[], None], delay: float) -> tuple[int, float]:
    """Run ``target`` in a forked child; SIGKILL it after ``delay`` s. Returns (status, t)."""
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            os.write(wfd, b"g")
            target()
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(wfd)
    os.read(r, 1)
    os.close(r)
    start = time.monotonic()
    if delay >= 0:
        time.sleep(delay)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        # Not killed on purpose: never wait forever for a child that hangs (a lock
        # inherited through fork, say); kill it after a generous deadline and fail.
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, time.monotonic() - start
            if time.monotonic() - start > CHILD_DEADLINE:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"child {pid} did not finish in {CHILD_DEADLINE} s")
            time.sleep(0.01)
    _, status = os.waitpid(pid, 0)
    return status, time.monotonic() - start


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_local_publish_survives_sigkill_at_any_moment(tmp_path: Path) -> None:
    src = tmp_path / "source.pte"
    src_bytes = random.Random(1).randbytes(SIZE)
    src.write_bytes(src_bytes)
    src_hash = sha(src_bytes)
    new = new_content(src_bytes)
    old = b"OLD" * 1000
    dest = tmp_path / "out" / "model.pte"
    dest.parent.mkdir()

    # calibrate: how long does one undisturbed run take?
    dest.write_bytes(old)
    status, took = fork_and_kill(lambda: child_write(str(src), str(dest), {}), -1)
    assert status == 0
    assert dest.read_bytes() == new

    outcomes = {"old": 0, "new": 0}
    rng = random.Random(2)
    for run in range(RUNS):
        in_place = run % 5 == 4  # every 5th run replaces the source itself
        target = src if in_place else dest
        target_old = src_bytes if in_place else old
        if sha(src.read_bytes()) != src_hash:  # an in-place run replaced it: restore
            src.write_bytes(src_bytes)
        if not in_place:
            dest.write_bytes(old)
        delay = rng.uniform(0, took * 1.5)
        fork_and_kill(lambda t=target: child_write(str(src), str(t), {}), delay)
        got = target.read_bytes()
        assert got in (target_old, new), f"run {run}: destination is neither old nor new"
        if not in_place:
            assert sha(src.read_bytes()) == src_hash, f"run {run}: source changed"
            outcomes["old" if got == old else "new"] += 1
        for entry in collect_local(tmp_path, older_than=0):
            assert entry.action == "removed", entry
        assert not [n for n in os.listdir(target.parent) if TEMP_NAME_RE.match(n)]
    assert outcomes["old"] > 0
    assert outcomes["new"] > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_local_create_between_processes_has_one_winner(tmp_path: Path) -> None:
    dest = tmp_path / "model.pte"
    go_r, go_w = os.pipe()
    pids = []
    for i in range(6):
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                w = open_writer(dest)
                w.write(bytes([65 + i]) * 100_000, 0)
                os.read(go_r, 1)
                try:
                    w.publish("create")
                    code = 0
                except AlreadyExists:
                    code = 17
            finally:
                os._exit(code)
        pids.append(pid)
    os.write(go_w, b"x" * 6)
    codes = sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids)
    assert codes == [0, 17, 17, 17, 17, 17]
    data = dest.read_bytes()
    assert len(data) == 100_000
    assert len(set(data)) == 1
    assert os.listdir(tmp_path) == ["model.pte"]


@pytest.mark.s3
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_s3_publish_survives_sigkill(
    tmp_path: Path, s3_server: S3TestServer, s3_bucket: str, s3_client: Any
) -> None:
    size = 11 << 20  # three 5 MiB parts (S3's smallest), the last one short
    src = tmp_path / "source.pte"
    src_bytes = random.Random(3).randbytes(size)
    src.write_bytes(src_bytes)
    new = new_content(src_bytes)
    old = b"OLD" * 1000
    key = "crash/model.pte"
    url = f"s3://{s3_bucket}/{key}"
    options = {**s3_server.storage_options, "part_size": MIN_PART_SIZE, "max_concurrency": 2}
    options["spool"] = True  # "NEW!" rewrites part 1 after its upload

    def get() -> bytes:
        body: bytes = s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        return body

    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=old)
    status, took = fork_and_kill(lambda: child_write(str(src), url, options), -1)
    assert status == 0
    assert get() == new
    rng = random.Random(4)
    for run in range(15):
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=old)
        fork_and_kill(lambda: child_write(str(src), url, options), rng.uniform(0, took * 1.3))
        assert get() in (old, new), f"run {run}: object is neither old nor new"
        collect_s3(f"s3://{s3_bucket}/crash/", older_than=0, **s3_server.storage_options)
        for up in s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []):
            # Killed in the one round trip between CreateMultipartUpload and the marker
            # part: an empty upload (nothing stored, nothing billed) that gc cannot prove
            # is ours; the lifecycle rule removes those. Anything with parts must be gone.
            parts = s3_client.list_parts(Bucket=s3_bucket, Key=key, UploadId=up["UploadId"])
            assert parts.get("Parts", []) == [], f"run {run}: gc left an upload with parts"
            s3_client.abort_multipart_upload(Bucket=s3_bucket, Key=key, UploadId=up["UploadId"])
    assert src.read_bytes() == src_bytes
