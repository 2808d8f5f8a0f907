"""Crash safety with kill points chosen from observed progress (tests/writers/stepper.py).

A forked child stands at an exact moment (staging file created, N writes done, a part
uploaded, the commit point, the rename/link or CompleteMultipartUpload done, publish
returned) when it receives SIGKILL or SIGINT. What the destination holds, what gc
collects and, for ``ptestore specialize``, the exit status and message are asserted
for the phase the signal landed in, and the number of kills per phase is asserted too.

SIGKILL cannot show a missing fsync (the page cache survives the process); the order
of the system calls is checked by tests/writers/test_durability_order.py.
"""

from __future__ import annotations

import gc
import os
import random
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.errors import AlreadyExists
from ptestore.gc import collect_local, collect_s3
from ptestore.storage.loaders import LocalFileLoader
from ptestore.testing.moto import MotoS3, small_s3_parts
from ptestore.writers import open_writer
from ptestore.writers.local import TEMP_NAME_RE
from ptestore.writers.s3 import MIN_PART_SIZE

from .stepper import Outcome, run_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


# The crash tests drive 4 KiB parts (moto's lowered minimum; real S3 servers refuse
# parts under 5 MiB), so their S3 cases run on moto only.
@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    return moto_s3.new_bucket()


@pytest.fixture
def s3_client(moto_s3: MotoS3) -> Any:
    return moto_s3.client()


SIZE = 8 << 20
CHUNK = 256 * 1024
MODEL = get_fixture("mlp_xnnpack_align4096")
OLD = b"OLD" * 1000


def new_content(src: bytes) -> bytes:
    """What child_write publishes: the source with its chunks reversed and a header."""
    chunks = [src[o : o + CHUNK] for o in range(0, len(src), CHUNK)]
    return b"NEW!" + b"".join(reversed(chunks))[4:]


def child_write(src_path: str, dest: str, options: dict[str, Any]) -> Callable[[], int]:
    def body() -> int:
        loader = LocalFileLoader(src_path)
        n = loader.size() // CHUNK
        order = list(range(n))
        random.Random(7).shuffle(order)
        w = open_writer(dest, **options)
        for i in order:  # chunk i of the source goes to slot n-1-i
            w.copy_from(loader, i * CHUNK, CHUNK, (n - 1 - i) * CHUNK)
        w.write(b"NEW!", 0)
        w.publish("overwrite")
        return 0

    return body


def first(events: list[str], prefix: str) -> int:
    return next(i for i, e in enumerate(events) if e.startswith(prefix))


def staging_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if TEMP_NAME_RE.match(n))


# -- the writers alone ------------------------------------------------------------------


def test_local_writer_sigkill_at_each_phase(tmp_path: Path) -> None:
    src = tmp_path / "source.pte"
    src_bytes = random.Random(1).randbytes(SIZE)
    src.write_bytes(src_bytes)
    new = new_content(src_bytes)
    dest = tmp_path / "out" / "model.pte"
    dest.parent.mkdir()
    dest.write_bytes(OLD)
    calib = run_child(child_write(str(src), str(dest), {}))
    assert calib.status == 0, calib.stderr
    assert dest.read_bytes() == new
    ev = calib.events
    staged, renamed = first(ev, "staged"), first(ev, "renamed")
    writes = [i for i, e in enumerate(ev) if e.startswith("write")]
    assert len(writes) == SIZE // CHUNK + 1
    rng = random.Random(2)
    points = {
        "staged": [staged],
        "writing": rng.sample(writes, 8),
        "commit": [first(ev, "commit")],
        "renamed": [renamed],
        "published": [first(ev, "published")],
    }
    landed: Counter[str] = Counter()
    for phase, indexes in points.items():
        for k in indexes:
            dest.write_bytes(OLD)
            out = run_child(child_write(str(src), str(dest), {}), kill_at=k)
            assert out.status == -signal.SIGKILL, (phase, out.stderr)
            assert out.events[-1] == ev[k], (phase, out.events[-3:])
            landed[phase] += 1
            want = new if k >= renamed else OLD
            assert dest.read_bytes() == want, f"{phase} (event {k}): wrong destination"
            assert src.read_bytes() == src_bytes
            # gc: exactly the dead writer's staging file before the rename, none after
            entries = collect_local(dest.parent, older_than=0)
            assert [e.action for e in entries] == (["removed"] if k < renamed else []), phase
            assert staging_files(dest.parent) == []
    assert landed == {"staged": 1, "writing": 8, "commit": 1, "renamed": 1, "published": 1}


