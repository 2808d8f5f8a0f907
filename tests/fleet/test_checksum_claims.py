"""What an S3 server claims of an object that proves nothing (``trust_by_head``,
:mod:`ptestore.storage.s3checksum`): a stored checksum that is not a well-formed value of
its algorithm, or a part count S3 cannot have made (``PartsCount`` of a ``HEAD`` of part
1, a checksum's ``-N``, past S3's 10,000), is undecided (the bytes are read), never
trusted and never proof of damage, and nothing is built per claimed part. The servers
the suite runs (moto, SeaweedFS) make neither, so the answers are given by a stand-in
for the requests."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from ptestore.checksums import ExpectedChecksums, encode
from ptestore.fleet.binding import trust_by_head
from ptestore.storage import s3checksum
from ptestore.storage.s3checksum import stored_checksum

#: S3's most parts of an object.
MAX_PARTS = 10_000


class S3FileSystem:
    """What :func:`s3checksum.s3_object` recognizes as s3fs (by the class name)."""

    def split_path(self, path: str) -> tuple[str, str, None]:
        return ("bucket", "key", None)


class Loader:
    name = "s3://bucket/key"
    path = "bucket/key"
    etag = '"e"'
    fs = S3FileSystem()


def _answers(monkeypatch: pytest.MonkeyPatch, **by_request: dict[str, Any]) -> None:
    """``S3Object``'s requests answered from ``by_request`` (``head``: the checksum HEAD,
    ``attributes``: GetObjectAttributes, ``part1``: the HEAD of part 1)."""

    def call(self: s3checksum.S3Object, operation: str, **params: Any) -> dict[str, Any]:
        self.requests += 1
        if operation == "get_object_attributes":
            return {"ETag": "e", **by_request.get("attributes", {})}
        which = "part1" if params.get("PartNumber") == 1 else "head"
        return {"ETag": '"e"', **by_request[which]}

    monkeypatch.setattr(s3checksum.S3Object, "_call", call)


@pytest.mark.parametrize("value", ["!!not base64!!", "AAAA", "AAAAAAAA"])
def test_a_malformed_full_object_checksum_is_read_not_damage(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Not base64, or not the algorithm's width: read, never "damaged" (a shared .ptd
    uploaded again, a pair run again for nothing)."""
    head = {"ContentLength": 10, "ChecksumCRC32": value, "ChecksumType": "FULL_OBJECT"}
    _answers(monkeypatch, head=head)
    got = trust_by_head(Loader(), ExpectedChecksums(10, {"CRC32": 123}))
    assert got.trusted is None
    assert got.reason == f"the stored CRC32 {value!r} is malformed"
    # A well-formed one that differs is still proof of damage.
    head["ChecksumCRC32"] = encode("CRC32", 124)
    assert trust_by_head(Loader(), ExpectedChecksums(10, {"CRC32": 123})).trusted is False


def test_a_part_count_s3_cannot_have_made_is_not_believed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PartsCount`` of 20 million (1-byte parts of a 20 MB object): no grid is built
    from it (memory and time bounded), the object is read."""
    size = 20_000_000
    _answers(
        monkeypatch,
        head={"ContentLength": size, "ChecksumCRC32": "AAAAAQ=="},
        part1={"ContentLength": 1, "PartsCount": size},
    )
    tracemalloc.start()
    try:
        got = trust_by_head(Loader(), ExpectedChecksums(size, {"CRC32": 12345}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (got.trusted, got.reason) == (None, "the object's parts are unknown")
    assert peak < 1 << 20  # a tuple per claimed part was 160 MB
    # At S3's limit the grid is still taken (and judged on it).
    _answers(
        monkeypatch,
        head={"ContentLength": MAX_PARTS, "ChecksumCRC32": "AAAAAQ=="},
        part1={"ContentLength": 1, "PartsCount": MAX_PARTS},
    )
    parts = s3checksum.s3_object(Loader())
    assert parts is not None and parts.checksum() is not None
    listed = parts.parts("CRC32")
    assert listed is not None and len(listed.sizes) == MAX_PARTS and listed.assumed


@pytest.mark.parametrize("suffix", ["10001", "0", "9" * 5000, "\u00b2"])
def test_a_composite_count_s3_cannot_have_made_is_no_checksum(suffix: str) -> None:
    """``<base64>-N`` with N past 10,000, zero, too long to be a number, or not ASCII
    digits: no checksum is reported (a read), never an exception."""
    assert stored_checksum({"ChecksumCRC32": f"AAAAAQ==-{suffix}"}) is None
    assert stored_checksum({"ChecksumCRC32": "AAAAAQ==-10000"}) is not None
