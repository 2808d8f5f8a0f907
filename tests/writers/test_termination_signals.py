"""SIGTERM and SIGHUP are handled as Ctrl-C (ptestore._signals): a forked
``ptestore specialize`` that receives one before its commit point cleans up (no staging
file locally, no multipart upload with parts on S3), says so and exits 130; one that
receives it after publishing names what was published. ``fleet run`` takes the same
path. (SIGINT and SIGKILL at every phase: tests/writers/test_crash.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore._signals import Terminated, termination_as_interrupt
from ptestore.gc import collect_local, collect_s3
from ptestore.testing.moto import MotoS3

from .stepper import run_child
from .test_crash import cli, first, staging_files

MODEL = get_fixture("mlp_xnnpack_align4096")
SIGNALS = [signal.SIGTERM, signal.SIGHUP]
# --no-provenance: the comparisons are byte for byte (a record names its time of making)
BACKEND = ["--backend", "support.crash_backend:Reverse", "--no-provenance"]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_specialize_locally(tmp_path: Path, sig: int) -> None:
    assert MODEL.pte_path is not None
    src, dst = tmp_path / "in.pte", tmp_path / "out.pte"
    src.write_bytes(MODEL.pte_path.read_bytes())
    argv = ["specialize", str(src), str(dst), "-q", *BACKEND]
    calib = run_child(cli(argv))
    assert calib.status == 0, calib.stderr
    new = dst.read_bytes()
    dst.unlink()
    name = signal.Signals(sig).name
    # Mid-write, before the commit point: nothing published, nothing left.
    out = run_child(cli(argv), kill_at=first(calib.events, "commit") - 1, sig=sig)
    assert out.status == 130, out.stderr
    assert (
        out.stderr.strip() == f"ptestore specialize: interrupted by {name}; nothing was published"
    )
    assert not dst.exists()
    assert staging_files(tmp_path) == [] and collect_local(tmp_path, older_than=0) == []
    if sig != signal.SIGTERM:
        return
    # After publishing: the message names what was published.
    out = run_child(cli(argv), kill_at=first(calib.events, "published"), sig=sig)
    assert out.status == 130, out.stderr
    assert (
        out.stderr.strip()
        == f"ptestore specialize: interrupted by {name} after {dst} was published"
    )
    assert dst.read_bytes() == new
    assert staging_files(tmp_path) == []


@pytest.mark.s3
def test_specialize_on_s3_leaves_no_upload(moto_s3: MotoS3) -> None:
    """Mid-upload (moto: small parts, so the run is a multipart upload of many parts)."""
    assert MODEL.pte_path is not None
    sig = signal.SIGTERM
    s3_bucket, s3_client = moto_s3.new_bucket(), moto_s3.client()
    s3_client.put_object(Bucket=s3_bucket, Key="in.pte", Body=MODEL.pte_path.read_bytes())
    opts = [f"-o{k}={v}" for k, v in moto_s3.storage_options.items() if isinstance(v, str)]
    opts += ["-o", 'client_kwargs={"region_name": "us-east-1"}', "-o", "part_size=4096"]
    argv = ["specialize", f"s3://{s3_bucket}/in.pte", f"s3://{s3_bucket}/out.pte", "-q", *opts]
    argv += BACKEND
    calib = run_child(cli(argv, s3_parts=True))
    assert calib.status == 0, calib.stderr
    s3_client.delete_object(Bucket=s3_bucket, Key="out.pte")
    parts = [i for i, e in enumerate(calib.events) if e == "part"]
    assert len(parts) >= 2
    out = run_child(cli(argv, s3_parts=True), kill_at=parts[1], sig=sig)
    assert out.status == 130, out.stderr
    assert "interrupted by " + signal.Signals(sig).name + "; nothing was published" in out.stderr
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert collect_s3(f"s3://{s3_bucket}/", older_than=0, **moto_s3.storage_options) == []
    listed = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == ["in.pte"]


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.sigtimedwait([], 0)  # let the handler run


def test_the_handler_is_scoped_and_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with termination_as_interrupt():
        with pytest.raises(Terminated) as info, termination_as_interrupt():
            _terminate_self()
        assert info.value.signal_name == "SIGTERM"
        assert isinstance(info.value, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGTERM) is not before  # the outer one is active
    assert signal.getsignal(signal.SIGTERM) is before


def test_fleet_run_takes_the_interrupt_path(tmp_path: Path) -> None:
    """A SIGTERM during ``fleet run`` ends it with the interrupt message and 130."""
    assert MODEL.pte_path is not None
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        'backends = ["support.crash_backend:Reverse"]\n'
        f'[[models]]\nname = "m"\nsource = "{MODEL.pte_path}"\n[devices.a]\n'
    )
    argv = ["fleet", "run", str(job), "--quiet"]
    calib = run_child(cli(argv))
    assert calib.status == 0, calib.stderr
    (tmp_path / "out" / "a" / "m.pte").unlink()
    out = run_child(cli(argv), kill_at=first(calib.events, "commit") - 1, sig=signal.SIGTERM)
    assert out.status == 130, out.stderr
    assert out.stderr.strip().startswith("ptestore fleet: interrupted by SIGTERM")
    assert not (tmp_path / "out" / "a" / "m.pte").exists()
    assert collect_local(tmp_path, older_than=0) == []
