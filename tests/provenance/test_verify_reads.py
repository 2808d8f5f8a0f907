"""What ``verify`` reads: a ``--source``'s own bytes (never what its trailer says of
them), one version of an S3 artifact (a re-publish meanwhile is "changed while being
verified", exit 1, not a damaged artifact), the storage options of ``--range`` routed as
the rest of verify's, and an empty ``--range`` refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate

import ptestore
from ptestore import verify
from ptestore.cli import main
from ptestore.errors import ConfigurationError, PreconditionFailed, StorageError
from ptestore.provenance import check_bytes
from ptestore.storage.filesystems import close_filesystem, s3_filesystem, s3_options
from ptestore.storage.loaders import open_loader
from ptestore.testing.s3server import S3TestServer

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
KEYS = [e["key"] for e in ptestore.describe(MLP.pte_path)["named_data"]]


def _made(src: Path | str, out: Path, key: str, **kw: Any) -> Path:
    ptestore.specialize(src, out, backends=[ReplaceKey("XnnpackBackend", key)], **kw)
    return out


def test_a_source_with_a_damaged_byte_is_not_the_source(tmp_path: Path) -> None:
    """The source is itself an artifact (it ends with a trailer naming its chunks): its
    trailer still names the bytes as they were, so only reading them tells."""
    s0 = tmp_path / "s0.pte"
    inflate(MLP.pte_path, s0, 3 << 20)  # ~12 MiB: chunks the trailer names
    keys = [e["key"] for e in ptestore.describe(s0)["named_data"]]
    s1 = _made(s0, tmp_path / "s1.pte", keys[0])
    out = _made(s1, tmp_path / "out.pte", keys[1])
    assert verify(out, source=s1).status == "current"
    made = verify(out).provenance
    assert made is not None and made.source is not None
    data = bytearray(s1.read_bytes())
    data[5 << 20] ^= 0xFF  # in chunk 1 of s1's content, not in the trailer's chunk
    s1.write_bytes(bytes(data))
    assert verify(s1).exit_code == 2  # damaged, by its own record
    report = verify(out, source=s1)
    assert report.status == "stale" and report.exit_code == 1
    [finding] = report.findings
    assert finding.field == "source.sha256"
    assert finding.message.startswith(
        f"the artifact was made from {made.source.url} ({made.source.size} bytes, "
        f"{made.source.sha256}), not from {s1} ({made.source.size} bytes, sha256-tree:"
    )
    assert made.source.sha256 not in finding.message.rpartition("not from")[2]


def _artifacts(tmp_path: Path) -> tuple[bytes, bytes]:
    a = _made(MLP.pte_path, tmp_path / "a.pte", KEYS[0])
    b = _made(MLP.pte_path, tmp_path / "b.pte", KEYS[1])
    return a.read_bytes(), b.read_bytes()


@pytest.mark.s3
def test_an_artifact_republished_while_verified_is_changed_not_damaged(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _artifacts(tmp_path)
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/out.pte"
    etag = client.put_object(Bucket=bucket, Key="out.pte", Body=a)["ETag"]
    opts = s3_server.storage_options
    assert verify(url, storage_options=opts).exit_code == 0
    # The filesystem verify's loader uses (the process's shared one for its options).
    s3fs_class = fsspec.get_filesystem_class("s3")
    shared = s3_filesystem(s3fs_class, s3_options(s3fs_class, opts), shared=True)
    events = shared.s3.meta.events
    gets: list[dict[str, Any]] = []
    new: list[str] = []

    def republish_after_the_first_read(params: dict[str, Any], **_: Any) -> None:
        gets.append(params)
        if len(gets) == 2:  # verify read the trailer of A; B is published
            new.append(client.put_object(Bucket=bucket, Key="out.pte", Body=b)["ETag"])

    events.register("before-parameter-build.s3.GetObject", republish_after_the_first_read)
    try:
        with pytest.raises(StorageError) as info:
            verify(url, storage_options=opts)
        gets.clear()
        argv = [f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in opts.items()]
        client.put_object(Bucket=bucket, Key="out.pte", Body=a)
        code = main(["verify", url, *(x for kv in argv for x in ("-o", kv))])
    finally:
        events.unregister("before-parameter-build.s3.GetObject", republish_after_the_first_read)
        close_filesystem(shared)
    assert isinstance(info.value.__cause__, PreconditionFailed)
    assert str(info.value) == (
        f"{url}: changed while being verified (verify it again): {url}: replaced while being "
        f"read: the read of {len(a)} bytes at offset 0, pinned to ETag {etag}, answered 412 "
        f"(the object's ETag is now {new[0]}); the read stops instead of mixing two versions"
    )
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"ptestore verify: error: {url}: changed while being verified (verify it again): "
    )
    assert verify(url, storage_options=opts).exit_code == 0  # B, read alone, is fine


def test_a_local_file_modified_in_place_is_a_precondition_failure(tmp_path: Path) -> None:
    """What verify's content check asks before it calls a digest mismatch damage: a file
    rewritten in place while it was hashed is "changed while being verified"."""
    out = _made(MLP.pte_path, tmp_path / "out.pte", KEYS[0])
    loader = open_loader(out)
    size = loader.size()
    was = out.stat()
    with out.open("r+b") as f:  # the same size, another modification time
        f.write(b"\0")
    now = out.stat()
    with pytest.raises(PreconditionFailed) as info:
        loader.check_unchanged()
    assert str(info.value) == (
        f"{out}: modified while being read (size {size} -> {size}, modified "
        f"{was.st_mtime_ns} -> {now.st_mtime_ns} ns, changed {was.st_ctime_ns} -> "
        f"{now.st_ctime_ns} ns); its content may be a mix of two versions"
    )
    loader.close()


@pytest.mark.s3
def test_range_takes_the_storage_options_verify_routes(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer-side option verify accepts (``part_size``) must not reach the loader
    that ``--range`` opens."""
    a, _ = _artifacts(tmp_path)
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/out.pte"
    client.put_object(Bucket=bucket, Key="out.pte", Body=a)
    argv: list[str] = []
    for k, v in {**s3_server.storage_options, "part_size": 5 << 20}.items():
        argv += ["-o", f"{k}={json.dumps(v) if isinstance(v, dict) else v}"]
    assert main(["verify", url, *argv]) == 0
    capsys.readouterr()
    assert main(["verify", url, *argv, "--range", "0:"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{url}: bytes 0:")
    assert out.endswith("intact (1 chunk of the record checked)")


def test_an_empty_range_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _made(MLP.pte_path, tmp_path / "out.pte", KEYS[0])
    assert main(["verify", str(out), "--range", "7:7"]) == 2
    err = capsys.readouterr().err.strip()
    trailer_start = verify(out).provenance.content.size  # type: ignore[union-attr]
    assert err == (
        f"ptestore verify: error: {out}: byte range 7:7 is empty (END is exclusive): nothing "
        f"to check; give START < END within 0:{trailer_start}"
    )
    with pytest.raises(ConfigurationError, match=r"byte range 0:0 is empty"):
        check_bytes(open_loader(out), (0, 0))