@pytest.mark.s3
def test_s3_writer_sigkill_mid_upload_and_at_complete(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str, s3_client: Any
) -> None:
    size = 11 << 20  # three 5 MiB parts (S3's smallest), the last one short
    src = tmp_path / "source.pte"
    src_bytes = random.Random(3).randbytes(size)
    src.write_bytes(src_bytes)
    new = new_content(src_bytes)
    key = "crash/model.pte"
    url = f"s3://{s3_bucket}/{key}"
    options = {**moto_s3.storage_options, "part_size": MIN_PART_SIZE, "max_concurrency": 2}
    options["spool"] = True  # "NEW!" rewrites part 1 after its upload

    def get() -> bytes:
        body: bytes = s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        return body

    def uploads() -> list[str]:
        listing = s3_client.list_multipart_uploads(Bucket=s3_bucket)
        return [u["UploadId"] for u in listing.get("Uploads", [])]

    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=OLD)
    calib = run_child(child_write(str(src), url, options))
    assert calib.status == 0, calib.stderr
    assert get() == new
    ev = calib.events
    completed = first(ev, "completed")
    parts = [i for i, e in enumerate(ev) if e == "part"]
    assert len(parts) >= 4  # three parts, part 1 uploaded twice
    points = {
        "upload created": [first(ev, "upload")],
        "mid-upload": parts[:-1],
        "commit": [first(ev, "commit")],
        "completed": [completed],
    }
    landed: Counter[str] = Counter()
    for phase, indexes in points.items():
        for k in indexes:
            s3_client.put_object(Bucket=s3_bucket, Key=key, Body=OLD)
            out = run_child(child_write(str(src), url, options), kill_at=k)
            assert out.status == -signal.SIGKILL, (phase, out.stderr)
            landed[phase] += 1
            assert get() == (new if k >= completed else OLD), f"{phase} (event {k})"
            pending = uploads()
            entries = collect_s3(
                f"s3://{s3_bucket}/crash/", older_than=0, **moto_s3.storage_options
            )
            if k < completed:  # the dead writer's upload, proven ours by its marker
                assert len(pending) == 1, phase
                assert [e.action for e in entries] == ["removed"], phase
                assert entries[0].location.endswith(f"?uploadId={pending[0]}")
            else:
                assert pending == [] and entries == [], phase
            assert uploads() == []
    assert landed["mid-upload"] >= 3 and landed["completed"] == 1
    assert src.read_bytes() == src_bytes


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


# -- ptestore specialize: SIGINT and SIGKILL ---------------------------------------------


def cli(argv: list[str], s3_parts: bool = False) -> Callable[[], int]:
    def body() -> int:
        from ptestore.cli import main

        if s3_parts:
            with small_s3_parts(1024):
                code = main(argv)
        else:
            code = main(argv)
        gc.collect()  # what interpreter exit would do: finalizers of dropped writers
        return code

    return body


