"""Delta fetch (issue 28 part 2): ``fetch(..., base=)`` / ``--base`` and ``ensure INDEX``
take from local files the chunks they hold, verified against the artifact's record, and
download only the others; what moved is counted through the S3 client and through a
proxy in front of the server (moto and SeaweedFS). A 20 MiB artifact (six 4 MiB
chunks) whose next version differs in one chunk."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.delta import big_job, differing, flip, program, trailer_size, version
from support.fleetrun import fleet_run
from support.forged import forge, record_digests

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.errors import ConfigurationError, IntegrityError
from ptestore.fleet.fetch import FetchEvent, FetchResult
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.testing.s3server import S3TestServer

DATA = Path(__file__).parents[1] / "provenance" / "data"
A = DeviceProfile("a", {"soc": "x"})


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The portable source, and two versions of its artifact differing in chunk 1."""
    d = tmp_path_factory.mktemp("versions")
    src = program(d)
    a = version(src, d / "a" / "m.pte", "1")
    b = version(src, d / "b" / "m.pte", "2")
    assert differing(a, b) == [1] and a.stat().st_size > 5 * CHUNK_SIZE
    return src, a, b


def _one(result: FetchResult) -> dict[str, Any]:
    (got,) = result.files
    return got


def _base_bytes(path: Path, chunks: int = 4) -> int:
    """Bytes of ``chunks`` whole chunks and the short last one (all but chunk 1)."""
    content = path.stat().st_size - trailer_size(path)
    return chunks * CHUNK_SIZE + content - 5 * CHUNK_SIZE


