"""Chunk digests in the provenance record (version 2): they are the SHA-256 of each
4 MiB chunk of the bytes before the trailer (checked against hashlib), the root is the
documented SHA-256 over them, a flipped byte in any chunk is reported with the chunk's
range, a byte range can be checked alone, every run's record (staged, in place,
pass-through, replaced) names the chunks of the bytes it follows, and records written
before chunk digests (version 1, a committed file made by the old code) still read and
verify."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.delta import flip
from support.digests import tree, whole
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate

import ptestore
from ptestore import verify
from ptestore.cli import main
from ptestore.errors import AlreadySpecialized, ConfigurationError, FormatError
from ptestore.provenance import check_bytes, read_provenance, read_trailer
from ptestore.provenance.check import parse_range
from ptestore.provenance.chunks import (
    CHUNK_SIZE,
    MAX_CHUNKS,
    ChunkDigests,
    ChunkHasher,
    chunk_size_for,
    hash_chunks,
    reusable,
)
from ptestore.provenance.digest import ContentHasher, content_digest
from ptestore.provenance.record import ContentDigest
from ptestore.storage.loaders import BytesLoader, open_loader

FX = get_fixture("mlp_xnnpack")
DATA = Path(__file__).parent / "data"
MiB = 1 << 20


def _independent(data: bytes, size: int) -> list[bytes]:
    return [hashlib.sha256(data[i : i + size]).digest() for i in range(0, len(data), size)]


def _root(size: int, length: int, digests: list[bytes]) -> str:
    raw = b"ptestore.chunks\x00" + struct.pack("<QQ", size, length) + b"".join(digests)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _content(path: Path) -> tuple[bytes, ContentDigest]:
    loader = open_loader(path)
    trailer = read_trailer(loader)
    prov = read_provenance(loader)
    assert trailer is not None and prov is not None and prov.content is not None
    return path.read_bytes()[: trailer.content_size], prov.content


def _assert_bound(path: Path) -> ContentDigest:
    """The record's chunks and root are those of the bytes, by hashlib alone."""
    data, content = _content(path)
    assert content.chunks is not None
    assert content.chunks.chunk_size == CHUNK_SIZE
    want = _independent(data, CHUNK_SIZE)
    assert list(content.chunks.digests) == want
    assert content.chunks.root == _root(CHUNK_SIZE, len(data), want)
    assert content.sha256 == tree(data)  # the root names the bytes (record version 3)
    return content


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real program of 4 keys of 3 MiB: about 12 MiB, three 4 MiB chunks."""
    path = tmp_path_factory.mktemp("big") / "big.pte"
    assert FX.pte_path is not None
    inflate(FX.pte_path, path, 3 * MiB)
    return path


@pytest.mark.parametrize("length", [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 9 * MiB])
def test_content_digest_chunks_match_hashlib(length: int) -> None:
    data = bytes((i * 131 + 7) % 256 for i in range(min(length, 4096))) * (length // 4096 + 1)
    data = data[:length]
    got = content_digest(BytesLoader(data), length)
    assert got.chunks is not None
    want = _independent(data, CHUNK_SIZE)
    assert list(got.chunks.digests) == want
    assert len(want) == -(-length // CHUNK_SIZE)
    assert got.chunks.root == _root(CHUNK_SIZE, length, want)
    assert got.sha256 == tree(data)
    # what a record of version 1 or 2 names, computed when a check compares with one
    assert content_digest(BytesLoader(data), length, like="sha256:00").sha256 == whole(data)
    assert hash_chunks(BytesLoader(data), length) == dict(enumerate(want))


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 3 * CHUNK_SIZE + 5),
    cuts=st.lists(st.integers(0, 3 * CHUNK_SIZE + 5), max_size=8),
)
def test_chunk_digests_do_not_depend_on_how_the_bytes_are_fed(length: int, cuts: list[int]) -> None:
    data = (hashlib.sha256(str(length).encode()).digest() * (length // 32 + 1))[:length]
    h = ChunkHasher(length)
    prev = 0
    for cut in sorted({c for c in cuts if c <= length} | {length}):
        h.update(data[prev:cut])
        prev = cut
    got = h.result()
    assert list(got.digests) == _independent(data, CHUNK_SIZE)
    assert ChunkDigests.from_dict(got.to_dict(), length, "f", "content") == got


def test_chunk_size_doubles_past_the_count_limit() -> None:
    assert chunk_size_for(0) == CHUNK_SIZE
    assert chunk_size_for(MAX_CHUNKS * CHUNK_SIZE) == CHUNK_SIZE
    assert chunk_size_for(MAX_CHUNKS * CHUNK_SIZE + 1) == 2 * CHUNK_SIZE
    assert chunk_size_for(100 << 30) == 2 * CHUNK_SIZE  # 12800 chunks of 8 MiB
    assert chunk_size_for(200 << 30) == 4 * CHUNK_SIZE


def test_a_hasher_fed_the_wrong_length_says_so() -> None:
    h = ChunkHasher(10)
    h.update(b"abc")
    with pytest.raises(ValueError, match="chunk hasher fed 3 bytes, expected 10"):
        h.result()


def _good_chunks(length: int = CHUNK_SIZE + 1) -> dict[str, object]:
    return content_digest(BytesLoader(bytes(length)), length).to_dict()["chunks"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"size": 1 << 20},
            "f: provenance content.chunks.size = 1048576: must be 4194304 (the chunk size "
            "of 4194305 bytes)",
        ),
        (
            {"size": True},
            "f: provenance content.chunks.size = True: must be 4194304",
        ),
        (
            {"sha256": "***"},
            "f: provenance content.chunks.sha256 = 'not base64': must be base64 of 2 SHA-256 "
            "digests (64 bytes) for 4194305 bytes in chunks of 4194304",
        ),
        (
            {"sha256": base64.b64encode(bytes(32)).decode()},
            "f: provenance content.chunks.sha256 = '32 bytes': must be base64 of 2 SHA-256 "
            "digests (64 bytes)",
        ),
        (
            {"root": "sha256:00"},
            "f: provenance content.chunks.root = 'sha256:00': must be sha256:",
        ),
    ],
)
def test_damaged_chunk_records_are_refused_by_field(
    change: dict[str, object], message: str
) -> None:
    d = {**_good_chunks(), **change}
    with pytest.raises(FormatError) as err:
        ChunkDigests.from_dict(d, CHUNK_SIZE + 1, "f", "content")
    assert str(err.value).startswith(message)
    with pytest.raises(FormatError, match=r"provenance content\.chunks = 3: must be an object"):
        ChunkDigests.from_dict(3, 1, "f", "content")


def test_every_run_records_the_chunks_of_its_bytes(big: Path, tmp_path: Path) -> None:
    assert FX.pte_path is not None
    staged = tmp_path / "staged.pte"
    ptestore.specialize(big, staged, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    _assert_bound(staged)
    through = tmp_path / "through.pte"
    ptestore.specialize(big, through, allow_unchanged=True)
    _assert_bound(through)
    grown = tmp_path / "grown.pte"
    ptestore.specialize(
        big, grown, backends=[ReplaceKey("XnnpackBackend", _key(big), extra=5 * MiB)]
    )
    assert len(_assert_bound(grown).chunks.digests) == 5  # type: ignore[union-attr]
    for extra in (0, 2 * MiB):  # over its segment; at the end, the old range released
        target = tmp_path / f"inplace{extra}.pte"
        shutil.copyfile(big, target)
        ptestore.specialize(
            target,
            target,
            backends=[ReplaceKey("XnnpackBackend", _key(big), extra=extra)],
            in_place=True,
        )
        _assert_bound(target)
        assert verify(target).status == "intact"
        # In place never runs over its own output again (issue 29): the file is left as
        # it is, still bound to its record.
        with pytest.raises(AlreadySpecialized):
            ptestore.specialize(target, target, in_place=True, allow_unchanged=True)
        _assert_bound(target)


def _key(path: Path) -> str:
    assert FX.doubled is not None
    return FX.doubled.key


def test_a_flipped_byte_in_any_chunk_is_named_with_its_range(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pte"
    ptestore.specialize(big, out, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    data, content = _content(out)
    assert content.chunks is not None
    n = len(content.chunks.digests)
    assert n == 4  # 12 MiB of weights and the metadata
    assert check_bytes(open_loader(out)) == ptestore.provenance.BytesChecked(0, len(data), n)
    for i in range(n):
        a, b = content.chunks.span(i)
        damaged = tmp_path / f"damaged{i}.pte"
        shutil.copyfile(out, damaged)
        flip(damaged, (a + b) // 2)
        with pytest.raises(FormatError) as err:
            check_bytes(open_loader(damaged))
        assert str(err.value) == (
            f"{damaged}: content.chunks[{i}] = "
            f"'{hashlib.sha256(damaged.read_bytes()[a:b]).hexdigest()}': must be "
            f"{content.chunks.digests[i].hex()}, the SHA-256 the record names for bytes "
            f"{a}:{b} (a byte in {a}:{b} was damaged or changed after the record was made)"
        )
        # a range that leaves the damaged chunk out passes, one that touches it fails
        other = (i + 1) % n
        oa, ob = content.chunks.span(other)
        assert check_bytes(open_loader(damaged), (oa + 1, ob - 1)) == (
            ptestore.provenance.BytesChecked(oa, ob, 1)
        )
        with pytest.raises(FormatError, match=rf"content.chunks\[{i}\]"):
            check_bytes(open_loader(damaged), (b - 1, b))
        assert verify(damaged).exit_code == 2


def test_verify_range_on_the_command_line(
    big: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.pte"
    ptestore.specialize(big, out, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    assert main(["verify", str(out), "--range", "0:5"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{out}: bytes 0:4194304 intact (1 chunk of the record checked)"
    )
    flip(out, CHUNK_SIZE + 10)
    assert main(["verify", str(out), "--range", ":"]) == 2
    err = capsys.readouterr().err
    assert "content.chunks[1]" in err and f"bytes {CHUNK_SIZE}:{2 * CHUNK_SIZE}" in err
    assert main(["verify", str(out), "--range", "0:100"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--range", "x"]) == 2
    assert "byte range 'x': expected START:END" in capsys.readouterr().err


def test_an_end_past_the_content_is_its_end(
    big: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """END past the content is clipped to it, as an empty END reaches it (verify --help's
    own example, 0:4194304, was refused on every file smaller than 4 MiB); the verdict
    names the bytes checked, and a damaged chunk in them is still found."""
    out = tmp_path / "out.pte"
    ptestore.specialize(big, out, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    size = _content(out)[1].size
    n = -(-size // CHUNK_SIZE)
    last = (n - 1) * CHUNK_SIZE  # the last chunk, short
    whole = ptestore.provenance.BytesChecked(0, size, n)
    assert check_bytes(open_loader(out), (0, size + 1)) == whole
    assert check_bytes(open_loader(out), (0, 1 << 40)) == whole
    tail = ptestore.provenance.BytesChecked(last, size, 1)
    assert check_bytes(open_loader(out), (size - 1, size + CHUNK_SIZE)) == tail
    assert main(["verify", str(out), "--range", f"{last + 1}:{size + CHUNK_SIZE}"]) == 0
    assert capsys.readouterr().out == (
        f"{out}: bytes {last}:{size} intact (1 chunk of the record checked)\n"
    )
    assert main(["verify", str(out), "--range", f"0:{1 << 40}", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["range"]
    assert shown == {"start": 0, "end": size, "chunks": n}
    small = tmp_path / "small.pte"  # smaller than a chunk, as the README's example
    ptestore.specialize(FX.pte_path, small, backends=["passthrough"], allow_unchanged=True)
    small_size = _content(small)[1].size
    assert small_size < CHUNK_SIZE
    assert main(["verify", str(small), "--range", "0:4194304"]) == 0  # verify --help's example
    assert capsys.readouterr().out == (
        f"{small}: bytes 0:{small_size} intact (1 chunk of the record checked)\n"
    )
    flip(out, size - 1)
    with pytest.raises(FormatError, match=rf"content.chunks\[{n - 1}\]"):
        check_bytes(open_loader(out), (last, size + 1))
    assert main(["verify", str(out), "--range", f"{size - 1}:{size + 1}"]) == 2
    assert f"content.chunks[{n - 1}]" in capsys.readouterr().err


def test_range_refusals(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pte"
    ptestore.specialize(big, out, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    size = _content(out)[1].size
    for start in (size, size + 1):  # at or past the content's end: nothing of it to check
        with pytest.raises(ConfigurationError) as err:
            check_bytes(open_loader(out), (start, size + 10))
        assert str(err.value) == (
            f"{out}: byte range {start}:{size + 10} is outside the content: must be within "
            f"0:{size} (the bytes before the provenance trailer)"
        )
    with pytest.raises(ConfigurationError, match=r"byte range 5:4 is outside"):
        check_bytes(open_loader(out), (5, 4))
    with pytest.raises(ConfigurationError) as err:
        check_bytes(open_loader(big))  # made with provenance=False
    assert str(err.value) == (
        f"{big}: no provenance record names the digests of its bytes (made without "
        "provenance, or by an older ptestore): nothing to check them against"
    )
    assert parse_range("10:") == (10, -1) and parse_range(":7") == (0, 7)
    for bad in ("", "1", "a:b", "1:2:3"):
        with pytest.raises(ConfigurationError, match="expected START:END"):
            parse_range(bad)
    for bad in ("100:-1", "-5:", "-1:-1"):  # -1 is the end only when END is left empty
        with pytest.raises(ConfigurationError) as err:
            parse_range(bad)
        assert str(err.value) == (
            f"byte range {bad!r}: START and END must be >= 0 (byte offsets in the content; "
            "leave END empty for the end)"
        )


def test_a_bad_range_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--range`` is parsed before the artifact is read: a stale verdict no longer
    hides a malformed range (exit 1, the range not mentioned), and a negative END is no
    longer taken as "to the end"."""
    import ptestore.verification

    def not_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("verify read the artifact before refusing the range")

    monkeypatch.setattr(ptestore.verification, "verify", not_read)
    missing = tmp_path / "nothing.pte"
    for bad, said in (
        ("abc", "expected START:END"),
        ("100:-1", "START and END must be >= 0"),
    ):
        assert main(["verify", str(missing), "--device", "other", "--range", bad]) == 2
        err = capsys.readouterr().err
        assert f"byte range {bad!r}: {said}" in err


