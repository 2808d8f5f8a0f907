"""ptestore.checksums: S3's algorithms computed, combined, encoded and predicted.

The CRC combination is ptestore's own arithmetic; every property is checked against the
library that computes the CRCs (awscrt, botocore's own CRT), on random data and random
splits.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import sys
import zlib
from collections.abc import Iterator

import pytest
from awscrt import checksums as crt
from hypothesis import given, settings
from hypothesis import strategies as st

from ptestore import checksums
from ptestore.checksums import (
    CRC_ALGORITHMS,
    ChecksumUnavailable,
    ExpectedChecksums,
    GridCRCs,
    Hasher,
    available,
    combine_all,
    composite,
    crc,
    crc_combine,
    decode,
    encode,
)
from ptestore.errors import ConfigurationError
from ptestore.storage.s3checksum import StoredChecksum, stored_checksum
from ptestore.writers.s3.checksum import writer_algorithm

CHECK = b"123456789"  # the CRC catalogue's check input

algorithms = st.sampled_from(CRC_ALGORITHMS)


def library(algorithm: str, data: bytes) -> int:
    """The CRC as the library computes it, independently of ptestore."""
    fn = {"CRC32": crt.crc32, "CRC32C": crt.crc32c, "CRC64NVME": crt.crc64nvme}[algorithm]
    return int(fn(data))


def test_the_catalogue_check_values() -> None:
    assert crc("CRC32", CHECK) == 0xCBF43926
    assert crc("CRC32C", CHECK) == 0xE3069283
    assert crc("CRC64NVME", CHECK) == 0xAE8B14860A799888


@settings(max_examples=60, deadline=None)
@given(algorithm=algorithms, data=st.binary(max_size=4096), cut=st.integers(0, 4096))
def test_combine_joins_any_split(algorithm: str, data: bytes, cut: int) -> None:
    a, b = data[: cut % (len(data) + 1)], data[cut % (len(data) + 1) :]
    joined = crc_combine(algorithm, library(algorithm, a), library(algorithm, b), len(b))
    assert joined == library(algorithm, data) == crc(algorithm, data)


@settings(max_examples=30, deadline=None)
@given(
    algorithm=algorithms,
    pieces=st.lists(st.binary(max_size=512), min_size=1, max_size=8),
)
def test_combine_all_over_many_pieces(algorithm: str, pieces: list[bytes]) -> None:
    values = [(library(algorithm, p), len(p)) for p in pieces]
    assert combine_all(algorithm, values) == library(algorithm, b"".join(pieces))


@settings(max_examples=20, deadline=None)
@given(
    algorithm=algorithms,
    a=st.integers(0, 2**64 - 1),
    b=st.integers(0, 2**64 - 1),
    c=st.integers(0, 2**64 - 1),
    lb=st.integers(0, 1 << 45),
    lc=st.integers(0, 1 << 45),
)
def test_combine_is_associative_for_huge_lengths(
    algorithm: str, a: int, b: int, c: int, lb: int, lc: int
) -> None:
    mask = (1 << (8 * checksums.width(algorithm))) - 1
    a, b, c = a & mask, b & mask, c & mask
    left = crc_combine(algorithm, crc_combine(algorithm, a, b, lb), c, lc)
    right = crc_combine(algorithm, a, crc_combine(algorithm, b, c, lc), lb + lc)
    assert left == right


@pytest.mark.parametrize("algorithm", CRC_ALGORITHMS)
def test_combine_over_megabytes_of_zeros(algorithm: str) -> None:
    zeros = bytes(3 << 20)
    head = b"ptestore"
    want = library(algorithm, head + zeros)
    assert crc_combine(algorithm, crc(algorithm, head), crc(algorithm, zeros), len(zeros)) == want


def test_combine_refuses_what_is_no_crc() -> None:
    with pytest.raises(ValueError, match="'SHA256' is not a CRC"):
        crc_combine("SHA256", 1, 2, 3)
    with pytest.raises(ValueError, match="length -1 < 0"):
        crc_combine("CRC32", 1, 2, -1)
    with pytest.raises(ValueError, match="unknown checksum algorithm 'MD5'"):
        available("MD5")


def test_encode_and_decode_as_s3_writes_them() -> None:
    assert encode("CRC32", 0xCBF43926) == base64.b64encode(bytes.fromhex("cbf43926")).decode()
    assert decode("CRC64NVME", encode("CRC64NVME", 0xAE8B14860A799888)) == 0xAE8B14860A799888
    sha = hashlib.sha256(CHECK).digest()
    assert decode("SHA256", encode("SHA256", sha)) == sha
    assert decode("CRC32", "not base64!") is None
    assert decode("CRC64NVME", encode("CRC32", 1)) is None  # 4 bytes, not 8


def test_composite_is_the_checksum_of_the_part_checksums() -> None:
    parts = [b"a" * 100, b"b" * 7]
    values = [zlib.crc32(p) for p in parts]
    raw = b"".join(v.to_bytes(4, "big") for v in values)
    assert composite("CRC32", values) == f"{encode('CRC32', zlib.crc32(raw))}-2"
    digests = [hashlib.sha256(p).digest() for p in parts]
    assert composite("SHA256", digests) == (
        base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode() + "-2"
    )


def test_hasher_by_algorithm() -> None:
    for algorithm in ("CRC32", "CRC32C", "CRC64NVME", "SHA256", "SHA1"):
        h = Hasher(algorithm)
        h.update(CHECK[:4])
        h.update(memoryview(CHECK)[4:])
        one = Hasher(algorithm)
        one.update(CHECK)
        assert h.value() == one.value()
        assert h.encoded() == encode(algorithm, one.value())
    assert Hasher("SHA1").value() == hashlib.sha1(usedforsecurity=False).digest()


def test_stored_checksum_reads_what_servers_answer() -> None:
    assert stored_checksum({}) is None
    full = stored_checksum({"ChecksumCRC64NVME": "IGkyFPabXFM=", "ChecksumType": "FULL_OBJECT"})
    assert full == StoredChecksum("CRC64NVME", "IGkyFPabXFM=", "FULL_OBJECT", None)
    assert full is not None and full.full_object and not full.composite
    comp = stored_checksum({"ChecksumCRC32": "T0QOYA==-6", "ChecksumType": "COMPOSITE"})
    assert comp == StoredChecksum("CRC32", "T0QOYA==", "COMPOSITE", 6)
    assert comp is not None and comp.composite and str(comp) == "CRC32 T0QOYA==-6 (COMPOSITE)"
    # moto: a composite without its -N and no type; SeaweedFS: a PutObject without type
    bare = stored_checksum({"ChecksumCRC32": "h2DoYA=="})
    assert bare == StoredChecksum("CRC32", "h2DoYA==", None, None)
    assert bare is not None and not bare.full_object and not bare.composite
    assert stored_checksum({"ChecksumCRC32": "abc-x"}) is None


@settings(max_examples=25, deadline=None)
@given(
    data=st.binary(max_size=3000),
    chunk=st.integers(1, 700),
    cuts=st.lists(st.integers(0, 3000), max_size=6),
)
def test_grid_crcs_per_chunk_whatever_the_pieces(data: bytes, chunk: int, cuts: list[int]) -> None:
    grid = GridCRCs(chunk)
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in itertools.pairwise(edges):
        grid.update(data[a:b])
    result = grid.result()
    for algorithm in CRC_ALGORITHMS:
        want = [library(algorithm, data[i : i + chunk]) for i in range(0, len(data), chunk)]
        assert list(result[algorithm]) == want
        assert grid.full(algorithm) == library(algorithm, data)


def _expected(body: bytes, tail: bytes, chunk: int) -> ExpectedChecksums:
    grid = GridCRCs(chunk)
    grid.update(body)
    return ExpectedChecksums(len(body), chunk_size=chunk, chunk_crcs=grid.result(), tail=tail)


@settings(max_examples=40, deadline=None)
@given(
    algorithm=algorithms,
    body=st.binary(min_size=1, max_size=4000),
    tail=st.binary(max_size=300),
    chunk=st.integers(1, 512),
    multiples=st.lists(st.integers(1, 4), min_size=1, max_size=6),
)
def test_expected_part_checksums_on_the_chunk_grid(
    algorithm: str, body: bytes, tail: bytes, chunk: int, multiples: list[int]
) -> None:
    obj = body + tail
    exp = _expected(body, tail, chunk)
    assert exp.full(algorithm) == library(algorithm, obj)
    sizes: list[int] = []
    for m in multiples:  # parts that are multiples of the chunk size, the rest last
        if sum(sizes) + m * chunk >= len(obj):
            break
        sizes.append(m * chunk)
    sizes.append(len(obj) - sum(sizes))
    got = exp.parts(algorithm, sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    want = [library(algorithm, obj[s : s + n]) for s, n in zip(starts, sizes, strict=True)]
    # a boundary inside the body but off the chunk grid cannot be predicted
    off_grid = any(s % chunk and s < len(body) for s in starts[1:])
    assert got == (None if off_grid else want)


def test_expected_parts_split_the_tail_anywhere() -> None:
    body, tail = bytes(range(256)) * 32, b"trailer bytes" * 10  # 8192 + 130
    exp = _expected(body, tail, 1024)
    sizes = [4096, 4096 + 50, 80]  # the last boundary falls inside the tail
    obj = body + tail
    assert exp.parts("CRC32", sizes) == [
        zlib.crc32(obj[:4096]),
        zlib.crc32(obj[4096:8242]),
        zlib.crc32(obj[8242:]),
    ]
    assert exp.parts("CRC32", [100, len(obj) - 100]) is None  # inside a chunk
    assert exp.parts("CRC32", [len(obj) + 1]) is None  # not this object's size
    whole = ExpectedChecksums(len(body), {"CRC32": zlib.crc32(body)}, tail=tail)
    assert whole.parts("CRC32", [len(obj)]) == [zlib.crc32(obj)]
    assert whole.parts("CRC32", [len(body), len(tail)]) == [zlib.crc32(body), zlib.crc32(tail)]
    assert whole.parts("CRC32", [4096, len(obj) - 4096]) is None
    assert whole.full("CRC64NVME") is None  # nothing known of that algorithm
    assert ExpectedChecksums(3, sha256=b"x" * 32).full("SHA256") == b"x" * 32


@pytest.fixture
def no_awscrt(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process where awscrt cannot be imported."""
    monkeypatch.setitem(sys.modules, "awscrt", None)
    monkeypatch.setitem(sys.modules, "awscrt.checksums", None)
    checksums.crt_module.cache_clear()
    yield
    monkeypatch.undo()
    checksums.crt_module.cache_clear()