def expect_specialize(
    out: Outcome, sig: int, k: int, events: list[str], dest: str
) -> tuple[str, bool]:
    """Check status and message for a signal at event ``k``; return (phase, new?)."""
    done = first(events, "completed" if "completed" in events else "renamed")
    published = first(events, "published")
    phase = "before" if k < done else "uncertain" if k < published else "after"
    if sig == signal.SIGKILL:
        assert out.status == -signal.SIGKILL, out.stderr
        return phase, k >= done
    err = out.stderr.strip()
    if phase == "before":
        assert out.status == 130, err
        assert err == "ptestore specialize: interrupted; nothing was published"
    elif phase == "uncertain":
        assert out.status == 1, err
        assert err.startswith(
            f"ptestore specialize: publish uncertain (it may or may not have taken effect): "
            f"{dest}: publishing was "
        )
        assert "interrupted after its commit step began (KeyboardInterrupt)" in err
    else:
        assert out.status == 130, err
        assert err == f"ptestore specialize: interrupted after {dest} was published"
    return phase, phase != "before"


def kill_point(events: list[str], run: int, rng: random.Random) -> int:
    """Cycle through the phases: a random event before the commit point (on S3: a part
    upload, every other time), the commit point, the rename/Complete, publish returned."""
    done = first(events, "completed" if "completed" in events else "renamed")
    choice = run % 4
    if choice == 0:
        parts = [i for i, e in enumerate(events) if e == "part"]
        if parts and run % 8 == 0:
            return rng.choice(parts)
        return rng.randrange(first(events, "commit"))
    return [0, first(events, "commit"), done, first(events, "published")][choice]