def test_a_version_1_trailer_made_by_the_old_code_still_reads_and_verifies(
    tmp_path: Path,
) -> None:
    pte = tmp_path / "v1_trailer.pte"
    shutil.copyfile(DATA / "v1_trailer.pte", pte)
    shutil.copyfile(DATA / "v1_trailer.ptd", tmp_path / "v1_trailer.ptd")
    loader = open_loader(pte)
    trailer = read_trailer(loader)
    assert trailer is not None and trailer.version == 1
    assert trailer.raw() == pte.read_bytes()[trailer.content_size :]
    assert trailer.record()["version"] == 1
    prov = read_provenance(loader)
    assert prov is not None and prov.content is not None and prov.content.chunks is None
    assert verify(pte).status == "intact"
    assert check_bytes(open_loader(pte)) == ptestore.provenance.BytesChecked(
        0, trailer.content_size, 0
    )
    with pytest.raises(ConfigurationError) as err:
        check_bytes(open_loader(pte), (0, 10))
    assert str(err.value) == (
        f"{pte}: its provenance record (version 1) names no chunk digests: only the whole "
        f"content (0:{trailer.content_size}) can be checked, not 0:10"
    )
    flip(pte, 100)
    with pytest.raises(FormatError, match=r"content\.sha256 = 'sha256:"):
        check_bytes(open_loader(pte))
    # re-specializing an old artifact writes a version-2 record with chunks
    again = tmp_path / "again.pte"
    ptestore.specialize(DATA / "v1_trailer.pte", again, allow_unchanged=True)
    assert read_trailer(open_loader(again)).version == 2  # type: ignore[union-attr]
    _assert_bound(again)