@pytest.mark.usefixtures("no_awscrt")
def test_without_awscrt_nothing_is_guessed() -> None:
    assert not available("CRC64NVME") and not available("CRC32C")
    assert available("CRC32") and available("SHA256")
    with pytest.raises(
        ChecksumUnavailable,
        match=r"computing CRC64NVME needs the awscrt package, which is not installed: "
        r"pip install 'ptestore\[s3\]'",
    ):
        crc("CRC64NVME", b"x")
    with pytest.raises(ChecksumUnavailable):
        Hasher("CRC32C")
    grid = GridCRCs(4)
    grid.update(b"abcdefgh")
    assert set(grid.result()) == {"CRC32"}
    # combining needs no library: a recorded value still predicts a tail-less object
    known = ExpectedChecksums(3, {"CRC64NVME": 7})
    assert known.full("CRC64NVME") == 7
    assert ExpectedChecksums(3, {"CRC64NVME": 7}, tail=b"t").full("CRC64NVME") is None
    # the S3 writer falls back to CRC-32 and refuses an explicit CRC64NVME
    assert writer_algorithm("s3://b/k", None) == "CRC32"
    with pytest.raises(
        ConfigurationError,
        match=r"s3://b/k: option checksum_algorithm = 'CRC64NVME' needs the awscrt package",
    ):
        writer_algorithm("s3://b/k", "CRC64NVME")


def test_writer_algorithm_choices() -> None:
    assert writer_algorithm("s3://b/k", None) == "CRC64NVME"
    assert writer_algorithm("s3://b/k", "crc32c") == "CRC32C"
    with pytest.raises(
        ConfigurationError,
        match=r"s3://b/k: option checksum_algorithm = 'SHA256': must be one of "
        r"\['CRC64NVME', 'CRC32', 'CRC32C'\] \(S3's FULL_OBJECT checksums\)",
    ):
        writer_algorithm("s3://b/k", "SHA256")