SCENARIOS = ["overwrite", "create", "in-place"]
# Each run kills at one (signal, phase) cell: SIGKILL/SIGINT x (before the commit point,
# the commit point, the rename, publish returned); 8 runs visit every cell once, with a
# kill mid-part-upload every 8th. Two rounds sample every cell twice (with other random
# "before" points) instead of repeating it six times: the suite's time is a budget.
RUNS_PER_SCENARIO = 16  # x 3 scenarios locally: 48 runs (a multiple of 8)
S3_RUNS_PER_SCENARIO = 8  # x 2 scenarios on moto: 16 runs (each one is slower)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_specialize_sigint_and_sigkill_locally(tmp_path: Path, scenario: str) -> None:
    assert MODEL.pte_path is not None
    source = MODEL.pte_path.read_bytes()
    src = tmp_path / "in.pte"
    dst = src if scenario == "in-place" else tmp_path / "out.pte"
    argv = ["specialize", str(src), str(dst), "-q", "--backend", "support.crash_backend:Reverse"]
    argv.append("--no-provenance")  # the outputs are compared byte for byte across runs
    if scenario == "create":
        argv.append("--create")

    def reset() -> bytes | None:
        src.write_bytes(source)
        if scenario == "overwrite":
            dst.write_bytes(OLD)
            return OLD
        if scenario == "create":
            dst.unlink(missing_ok=True)
            return None
        return source

    before = reset()
    calib = run_child(cli(argv))
    assert calib.status == 0, calib.stderr
    new = dst.read_bytes()
    assert new != source
    ev = calib.events
    rng = random.Random(hash(scenario) & 0xFFFF)
    landed: Counter[str] = Counter()
    for run in range(RUNS_PER_SCENARIO):
        sig = signal.SIGINT if (run // 4) % 2 else signal.SIGKILL
        k = kill_point(ev, run, rng)
        before = reset()
        out = run_child(cli(argv), kill_at=k, sig=sig)
        phase, is_new = expect_specialize(out, sig, k, ev, str(dst))
        landed[f"{signal.Signals(sig).name} {phase}"] += 1
        got = dst.read_bytes() if dst.exists() else None
        assert got == (new if is_new else before), f"run {run}: {phase} at {ev[k]}"
        if scenario != "in-place":
            assert src.read_bytes() == source, f"run {run}: the source changed"
        left = collect_local(tmp_path, older_than=0)
        if sig == signal.SIGINT:
            assert left == [], f"run {run}: a clean interrupt left {left}"
        assert staging_files(tmp_path) == []
    quarter = RUNS_PER_SCENARIO // 8  # per signal and phase choice
    assert landed == {
        f"{name} {phase}": n * quarter
        for name in ("SIGKILL", "SIGINT")
        for phase, n in (("before", 2), ("uncertain", 1), ("after", 1))
    }, landed


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["overwrite", "create"])
def test_specialize_sigint_and_sigkill_on_s3(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str, s3_client: Any, scenario: str
) -> None:
    assert MODEL.pte_path is not None
    source = MODEL.pte_path.read_bytes()
    s3_client.put_object(Bucket=s3_bucket, Key="in.pte", Body=source)
    dst = f"s3://{s3_bucket}/out.pte"
    opts = [f"-o{k}={v}" for k, v in moto_s3.storage_options.items() if isinstance(v, str)]
    opts += ["-o", 'client_kwargs={"region_name": "us-east-1"}', "-o", "part_size=4096"]
    argv = ["specialize", f"s3://{s3_bucket}/in.pte", dst, "-q", *opts]
    argv += ["--backend", "support.crash_backend:Reverse", "--no-provenance"]
    if scenario == "create":
        argv.append("--create")

    def get() -> bytes | None:
        try:
            body: bytes = s3_client.get_object(Bucket=s3_bucket, Key="out.pte")["Body"].read()
        except s3_client.exceptions.NoSuchKey:
            return None
        return body

    def reset() -> bytes | None:
        if scenario == "overwrite":
            s3_client.put_object(Bucket=s3_bucket, Key="out.pte", Body=OLD)
            return OLD
        s3_client.delete_object(Bucket=s3_bucket, Key="out.pte")
        return None

    reset()
    calib = run_child(cli(argv, s3_parts=True))
    assert calib.status == 0, calib.stderr
    new = get()
    assert new is not None and new != source
    ev = calib.events
    assert ev.count("part") >= 4, ev  # a multipart upload of 4 KiB parts
    rng = random.Random(5)
    landed: Counter[str] = Counter()
    for run in range(S3_RUNS_PER_SCENARIO):
        sig = signal.SIGINT if (run // 4) % 2 else signal.SIGKILL
        k = kill_point(ev, run, rng)
        before = reset()
        out = run_child(cli(argv, s3_parts=True), kill_at=k, sig=sig)
        phase, is_new = expect_specialize(out, sig, k, ev, dst)
        landed[f"{signal.Signals(sig).name} {phase}"] += 1
        if ev[k] == "part":
            landed["mid-upload"] += 1
        assert get() == (new if is_new else before), f"run {run}: {phase} at {ev[k]}"
        entries = collect_s3(f"s3://{s3_bucket}/", older_than=0, **moto_s3.storage_options)
        if sig == signal.SIGINT:
            assert entries == [], f"run {run}: a clean interrupt left {entries}"
        assert all(e.action == "removed" for e in entries), entries
        for up in s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []):
            # killed between CreateMultipartUpload and the marker part: an empty upload
            # gc cannot prove is ours (the lifecycle rule removes those)
            listed = s3_client.list_parts(Bucket=s3_bucket, Key=up["Key"], UploadId=up["UploadId"])
            assert listed.get("Parts", []) == [], f"run {run}: gc left an upload with parts"
            s3_client.abort_multipart_upload(
                Bucket=s3_bucket, Key=up["Key"], UploadId=up["UploadId"]
            )
        assert s3_client.get_object(Bucket=s3_bucket, Key="in.pte")["Body"].read() == source
    eighth = S3_RUNS_PER_SCENARIO // 8
    assert landed["SIGKILL before"] == landed["SIGINT before"] == 2 * eighth, landed
    assert landed["SIGKILL uncertain"] == landed["SIGINT uncertain"] == eighth, landed
    assert landed["SIGKILL after"] == landed["SIGINT after"] == eighth, landed
    assert landed["mid-upload"] >= 1, landed