def test_a_version_2_record_made_by_the_old_code_still_reads_and_verifies(
    tmp_path: Path,
) -> None:
    """Records of version 2 name bytes by their whole SHA-256 (``sha256:``) beside the
    chunk digests: every check computes that one for them; a new run writes version 3
    (``sha256-tree:``). The pair was made by ptestore at 3917b44 (the last version-2
    writer) from tests/fixtures/mlp_xnnpack_ext.pte/.ptd, its .ptd's weights doubled."""
    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    pte, ptd = tmp_path / "v2_trailer.pte", tmp_path / "v2_trailer.ptd"
    shutil.copyfile(DATA / "v2_trailer.pte", pte)
    shutil.copyfile(DATA / "v2_trailer.ptd", ptd)
    trailer = read_trailer(open_loader(pte))
    assert trailer is not None and trailer.record()["version"] == 2
    prov = read_provenance(open_loader(pte))
    assert prov is not None and prov.content is not None and prov.ptd_output is not None
    content = pte.read_bytes()[: trailer.content_size]
    assert prov.content.sha256 == whole(content) and prov.content.chunks is not None
    assert prov.source.sha256 == whole(ext.pte_path.read_bytes())
    assert verify(pte).status == "intact"
    # the source is described as the record does (whole), so it is the one it was made from
    assert verify(pte, source=ext.pte_path).status == "current"
    assert verify(ptd, source=ext.ptd_path).status == "current"
    assert verify(pte, source=ptd).status == "stale"
    assert check_bytes(open_loader(pte), (0, 10)).chunks == 1  # its chunks check by range
    flip(ptd, 200)
    report = verify(pte)
    assert report.status == "invalid" and report.error is not None
    assert report.error.startswith(f"{ptd}: content.sha256 = 'sha256:"), report.error
    flip(ptd, 200)
    flip(pte, 100)
    report = verify(pte)
    assert report.status == "invalid" and report.error is not None
    assert report.error.startswith(f"{pte}: content.sha256 = 'sha256:"), report.error
    flip(pte, 100)
    # re-specializing an old artifact writes a version-3 record named by its chunk root
    again = tmp_path / "again.pte"
    ptestore.specialize(pte, again, allow_unchanged=True)
    assert read_trailer(open_loader(again)).record()["version"] == 3  # type: ignore[union-attr]
    _assert_bound(again)


