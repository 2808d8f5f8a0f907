"""``content.crcs`` in the provenance record: the CRC-32 of every 4 MiB chunk (every
run) and, for an output to S3, the CRC-32C and CRC64NVME of the bytes before the
trailer and of every chunk, checked against zlib and awscrt; recorded by a real run,
read back, malformed fields named, older records still read."""

from __future__ import annotations

import base64
import copy
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
from awscrt import checksums as crt
from support.fixtures import get_fixture
from support.large import inflate

import ptestore
from ptestore.checksums import GridCRCs, encode
from ptestore.errors import FormatError
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.provenance.crcs import (
    MAX_CRC_CHUNKS,
    STORE_CRCS,
    ContentCRCs,
    expected_checksums,
)
from ptestore.provenance.digest import ContentHasher
from ptestore.provenance.record import ContentDigest
from ptestore.storage.loaders import open_loader
from ptestore.testing.s3server import S3TestServer

FX = get_fixture("mlp_xnnpack")
MiB = 1 << 20


def _independent(algorithm: str, data: bytes) -> int:
    fn = {"CRC32": zlib.crc32, "CRC32C": crt.crc32c, "CRC64NVME": crt.crc64nvme}[algorithm]
    return int(fn(data))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real program of about 12 MiB (three 4 MiB chunks), specialized with the default
    provenance."""
    tmp = tmp_path_factory.mktemp("crcs")
    assert FX.pte_path is not None
    inflate(FX.pte_path, tmp / "big.pte", 3 * MiB)
    ptestore.specialize(tmp / "big.pte", tmp / "out.pte", backends=["passthrough"])
    return tmp / "out.pte"


def test_a_local_run_records_the_per_chunk_crc32(made: Path) -> None:
    """A local output records the CRC-32 of every chunk (zlib): CRC-32C and CRC64NVME
    are for outputs to a store that keeps checksums (S3), whatever ran before."""
    loader = open_loader(made)
    trailer = read_trailer(loader)
    prov = read_provenance(loader)
    loader.close()
    assert trailer is not None and prov is not None and prov.content is not None
    data = made.read_bytes()[: trailer.content_size]
    crcs = prov.content.crcs
    assert crcs is not None and crcs.chunk_size == CHUNK_SIZE and crcs.length == len(data)
    assert prov.content.crc32 == zlib.crc32(data)
    assert crcs.full == {} and set(crcs.chunks) == {"CRC32"}
    want = [zlib.crc32(data[i : i + CHUNK_SIZE]) for i in range(0, len(data), CHUNK_SIZE)]
    assert list(crcs.chunks["CRC32"]) == want and len(want) == -(-len(data) // CHUNK_SIZE)
    # an upload with boto3's defaults (8 MiB parts) is predicted from them
    whole = made.read_bytes()
    expected = expected_checksums(prov.content, trailer.raw())
    assert expected.parts("CRC32", [8 * MiB, len(whole) - 8 * MiB]) == [
        zlib.crc32(whole[: 8 * MiB]),
        zlib.crc32(whole[8 * MiB :]),
    ]
    assert expected.full("CRC64NVME") is None  # not recorded: a read, if ever needed
    assert trailer.record()["content"]["crcs"] == {
        "size": CHUNK_SIZE,
        "chunks": {
            "crc32": base64.b64encode(b"".join(v.to_bytes(4, "big") for v in want)).decode()
        },
    }


def test_an_output_to_s3_records_every_crc() -> None:
    """What the digest of an output to S3 records (``STORE_CRCS``), against awscrt."""
    data = os.urandom(2 * CHUNK_SIZE + 12345)
    h = ContentHasher(len(data), crcs=STORE_CRCS)
    for i in range(0, len(data), 3 * MiB):
        h.update(data[i : i + 3 * MiB])
    crcs = h.digest().crcs
    assert crcs is not None
    for algorithm in ("CRC32C", "CRC64NVME"):
        assert crcs.full[algorithm] == _independent(algorithm, data)
    for algorithm in ("CRC32", "CRC32C", "CRC64NVME"):
        want = [
            _independent(algorithm, data[i : i + CHUNK_SIZE])
            for i in range(0, len(data), CHUNK_SIZE)
        ]
        assert list(crcs.chunks[algorithm]) == want
    raw = crcs.to_dict()
    assert raw["crc64nvme"] == encode("CRC64NVME", crcs.full["CRC64NVME"])
    assert sorted(raw["chunks"]) == ["crc32", "crc32c", "crc64nvme"]
    assert ContentCRCs.from_dict(raw, len(data), "x.pte", "content") == crcs


def _dict(made: Path) -> dict[str, Any]:
    loader = open_loader(made)
    trailer = read_trailer(loader)
    loader.close()
    assert trailer is not None
    content = copy.deepcopy(trailer.record()["content"])
    content["crcs"]["crc64nvme"] = encode("CRC64NVME", 1)  # as an output to S3 has
    return content


def test_read_back_and_older_records(made: Path) -> None:
    d = _dict(made)
    content = ContentDigest.from_dict(d, "x.pte", "content")
    assert content.crcs is not None
    assert ContentDigest.from_dict(content.to_dict(), "x.pte", "content").crcs == content.crcs
    del d["crcs"]  # a record made before the CRCs were kept (or without awscrt)
    old = ContentDigest.from_dict(d, "x.pte", "content")
    assert old.crcs is None and old == content  # not compared: the SHA-256 names the bytes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c.update(size=123),
            r"x\.pte: provenance content\.crcs\.size = 123: must be 4194304 \(the chunk size\)",
        ),
        (
            lambda c: c.update(crc64nvme="nope"),
            r"provenance content\.crcs\.crc64nvme = 'nope': must be base64 of the 8 bytes of a "
            r"CRC64NVME",
        ),
        (
            lambda c: c["chunks"].update(crc32="AAAA"),
            r"provenance content\.crcs\.chunks\.crc32 = '3 bytes': must be base64 of 4 CRC32 "
            r"values \(16 bytes\)",
        ),
        (
            lambda c: c.update(chunks=[]),
            r"provenance content\.crcs\.chunks = \[\]: must be an object",
        ),
    ],
)
def test_malformed_crcs_are_named(made: Path, change: Any, message: str) -> None:
    d = _dict(made)
    change(d["crcs"])
    with pytest.raises(FormatError, match=message):
        ContentDigest.from_dict(d, "x.pte", "content")


def test_no_chunk_crcs_past_the_limit() -> None:
    grid = GridCRCs(1)
    data = bytes(range(256)) * 20  # 5120 one-byte chunks
    grid.update(data)
    crcs = ContentCRCs.from_grid(grid, len(data))
    assert len(data) > MAX_CRC_CHUNKS and crcs.chunks == {}
    assert crcs.full["CRC64NVME"] == _independent("CRC64NVME", data)


@pytest.mark.s3
def test_a_reproduced_s3_source_records_what_each_destination_needs(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    """An output that reproduces an S3 source (its digest kept per source version, so a
    job's many devices read it once) records the CRCs of its own destination, whatever
    ran before it in the process: an output to S3 after a local one got the local set
    (CRC-32 only), and its object, stored with CRC64NVME, could not be trusted by HEAD;
    a local one after an S3 one got every CRC."""
    assert FX.pte_path is not None
    bucket = s3_server.new_bucket()
    opts = dict(s3_server.storage_options)
    s3_server.client().put_object(Bucket=bucket, Key="src.pte", Body=FX.pte_path.read_bytes())
    src = f"s3://{bucket}/src.pte"

    def recorded(dst: str, **kw: Any) -> tuple[list[str], list[str]]:
        ptestore.specialize(src, dst, allow_unchanged=True, src_storage_options=opts, **kw)
        loader = open_loader(dst, **(opts if dst.startswith("s3://") else {}))
        try:
            prov = read_provenance(loader)
        finally:
            loader.close()
        assert prov is not None and prov.content is not None and prov.content.crcs is not None
        return sorted(prov.content.crcs.full), sorted(prov.content.crcs.chunks)

    everything = (["CRC32C", "CRC64NVME"], ["CRC32", "CRC32C", "CRC64NVME"])
    local = ([], ["CRC32"])
    assert recorded(str(tmp_path / "a.pte")) == local
    assert recorded(f"s3://{bucket}/a.pte", storage_options=opts) == everything
    assert recorded(str(tmp_path / "b.pte")) == local