def test_only_the_changed_chunk_is_downloaded(
    versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, a, b = versions
    dest = tmp_path / "dev" / "m.pte"
    seen: list[FetchEvent] = []
    result = ptestore.fetch(b, dest, base=a, events=seen.append)
    assert dest.read_bytes() == b.read_bytes()
    got = _one(result)
    size = b.stat().st_size
    # chunk 1 downloaded, and the trailer with the 4 KiB tail read; chunks 0, 2, 3, 4
    # and the short last one (2816 bytes) taken from the base.
    assert got["verified"] == "chunks" and got["chunks"] == 6
    assert got["from_base"] == _base_bytes(b)
    assert got["bases"] == {str(a): _base_bytes(b)}
    assert got["received"] == CHUNK_SIZE + 4096
    assert (result.received, result.from_base) == (got["received"], got["from_base"])
    assert got["base_damaged"] == got["part_damaged"] == got["store_retried"] == []
    # Every byte is accounted for once, by where it came from.
    by_origin: dict[str, int] = {}
    for e in seen:
        by_origin[e.origin] = by_origin.get(e.origin, 0) + e.nbytes
    assert by_origin == {"base": _base_bytes(b), "store": size - _base_bytes(b)}
    assert seen[-1].done == seen[-1].total == size
    assert ptestore.verify(dest).status == "intact"


def test_the_portable_source_as_base_is_hashed_where_it_could_match(
    versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A base without a chunk record (the exporter's file): its bytes at each chunk's
    span are hashed and compared; the one that differs is downloaded."""
    src, _, b = versions
    dest = tmp_path / "dev" / "m.pte"
    got = _one(ptestore.fetch(b, dest, base=src))
    assert dest.read_bytes() == b.read_bytes()
    assert got["from_base"] == _base_bytes(b) and got["received"] == CHUNK_SIZE + 4096


def test_a_flipped_byte_in_the_base_is_caught_named_and_fetched(
    versions: tuple[Path, Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The base's own record claims chunk 3 is the target's; its bytes are not: the
    chunk is downloaded instead, the output is the target's, and the base is named."""
    _, a, b = versions
    base = tmp_path / "base.pte"
    shutil.copyfile(a, base)
    flip(base, 3 * CHUNK_SIZE + 12345)
    dest = tmp_path / "dev" / "m.pte"
    with caplog.at_level(logging.WARNING, "ptestore.fleet.chunked"):
        got = _one(ptestore.fetch(b, dest, base=base))
    assert dest.read_bytes() == b.read_bytes()
    lo, hi = 3 * CHUNK_SIZE, 4 * CHUNK_SIZE
    assert got["base_damaged"] == [{"chunk": 3, "start": lo, "end": hi, "base": str(base)}]
    assert got["from_base"] == _base_bytes(b, 3) and got["received"] == 2 * CHUNK_SIZE + 4096
    assert (
        f"{base}: bytes {lo}:{hi} (chunk 3) do not have the digest its own record names: "
        "damaged or changed since it was made; taken from the store instead"
    ) in caplog.messages


def test_a_chunk_a_base_fails_is_tried_from_the_next_base_before_the_store(
    versions: tuple[Path, Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Of two bases, the first claims chunk 3 (its own record) and its bytes are not the
    target's; the second (the portable source) has it: the chunk is taken from the
    second, not downloaded; the first is still named."""
    src, a, b = versions
    base = tmp_path / "base.pte"
    shutil.copyfile(a, base)
    flip(base, 3 * CHUNK_SIZE + 12345)
    dest = tmp_path / "dev" / "m.pte"
    with caplog.at_level(logging.WARNING, "ptestore.fleet.chunked"):
        got = _one(ptestore.fetch(b, dest, base=[base, src]))
    assert dest.read_bytes() == b.read_bytes()
    lo, hi = 3 * CHUNK_SIZE, 4 * CHUNK_SIZE
    assert got["base_damaged"] == [{"chunk": 3, "start": lo, "end": hi, "base": str(base)}]
    assert got["received"] == CHUNK_SIZE + 4096 and got["from_base"] == _base_bytes(b)
    assert got["bases"] == {str(base): _base_bytes(b, 3), str(src): CHUNK_SIZE}
    assert (
        f"{base}: bytes {lo}:{hi} (chunk 3) do not have the digest its own record names: "
        "damaged or changed since it was made; taken from another base instead"
    ) in caplog.messages


def test_a_base_whose_record_claims_other_bytes_is_hashed_where_it_could_match(
    versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The base's record names the target's chunk digests (chunk 1 included) for one
    byte more than its content: not trusted (``Provenance.of_trailer``), so it is used
    as a base without a record, and chunk 1 is downloaded without blaming the base."""
    _, a, b = versions
    base = tmp_path / "base.pte"
    shutil.copyfile(a, base)
    forge(base, 1, record_digests(b.read_bytes()))
    dest = tmp_path / "dev" / "m.pte"
    got = _one(ptestore.fetch(b, dest, base=base))
    assert dest.read_bytes() == b.read_bytes()
    assert got["base_damaged"] == []
    assert got["from_base"] == _base_bytes(b) and got["received"] == CHUNK_SIZE + 4096


def test_a_base_of_another_model_gives_nothing_and_costs_nothing(
    versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, b = versions
    other = tmp_path / "other.pte"
    other.write_bytes(b"x" * 1000)
    dest = tmp_path / "dev" / "m.pte"
    got = _one(ptestore.fetch(b, dest, base=other))
    assert dest.read_bytes() == b.read_bytes()
    assert got["from_base"] == 0 and got["bases"] == {}


def test_metadata_past_the_first_chunk_is_taken_from_a_base_that_holds_it(
    tmp_path: Path,
) -> None:
    """A program whose metadata spans three chunks (an 11 MiB delegate blob inline in
    the FlatBuffer): with its bytes as base (the exporter's file, without a trailer),
    every chunk of the layout is taken from the base at the same offsets, verified, and
    the store sends only the tail read with the trailer (chunks 1 and 2 were always
    downloaded to read the layout)."""
    import flatbuffers
    from support import synth

    b = flatbuffers.Builder(0)
    d = synth.delegate(b, "VendorNpuBackend", segment=False)
    plans = synth.offsets_vector(b, [synth.plan(b, "forward", synth.offsets_vector(b, [d]))])
    blob = b.CreateByteVector(random.Random(7).randbytes(11 << 20))
    b.StartObject(1)  # BackendDelegateInlineData
    b.PrependUOffsetTRelativeSlot(0, blob, 0)
    inline = b.EndObject()
    fb = synth.finish_program(b, plans, inline=synth.offsets_vector(b, [inline]))
    src = tmp_path / "src.pte"
    src.write_bytes(synth.with_segments(fb, b""))
    target = tmp_path / "store" / "m.pte"
    target.parent.mkdir()
    ptestore.specialize(src, target, allow_unchanged=True)  # its bytes and a trailer
    content = target.stat().st_size - trailer_size(target)
    assert target.read_bytes()[:content] == src.read_bytes() and content > 2 * CHUNK_SIZE
    dest = tmp_path / "dev" / "m.pte"
    got = _one(ptestore.fetch(target, dest, base=src))
    assert dest.read_bytes() == target.read_bytes()
    assert got["bases"] == {str(src): content} and got["from_base"] == content
    assert got["received"] == 4096 and got["requests"] == 1


def test_base_refusals(versions: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, b = versions
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(b, dest, base=tmp_path / "nope.pte")
    assert str(info.value) == f"{tmp_path / 'nope.pte'}: no such base file (--base)"
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(b, dest, base=tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: cannot be used as a base: {tmp_path}: ")
    assert not dest.exists()


def test_a_file_without_a_chunk_record_is_taken_whole_from_a_base_of_its_bytes(
    tmp_path: Path,
) -> None:
    """Version-1 records name only the whole content: a base of the same size is copied
    whole and checked whole; one of other bytes is downloaded after all."""
    d = tmp_path / "v1"
    d.mkdir()
    for name in ("v1_trailer.pte", "v1_trailer.ptd"):
        shutil.copyfile(DATA / name, d / name)
    pte = d / "v1_trailer.pte"
    keep = tmp_path / "keep"
    keep.mkdir()
    shutil.copyfile(pte, keep / "m.pte")
    shutil.copyfile(d / "v1_trailer.ptd", keep / "m.ptd")
    result = ptestore.fetch(pte, tmp_path / "dev" / "m.pte", base=keep / "m.pte")
    for got in result.files:  # the .ptd from the base's .ptd beside it
        assert got["verified"] == "whole" and got["from_base"] == got["size"]
    assert (tmp_path / "dev" / "m.ptd").read_bytes() == (d / "v1_trailer.ptd").read_bytes()
    flip(keep / "m.pte", 100)
    result = ptestore.fetch(pte, tmp_path / "dev2" / "m.pte", base=keep / "m.pte")
    pte_got = next(f for f in result.files if f["path"].endswith(".pte"))
    assert pte_got["from_base"] == 0 and pte_got["received"] >= pte_got["size"]
    assert (tmp_path / "dev2" / "m.pte").read_bytes() == pte.read_bytes()


def test_fetch_base_on_the_command_line(
    versions: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, a, b = versions
    dest = tmp_path / "dev" / "m.pte"
    assert main(["fetch", str(b), str(dest), "--base", str(a), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["from_base"] == _base_bytes(b)
    assert shown["received"] == CHUNK_SIZE + 4096
    assert shown["files"][0]["bases"] == {str(a): _base_bytes(b)}
    requests = shown["files"][0]["requests"]
    dest.unlink()
    assert main(["fetch", str(b), str(dest), "--base", str(a)]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (
        f"{b} -> {dest}: {b.stat().st_size} bytes verified chunk by chunk "
        f"({CHUNK_SIZE + 4096} received from the store in {requests} requests, the "
        f"read of its trailer included; {_base_bytes(b)} taken from {a})"
    )
    assert main(["fetch", str(b), str(dest), "--base", str(tmp_path / "nope")]) == 2
    assert "no such base file (--base)" in capsys.readouterr().err


def test_chunks_are_cloned_where_the_file_system_shares_extents(
    versions: tuple[Path, Path, Path],
) -> None:
    from support.xfs import shared_bytes, xfs_reflink_mount

    _, a, b = versions
    with xfs_reflink_mount("1G") as xfs:
        base = xfs.path / "old.pte"
        shutil.copyfile(a, base)
        dest = xfs.path / "new.pte"
        got = _one(ptestore.fetch(b, dest, base=base))
        assert dest.read_bytes() == b.read_bytes()
        assert got["from_base"] == _base_bytes(b)
        assert got["cloned"] == 4 * CHUNK_SIZE  # the short last chunk is copied
        assert shared_bytes(dest) >= 4 * CHUNK_SIZE


# -- ensure INDEX: the cache's earlier artifact, or the portable source --------------


def test_ensure_index_takes_the_cached_artifact_as_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(big_job(tmp_path, str(out), "1"), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert first.choice is not None and first.choice["fetched"]["from_base"] == 0
    index = fleet_run(big_job(tmp_path, str(out), "2"), capsys)
    events: list[Any] = []
    fresh = ptestore.ensure(index, cache_dir=cache, model="m", device=A, progress=events.append)
    assert fresh.created and fresh.pte == first.pte
    assert Path(fresh.pte).read_bytes() == (out / "a" / "m.pte").read_bytes()
    assert fresh.choice is not None
    fetched = fresh.choice["fetched"]
    assert fetched["from_base"] == _base_bytes(out / "a" / "m.pte")
    assert fetched["received"] == CHUNK_SIZE + 4096
    assert fetched["bases"] == [first.pte]
    statuses = {e.status for e in events if e.kind == "fetch"}
    assert statuses == {"base", "store"}
    assert ptestore.verify(fresh.pte).status == "intact"


def test_ensure_index_takes_another_entry_of_the_model_as_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another index (another fleet's prefix) of the same model: its entry's files are a
    base for this one."""
    cache = tmp_path / "cache"
    one = fleet_run(big_job(tmp_path, str(tmp_path / "one"), "1"), capsys)
    two = fleet_run(big_job(tmp_path, str(tmp_path / "two"), "2"), capsys)
    first = ptestore.ensure(one, cache_dir=cache, model="m", device=A)
    other = ptestore.ensure(two, cache_dir=cache, model="m", device=A)
    assert other.key != first.key and other.choice is not None
    assert other.choice["fetched"]["bases"] == [first.pte]
    assert other.choice["fetched"]["received"] == CHUNK_SIZE + 4096
    assert Path(other.pte).read_bytes() == (tmp_path / "two" / "a" / "m.pte").read_bytes()


def test_ensure_index_skips_a_base_another_process_evicts_while_it_fetches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's other entries are not locked: one evicted between ``ensure`` listing
    it as a base and the download opening it is skipped (no ``ConfigurationError`` "no
    such base file (--base)"), and the download takes the store's bytes instead."""
    import ptestore.fleet.fetch as fetch_module

    cache = tmp_path / "cache"
    one = fleet_run(big_job(tmp_path, str(tmp_path / "one"), "1"), capsys)
    two = fleet_run(big_job(tmp_path, str(tmp_path / "two"), "2"), capsys)
    first = ptestore.ensure(one, cache_dir=cache, model="m", device=A)
    real = fetch_module.select_from

    def select_then_evict(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        Path(first.pte).unlink()  # another process's prune, while the index is read
        return got

    monkeypatch.setattr(fetch_module, "select_from", select_then_evict)
    other = ptestore.ensure(two, cache_dir=cache, model="m", device=A)
    assert other.choice is not None and other.choice["fetched"]["bases"] == []
    want = (tmp_path / "two" / "a" / "m.pte").read_bytes()
    assert other.choice["fetched"]["from_base"] == 0
    assert other.choice["fetched"]["received"] >= len(want)
    assert Path(other.pte).read_bytes() == want
    # A base the user names stays required.
    monkeypatch.undo()
    with pytest.raises(ConfigurationError, match="no such base file"):
        ptestore.fetch(two, tmp_path / "dev" / "m.pte", model="m", device=A, base=first.pte)


def test_ensure_index_takes_the_portable_source_given_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(big_job(tmp_path, str(out), "1"), capsys)
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "a"]
    argv += ["--device-option", "soc=x"]
    assert main([*argv, "--portable", str(program(tmp_path)), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["choice"]["fetched"]["from_base"] == _base_bytes(out / "a" / "m.pte")
    assert made["choice"]["fetched"]["bases"] == [str(program(tmp_path))]
    assert Path(made["pte"]).read_bytes() == (out / "a" / "m.pte").read_bytes()
    # --portable file:///x/m.pte is the local file /x/m.pte (a fresh cache: no hit).
    argv[argv.index(str(cache))] = str(tmp_path / "cache2")
    assert main([*argv, "--portable", f"file://{program(tmp_path)}", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["choice"]["fetched"]["from_base"] == _base_bytes(out / "a" / "m.pte")
    assert main([*argv, "--portable", str(tmp_path / "nope.pte")]) == 2
    assert capsys.readouterr().err == (
        f"ptestore ensure: error: {tmp_path / 'nope.pte'}: no such file (portable=, CLI "
        "--portable: a local copy of the model's portable source for the download to take "
        "chunks from)\n"
    )


# -- S3: what moved, counted by the client and by the server's side of a proxy -------


def _session(traffic: Any) -> Any:
    import aiobotocore.session

    session = aiobotocore.session.AioSession()
    traffic.attach(session)
    return session


@pytest.mark.s3
def test_s3_delta_fetch_moves_one_chunk_and_the_tail(
    s3_server: S3TestServer, versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from support.faulty_proxy import faulty_proxy

    from ptestore.testing.s3_traffic import Traffic

    _, a, b = versions
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="m/b.pte", Body=b.read_bytes())
    etag = client.head_object(Bucket=bucket, Key="m/b.pte")["ETag"]
    url = f"s3://{bucket}/m/b.pte"
    traffic = Traffic()
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        opts = {**s3_server.storage_options, "endpoint_url": endpoint}
        opts["session"] = _session(traffic)
        dest = tmp_path / "dev" / "m.pte"
        result = ptestore.fetch(url, dest, base=a, storage_options=opts)
    assert dest.read_bytes() == b.read_bytes()
    got = _one(result)
    assert got["received"] == CHUNK_SIZE + 4096 and got["from_base"] == _base_bytes(b)
    # What the client received of object bytes, and what the server sent through the
    # proxy: the chunk, the tail read, and the two trailer reads that describe a URL.
    data = traffic.summary()["data_received"]
    assert CHUNK_SIZE + 4096 <= data <= CHUNK_SIZE + 4 * 4096
    assert CHUNK_SIZE + 4096 <= proxy.sent["GET"] <= CHUNK_SIZE + 64 * 1024
    # Every read of the download is pinned to the version it started with.
    gets = traffic.params["GetObject"]
    pinned = [p for p in gets if p.get("Range", "").startswith(f"bytes={CHUNK_SIZE}-")]
    assert len(pinned) == 1 and pinned[0]["IfMatch"] == etag


@pytest.mark.s3
def test_s3_a_byte_flipped_in_transit_is_read_again_then_refused(
    s3_server: S3TestServer,
    versions: tuple[Path, Path, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from support.faulty_proxy import faulty_proxy

    _, a, b = versions
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m/b.pte", Body=b.read_bytes())
    url = f"s3://{bucket}/m/b.pte"
    flips = {"left": 1}

    def tamper(method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        ranged = headers.get("Range", headers.get("range", ""))
        if method == "GET" and ranged.startswith(f"bytes={CHUNK_SIZE}-") and flips["left"]:
            flips["left"] -= 1
            return body[:100] + bytes([body[100] ^ 1]) + body[101:]
        return body

    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        proxy.tamper = tamper
        opts = {**s3_server.storage_options, "endpoint_url": endpoint}
        dest = tmp_path / "dev" / "m.pte"
        with caplog.at_level(logging.WARNING, "ptestore.fleet.chunked"):
            got = _one(ptestore.fetch(url, dest, base=a, storage_options=opts))
        assert dest.read_bytes() == b.read_bytes()
        assert got["store_retried"] == [1]
        assert any(
            m.startswith(f"{url}: bytes {CHUNK_SIZE}:{2 * CHUNK_SIZE} (chunk 1) arrived with ")
            for m in caplog.messages
        )
        # Flipped every time: refused, naming the chunk; nothing published.
        flips["left"] = 10
        dest2 = tmp_path / "dev2" / "m.pte"
        with pytest.raises(IntegrityError) as info:
            ptestore.fetch(url, dest2, base=a, storage_options=opts)
    assert str(info.value).startswith(
        f"{url}: downloaded bytes {CHUNK_SIZE}:{2 * CHUNK_SIZE} (chunk 1) have sha256:"
    )
    assert "; read twice: the object was damaged or changed after it was made" in str(info.value)
    assert info.value.published is False and not dest2.exists()


@pytest.mark.s3
def test_s3_another_range_than_the_one_asked_for_is_refused_as_such(
    s3_server: S3TestServer, versions: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A server (or something between) that answers a ranged GET with another range
    than the one asked for: the bytes are refused, and the error says so (the range
    asked for and the ``Content-Range`` received), not that the object was damaged."""
    from support.faulty_proxy import faulty_proxy

    _, a, b = versions
    size = b.stat().st_size
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m/b.pte", Body=b.read_bytes())
    url = f"s3://{bucket}/m/b.pte"
    asked = f"bytes={CHUNK_SIZE}-"

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        ranged = asks.get("Range", asks.get("range", ""))
        if method != "GET" or not ranged.startswith(asked):
            return headers, body
        key = next(k for k in headers if k.lower() == "content-range")
        last = ranged.removeprefix(asked)
        return {**headers, key: f"bytes {CHUNK_SIZE + 8}-{last}/{size}"}, body[8:]

    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        proxy.answer = answer
        opts = {**s3_server.storage_options, "endpoint_url": endpoint}
        dest = tmp_path / "dev" / "m.pte"
        with pytest.raises(IntegrityError) as info:
            ptestore.fetch(url, dest, base=a, storage_options=opts)
    last = 2 * CHUNK_SIZE - 1
    assert str(info.value) == (
        f"{url}: asked the server for Range: bytes={CHUNK_SIZE}-{last}, it answered "
        f"Content-Range: bytes {CHUNK_SIZE + 8}-{last}/{size}: another range than the one "
        "asked for; its bytes are refused"
    )
    assert info.value.published is False and not dest.exists()