# -- derived, not re-read -----------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    src_len=st.integers(0, 4 * CHUNK_SIZE + 3),
    out_len=st.integers(0, 4 * CHUNK_SIZE + 3),
    kept=st.lists(
        st.tuples(st.integers(0, 4 * CHUNK_SIZE + 3), st.integers(0, 2 * CHUNK_SIZE)),
        max_size=4,
    ),
)
def test_derived_chunk_digests_equal_a_full_rehash(
    src_len: int, out_len: int, kept: list[tuple[int, int]]
) -> None:
    """An output that has the source's bytes at the same offsets over ``kept`` ranges
    and other bytes elsewhere: the digests derived from the source's equal hashlib's."""
    source = (hashlib.sha256(b"s").digest() * (src_len // 32 + 1))[:src_len]
    out = bytearray((hashlib.sha256(b"o").digest() * (out_len // 32 + 1))[:out_len])
    ranges = []
    for start, n in kept:
        end = min(start + n, src_len, out_len)
        if start < end:
            out[start:end] = source[start:end]
            ranges.append((start, end))
    recorded = content_digest(BytesLoader(source), src_len).chunks
    assert recorded is not None
    known = reusable(recorded, out_len, ranges)
    h = ChunkHasher(out_len, known)
    h.update(bytes(out))
    assert list(h.result().digests) == _independent(bytes(out), CHUNK_SIZE)
    assert h.hashed == out_len - sum(b - a for a, b in map(h.result().span, known))
    # the same through ContentHasher in 1 MiB pieces (a piece of known chunks only is
    # not handed to its second thread)
    c = ContentHasher(out_len, known)
    for i in range(0, out_len, MiB):
        c.update(bytes(out[i : i + MiB]))
    got = c.digest()
    assert (
        got.chunks == h.result() and got.sha256 == content_digest(BytesLoader(out), out_len).sha256
    )


@pytest.fixture(scope="module")
def known(big: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``big`` with a trailer (version 3): a source whose chunk digests are known."""
    path = tmp_path_factory.mktemp("known") / "known.pte"
    ptestore.specialize(big, path, allow_unchanged=True)
    return path


def _forge(path: Path, index: int) -> Path:
    """``path`` with the digest its record names for chunk ``index`` replaced (a valid,
    checksummed trailer that lies): a run that reuses it copies the lie."""
    loader = open_loader(path)
    trailer = read_trailer(loader)
    assert trailer is not None
    record = trailer.record()
    chunks = record["content"]["chunks"]
    raw = bytearray(base64.b64decode(chunks["sha256"]))
    raw[index * 32] ^= 0xFF
    digests = [bytes(raw[i : i + 32]) for i in range(0, len(raw), 32)]
    chunks["sha256"] = base64.b64encode(bytes(raw)).decode()
    chunks["root"] = _root(chunks["size"], trailer.content_size, digests)
    # the root is the content's digest; an unchanged copy's is its source's
    forged_root = "sha256-tree:" + chunks["root"].partition(":")[2]
    if record["source"]["sha256"] == record["content"]["sha256"]:
        record["source"]["sha256"] = forged_root
    record["content"]["sha256"] = forged_root
    forged = path.with_name("forged.pte")
    forged.write_bytes(ptestore.provenance.replace_trailer(path.read_bytes(), record))
    return forged


def test_runs_from_a_known_source_derive_and_still_equal_a_full_rehash(
    known: Path, tmp_path: Path
) -> None:
    through = tmp_path / "through.pte"
    ptestore.specialize(known, through, allow_unchanged=True)
    _assert_bound(through)
    replaced = tmp_path / "replaced.pte"
    ptestore.specialize(known, replaced, backends=[ReplaceKey("XnnpackBackend", _key(known))])
    _assert_bound(replaced)
    grown = tmp_path / "grown.pte"
    ptestore.specialize(
        known, grown, backends=[ReplaceKey("XnnpackBackend", _key(known), extra=5 * MiB)]
    )
    _assert_bound(grown)
    for extra in (0, 2 * MiB):
        target = tmp_path / f"inplace{extra}.pte"
        shutil.copyfile(known, target)
        ptestore.specialize(
            target,
            target,
            backends=[ReplaceKey("XnnpackBackend", _key(known), extra=extra)],
            in_place=True,
        )
        _assert_bound(target)
        # In place never runs over its own output again (issue 29): the file is left as
        # it is, still bound to its record.
        with pytest.raises(AlreadySpecialized):
            ptestore.specialize(target, target, in_place=True, allow_unchanged=True)
        _assert_bound(target)


@pytest.mark.parametrize("in_place", [False, True])
def test_what_is_trusted_a_source_trailer_s_chunk_digests_are_carried_not_reread(
    known: Path, tmp_path: Path, in_place: bool
) -> None:
    """A source whose (checksummed) trailer names a wrong digest for its last chunk,
    which a pass-through keeps at the same offset: the output's record carries that
    digest (it was not re-read), and so does its root (the content's digest); checking
    the output's bytes names that chunk."""
    n = len(_content(known)[1].chunks.digests)  # type: ignore[union-attr]
    forged = _forge(known, n - 1)
    out = tmp_path / "out.pte"
    if in_place:  # one key replaced by one of the same size: the rest stays in place
        shutil.copyfile(forged, out)
        swap = ReplaceKey("XnnpackBackend", _key(known))
        assert ptestore.specialize(out, out, backends=[swap], in_place=True).specialized
    else:
        ptestore.specialize(forged, out, allow_unchanged=True)
    data, content = _content(out)
    assert content.chunks is not None
    assert content.chunks.digests[:-1] == tuple(_independent(data, CHUNK_SIZE))[:-1]
    assert content.chunks.digests[-1] != _independent(data, CHUNK_SIZE)[-1]
    assert content.sha256 == content.chunks.digest != tree(data)
    a, b = content.chunks.span(n - 1)
    with pytest.raises(FormatError, match=rf"content\.chunks\[{n - 1}\] = .* bytes {a}:{b}"):
        check_bytes(open_loader(out))


def _hashed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(size, bytes not read)`` of every content digest made from here on."""
    seen: list[tuple[int, int]] = []
    real = ContentHasher.digest

    def digest(self: ContentHasher) -> ContentDigest:
        seen.append((self.size, self.skipped))
        return real(self)

    monkeypatch.setattr(ContentHasher, "digest", digest)
    return seen


def test_trust_costs_what_changed_a_known_source_s_chunks_are_not_read(
    known: Path, big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass-through of a source whose trailer names its chunks reads, to describe the
    source and digest the output, only the chunk that holds the trailer (the object's
    last) and none of the output's: the digests are derived. In place on such a file
    reads only the chunks it changes. Both records still equal a full re-hash."""
    from ptestore.provenance import known as known_module

    known_module.forget()
    seen = _hashed(monkeypatch)
    out = tmp_path / "out.pte"
    ptestore.specialize(known, out, allow_unchanged=True)
    (src_size, src_skipped), (out_size, out_skipped) = sorted(seen)[-1], sorted(seen)[0]
    assert src_size == known.stat().st_size and src_size - src_skipped <= CHUNK_SIZE
    assert out_size - out_skipped <= 64 << 10  # only its metadata, in memory: no read
    _assert_bound(out)
    # never seen (no trailer): described once, the output's chunks then known
    seen.clear()
    known_module.forget()
    ptestore.specialize(big, tmp_path / "fresh.pte", allow_unchanged=True)
    (_, described), (size, skipped) = seen[0], seen[-1]
    assert described == 0 and size - skipped <= 64 << 10
    _assert_bound(tmp_path / "fresh.pte")
    # in place: one value of one chunk replaced; the rest is known from its own trailer
    seen.clear()
    target = tmp_path / "inplace.pte"
    shutil.copyfile(known, target)
    swap = ReplaceKey("XnnpackBackend", _key(known))
    assert ptestore.specialize(target, target, backends=[swap], in_place=True).specialized
    size, skipped = seen[-1]
    assert size - skipped <= 2 * CHUNK_SIZE, (size, skipped)
    _assert_bound(target)


def test_a_same_size_rewrite_with_its_mtime_set_back_is_described_again(
    big: Path, tmp_path: Path
) -> None:
    """What a process remembers of a file is keyed by its size, mtime, ctime, inode and
    device: a rewrite in place that keeps the size and sets the mtime back (``cp -p``,
    ``rsync -t``) changes the ctime, so the file is read again, not taken as known."""
    from ptestore.provenance import known as known_module
    from ptestore.provenance.stamp import describe_source

    src = tmp_path / "src.pte"
    shutil.copyfile(big, src)
    first = describe_source(open_loader(src))
    st = src.stat()
    flip(src, 5 * MiB)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_mtime_ns == st.st_mtime_ns and src.stat().st_size == st.st_size
    again = describe_source(open_loader(src))
    assert again.sha256 != first.sha256 and again.sha256 == tree(src.read_bytes())
    known_module.forget()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_local_file_s_whole_chunks_are_hashed_a_chunk_per_core_with_the_same_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """``ContentHasher.read`` of a local file hashes its whole chunks in parallel (the
    bytes before the first boundary and after the last in order): the chunk digests,
    their root and the per-chunk CRC-32s are those of one pass in order, also where a
    chunk's digest is known but not its CRC (only its CRC is computed, its digest kept
    as given), and nothing read is counted as skipped."""
    import zlib

    from ptestore.provenance import pieces as pieces_module
    from ptestore.provenance.chunks import CHUNK_SIZE
    from ptestore.provenance.digest import ContentHasher
    from ptestore.storage.loaders import LocalFileLoader

    monkeypatch.setattr(pieces_module, "parallel_workers", lambda loader: workers)
    data = os.urandom(5 * CHUNK_SIZE + 12345)
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 777 + data)
    loader = LocalFileLoader(str(path))
    n = len(data)

    def crcs_of(d: bytes) -> list[int]:
        return [zlib.crc32(d[i : i + CHUNK_SIZE]) for i in range(0, len(d), CHUNK_SIZE)]

    h = ContentHasher(n)
    h.update(data[:1000])  # the hasher mid-chunk: the read starts with a head
    h.read(loader, 777 + 1000, n - 1000)
    got = h.digest()
    assert got.sha256 == tree(data) and h.skipped == 0
    assert got.crc32 == zlib.crc32(data)
    assert got.crcs is not None and list(got.crcs.chunks["CRC32"]) == crcs_of(data)
    # chunk 2's digest given (wrongly: as given, it is not re-hashed), its CRC not
    fake = b"\x01" * 32
    h = ContentHasher(n, {2: fake})
    h.read(loader, 777, n)
    got = h.digest()
    assert got.chunks is not None and got.chunks.digests[2] == fake
    assert got.crcs is not None and list(got.crcs.chunks["CRC32"]) == crcs_of(data)
    loader.close()


def test_a_parallel_description_stops_when_cancelled_and_hands_back_a_read_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk-per-core pass checks the run's cancel event between pieces (the run
    failed elsewhere: ``Cancelled``, no thread left hashing) and a failed read of any
    chunk is the caller's error, not a digest."""
    import threading

    from ptestore._background import Cancelled
    from ptestore.provenance import pieces as pieces_module
    from ptestore.provenance.chunks import CHUNK_SIZE
    from ptestore.provenance.digest import ContentHasher
    from ptestore.storage.loaders import LocalFileLoader

    monkeypatch.setattr(pieces_module, "parallel_workers", lambda loader: 2)
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(4 * CHUNK_SIZE))
    loader = LocalFileLoader(str(path))
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(Cancelled):
        ContentHasher(4 * CHUNK_SIZE).read(loader, 0, 4 * CHUNK_SIZE, cancelled)
    assert [t for t in threading.enumerate() if t.name.startswith("ptestore-chunks")] == []

    def failing(offset: int, buffer: memoryview) -> None:
        if offset >= 2 * CHUNK_SIZE:
            raise OSError(5, "Input/output error")
        buffer[:] = b"\0" * buffer.nbytes

    monkeypatch.setattr(loader, "readinto", failing)
    with pytest.raises(OSError, match="Input/output error"):
        ContentHasher(4 * CHUNK_SIZE).read(loader, 0, 4 * CHUNK_SIZE)
    loader.close()


def test_a_run_s_spool_is_hashed_a_chunk_per_core_as_a_local_file_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What backends spooled (an in-place run's journal, a run's replacement spool) is
    read by ``preadv`` from any thread: its whole chunks are hashed a chunk per core,
    with the digest of one pass in order; a loader that cannot read into memory it is
    given from several threads stays in order."""
    import threading

    from ptestore.coordinator.journal_writer import JournalSpool
    from ptestore.coordinator.spool import Spool
    from ptestore.provenance import pieces as pieces_module
    from ptestore.provenance.chunks import CHUNK_SIZE

    monkeypatch.setattr(pieces_module, "hashing_threads", lambda: 2)  # as on 2 cores
    data = os.urandom(3 * CHUNK_SIZE + 999)
    seen: list[str] = []
    real = pieces_module.describe_chunks

    def record(*args: object) -> object:
        seen.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    for spool in (Spool(str(tmp_path)), JournalSpool(str(tmp_path / "journal"))):
        spool.add(b"head")
        spool.add(data)
        assert pieces_module.parallel_workers(spool) == 2
        seen.clear()
        h = ContentHasher(len(data))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pieces_module, "describe_chunks", record)
            h.read(spool, 4, len(data))
        assert h.digest().sha256 == tree(data) and seen == [threading.current_thread().name]
        with pytest.raises(ptestore.errors.StorageError, match="out of range"):
            spool.readinto(len(data), memoryview(bytearray(10)))
        spool.close()
    assert pieces_module.parallel_workers(BytesLoader(b"x")) == 1


_FEED = os.urandom(3 * (4 << 20) + 4321)


@settings(max_examples=20, deadline=None)
@given(
    cuts=st.lists(st.integers(0, len(_FEED)), max_size=6),
    kinds=st.lists(st.sampled_from(["memory", "file", "spool", "zeros"]), min_size=7, max_size=7),
    start=st.integers(0, 5000),
    known=st.sets(st.integers(0, 3), max_size=2),
)
def test_fed_pieces_give_the_digests_of_their_bytes_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    cuts: list[int],
    kinds: list[str],
    start: int,
    known: set[int],
) -> None:
    """``feed_pieces``: bytes from memory, a local file, a run's spool and zeros, cut
    anywhere (a piece may span chunk boundaries, a chunk may hold several pieces), fed
    after ``start`` bytes given in order: the chunk digests, their root and the
    per-chunk CRC-32s are those of the same bytes fed in one piece, a chunk per core
    or not; chunks known in full (digest and CRC) are not read."""
    import zlib

    from ptestore.coordinator.spool import Spool
    from ptestore.provenance.chunks import CHUNK_SIZE
    from ptestore.storage.loaders import LocalFileLoader

    tmp = tmp_path_factory.mktemp("feed")
    bounds = sorted({0, len(_FEED), *cuts})
    parts: list[tuple[object, int, int]] = []
    expected = bytearray(_FEED[:start])
    path = tmp / "source"
    path.write_bytes(_FEED)
    loader, spool = LocalFileLoader(str(path)), Spool(str(tmp))
    for (a, b), kind in zip(itertools.pairwise(bounds), kinds, strict=False):
        if b <= max(a, start):
            continue
        a = max(a, start)
        if kind == "zeros":
            parts.append((None, 0, b - a))
            expected += bytes(b - a)
        elif kind == "memory":
            parts.append((_FEED, a, b - a))
            expected += _FEED[a:b]
        elif kind == "file":
            parts.append((loader, a, b - a))
            expected += _FEED[a:b]
        else:
            parts.append((spool, spool.add(_FEED[a:b]), b - a))
            expected += _FEED[a:b]
    data = bytes(expected)
    n = len(data)
    reference = ContentHasher(n)
    reference.update(data)
    ref = reference.digest()
    assert ref.chunks is not None and ref.crcs is not None
    known_chunks = {i: ref.chunks.digests[i] for i in known if i * CHUNK_SIZE < n}
    known_crcs = {i: {"CRC32": ref.crcs.chunks["CRC32"][i]} for i in known_chunks}
    for table in ({}, known_chunks):
        h = ContentHasher(n, table, known_crcs=known_crcs if table else None)
        h.update(data[:start])
        h.feed_pieces(parts)
        got = h.digest()
        assert got.sha256 == tree(data) == ref.sha256
        assert got.crc32 == zlib.crc32(data)
        assert got.crcs is not None and got.crcs.chunks["CRC32"] == ref.crcs.chunks["CRC32"]
        # the bytes of known chunks from ``start`` on: moved past, never read
        unread = sum(
            max(0, min((i + 1) * CHUNK_SIZE, n) - max(i * CHUNK_SIZE, start)) for i in table
        )
        assert h.skipped == unread
    loader.close()
    spool.close()


def test_chunk_digests_of_pieces_are_those_of_their_bytes(tmp_path: Path) -> None:
    """``chunk_digests``: the SHA-256 of the chunks asked for, of the bytes the pieces
    make (what an in-place run's journal must leave in the file)."""
    from ptestore.provenance.chunks import CHUNK_SIZE
    from ptestore.provenance.pieces import chunk_digests
    from ptestore.storage.loaders import LocalFileLoader

    path = tmp_path / "source"
    path.write_bytes(_FEED)
    loader = LocalFileLoader(str(path))
    head = b"new metadata" * 100
    parts = [(head, 0, len(head)), (None, 0, 5000), (loader, 0, len(_FEED))]
    data = head + bytes(5000) + _FEED
    want = {
        i: hashlib.sha256(data[i * CHUNK_SIZE : (i + 1) * CHUNK_SIZE]).digest() for i in (0, 2, 3)
    }
    assert chunk_digests(parts, len(data), CHUNK_SIZE, [0, 2, 3]) == want
    assert chunk_digests(parts, len(data), CHUNK_SIZE, []) == {}
    loader.close()


def test_verify_range_of_a_file_modified_while_read_is_not_damage(
    big: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file modified in place while ``--range`` hashes it is "changed while being
    verified" (exit 1, verify it again), not a damaged artifact (it was a FormatError,
    exit 2): the mismatch is checked against the file's stamp before it is reported."""
    import ptestore.provenance.chunks as chunks_module

    out = tmp_path / "out.pte"
    ptestore.specialize(big, out, backends=[ReplaceKey("XnnpackBackend", _key(big))])
    hashed = chunks_module.iter_mismatches

    def modified_first(*args: Any, **kwargs: Any) -> Any:
        st = out.stat()
        flip(out, CHUNK_SIZE + 10)  # in place, before the chunks are hashed (another writer)
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse clock
        return hashed(*args, **kwargs)

    monkeypatch.setattr(chunks_module, "iter_mismatches", modified_first)
    span = f"{CHUNK_SIZE}:{CHUNK_SIZE + 100}"
    capsys.readouterr()
    assert main(["verify", str(out), "--range", span]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"ptestore verify: error: {out}: changed while being verified (verify it again): "
        f"{out}: modified while being read"
    )
    assert "content.chunks" not in err
    monkeypatch.setattr(chunks_module, "iter_mismatches", hashed)
    assert main(["verify", str(out), "--range", span]) == 2  # now damaged: it was flipped
    assert "content.chunks[1]" in capsys.readouterr().err


def test_a_repr_sums_the_digests_up_by_their_root() -> None:
    # a report or an artifact holding a 1 GiB program's 256 digests printed a thousand
    # characters of bytes literals
    digests = tuple(hashlib.sha256(bytes([i])).digest() for i in range(256))
    c = ChunkDigests(CHUNK_SIZE, 256 * CHUNK_SIZE, digests)
    assert repr(c) == (
        f"ChunkDigests(chunk_size={CHUNK_SIZE}, length={256 * CHUNK_SIZE}, 256 digests, "
        f"root={c.root!r})"
    )
