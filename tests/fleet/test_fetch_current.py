"""``fetch`` into a ``DEST`` that already holds (some of) the artifact: ``DEST`` (and its
``.ptd``) is an implicit base, and a ``DEST`` that already is what the index names
(read and hashed, never its size, time or trailer alone) is left as it is, nothing
downloaded (``"current": true``, ``received`` 0, inode and times unchanged). Locally,
from a local index, a pair, and on moto and SeaweedFS through a proxy counting what the
server sent. A 20 MiB artifact (six 4 MiB chunks) whose next version differs in chunk 1."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from support.delta import big_job, trailer_size, two_versions
from support.fleet_backend import specialized_pair
from support.fleetrun import fleet_run

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.fleet.fetch import FetchEvent
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.testing.s3server import S3TestServer

A = DeviceProfile("a", {"soc": "x"})


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return two_versions(tmp_path_factory.mktemp("versions"))


def _stamp(path: Path) -> tuple[int, int, int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid


def _all_but_chunk_1(path: Path) -> int:
    content = path.stat().st_size - trailer_size(path)
    return content - CHUNK_SIZE


def test_a_current_dest_is_verified_and_left_as_it_is(
    versions: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, b = versions
    dest = tmp_path / "dev" / "m.pte"
    first = ptestore.fetch(b, dest)
    assert not first.current and first.files[0]["current"] is False
    os.chmod(dest, 0o640)
    before = _stamp(dest)
    seen: list[FetchEvent] = []
    again = ptestore.fetch(b, dest, events=seen.append)
    (got,) = again.files
    assert again.current and got["current"] is True
    assert (got["received"], got["requests"], got["from_base"]) == (0, 0, 0)
    assert got["verified"] == "chunks" and got["chunks"] == 6
    assert again.to_dict()["current"] is True and again.received == 0
    assert _stamp(dest) == before and dest.read_bytes() == b.read_bytes() and seen == []
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m.pte"]
    # The CLI: one line, and --json.
    assert main(["fetch", str(b), str(dest)]) == 0
    assert capsys.readouterr().out == (
        f"{dest}: already {b} ({b.stat().st_size} bytes verified chunk by chunk from its "
        "own bytes; nothing downloaded, the file left as it was)\n"
    )
    assert main(["fetch", str(b), str(dest), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["current"] is True and shown["received"] == 0
    assert shown["files"][0]["current"] is True
    assert _stamp(dest) == before


def test_a_dest_one_chunk_off_moves_only_that_chunk(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """Last month's version at DEST: only chunk 1 (and the tail read) comes from the
    store, without --base; published as always (a new inode, the old mode kept)."""
    a, b = versions
    dest = tmp_path / "m.pte"
    shutil.copyfile(a, dest)
    os.chmod(dest, 0o600)
    ino = dest.stat().st_ino
    result = ptestore.fetch(b, dest)
    (got,) = result.files
    assert got["current"] is False and not result.current
    assert got["received"] == CHUNK_SIZE + 4096
    assert got["bases"] == {str(dest): _all_but_chunk_1(b)}
    assert dest.read_bytes() == b.read_bytes()
    assert dest.stat().st_ino != ino and dest.stat().st_mode & 0o777 == 0o600
    # An explicit base is tried first: the chunks it holds are taken from it.
    shutil.copyfile(a, dest)
    other = tmp_path / "other.pte"
    shutil.copyfile(b, other)
    (got,) = ptestore.fetch(b, dest, base=other).files
    assert got["bases"] == {str(other): b.stat().st_size - trailer_size(b)}
    assert got["received"] == 4096


@pytest.mark.parametrize("damage", ["truncated", "longer", "garbage", "trailer", "footer"])
def test_a_dest_that_differs_otherwise_gets_the_right_bytes(
    versions: tuple[Path, Path], tmp_path: Path, damage: str
) -> None:
    _, b = versions
    data = b.read_bytes()
    dest = tmp_path / "m.pte"
    if damage == "truncated":  # three whole chunks kept
        dest.write_bytes(data[: 3 * CHUNK_SIZE])
        want = 2 * CHUNK_SIZE + 4096  # the short last chunk is inside the tail read
    elif damage == "longer":  # the same bytes and more: its trailer not at its end
        dest.write_bytes(data + b"x" * 1000)
        want = 4096
    elif damage == "garbage":  # the size the index names, no byte of it
        dest.write_bytes(os.urandom(len(data)))
        want = -1
    elif damage == "trailer":  # the right trailer over a flipped content byte: hashed
        dest.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
        want = CHUNK_SIZE + 4096
    else:  # the footer's format version, which no digest covers, says 1 (not 2)
        changed = bytearray(data)
        struct.pack_into("<I", changed, len(changed) - 16, 1)
        dest.write_bytes(bytes(changed))
        want = 4096  # every chunk from DEST, the trailer from the store
    (got,) = ptestore.fetch(b, dest).files
    assert got["current"] is False
    assert dest.read_bytes() == data
    if want >= 0:
        assert got["received"] == want
    else:
        assert got["received"] >= len(data) - trailer_size(b)


def test_a_symlink_at_dest_is_replaced_as_before(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """A link at DEST, even to a current copy: not looked into, downloaded whole and
    published over the link (never written through it)."""
    _, b = versions
    copy = tmp_path / "copy.pte"
    shutil.copyfile(b, copy)
    before = _stamp(copy)
    dest = tmp_path / "m.pte"
    dest.symlink_to(copy)
    (got,) = ptestore.fetch(b, dest).files
    assert got["current"] is False and got["bases"] == {}
    assert got["received"] >= b.stat().st_size - trailer_size(b)
    assert not dest.is_symlink() and dest.read_bytes() == b.read_bytes()
    assert _stamp(copy) == before


def test_a_fetch_that_fails_midway_leaves_dest_intact(
    versions: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEST gives its chunks, then the store's request fails: DEST is as it was (nothing
    is written into it); the next fetch completes from the .part and DEST."""
    from ptestore.fleet import chunked

    a, b = versions
    dest = tmp_path / "m.pte"
    shutil.copyfile(a, dest)
    before = _stamp(dest)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(chunked, "_fetch_run", boom)
    seen: list[FetchEvent] = []
    with pytest.raises(RuntimeError, match="injected"):
        ptestore.fetch(b, dest, events=seen.append)
    assert sum(e.nbytes for e in seen if e.origin == "base") == _all_but_chunk_1(b)
    assert _stamp(dest) == before and dest.read_bytes() == a.read_bytes()
    monkeypatch.undo()
    ptestore.fetch(b, dest)
    assert dest.read_bytes() == b.read_bytes()


def test_a_pair_current_and_half_current(tmp_path: Path) -> None:
    pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    dest = tmp_path / "dev" / "m.pte"
    ptestore.fetch(pte, dest)
    ptd_dest = dest.with_suffix(".ptd")
    stamps = _stamp(dest), _stamp(ptd_dest)
    result = ptestore.fetch(pte, dest)
    assert result.current and result.received == 0
    assert [f["current"] for f in result.files] == [True, True]
    assert (_stamp(dest), _stamp(ptd_dest)) == stamps
    # A .pte that is not current beside a .ptd that is: only the .pte is published.
    dest.write_bytes(b"not it")
    result = ptestore.fetch(pte, dest)
    assert [f["current"] for f in result.files] == [True, False]
    assert _stamp(ptd_dest) == stamps[1] and dest.read_bytes() == pte.read_bytes()
    assert ptd_dest.read_bytes() == ptd.read_bytes()


def test_from_a_local_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    index = fleet_run(big_job(tmp_path, str(out), "1"), capsys)
    dest = tmp_path / "dev" / "m.pte"
    ptestore.fetch(index, dest, model="m", device=A)
    before = _stamp(dest)
    again = ptestore.fetch(index, dest, model="m", device=A)
    assert again.current and again.received == 0 and _stamp(dest) == before
    index = fleet_run(big_job(tmp_path, str(out), "2"), capsys)
    (got,) = ptestore.fetch(index, dest, model="m", device=A).files
    assert got["current"] is False and got["received"] == CHUNK_SIZE + 4096
    assert dest.read_bytes() == (out / "a" / "m.pte").read_bytes()


@pytest.mark.s3
def test_s3_current_dest_costs_no_content_byte(
    s3_server: S3TestServer, versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """Counted by the proxy in front of the server: a current DEST costs only the reads
    of the trailer that describe a URL fetched directly; one chunk off, that chunk."""
    from support.faulty_proxy import faulty_proxy

    a, b = versions
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m/b.pte", Body=b.read_bytes())
    url = f"s3://{bucket}/m/b.pte"
    dest = tmp_path / "dev" / "m.pte"
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        opts = {**s3_server.storage_options, "endpoint_url": endpoint}
        ptestore.fetch(url, dest, storage_options=opts)
        before, sent = _stamp(dest), proxy.sent["GET"]
        result = ptestore.fetch(url, dest, storage_options=opts)
        assert result.current and result.received == 0 and _stamp(dest) == before
        assert proxy.sent["GET"] - sent <= 4 * 4096  # the trailer, described
        shutil.copyfile(a, dest)
        sent = proxy.sent["GET"]
        (got,) = ptestore.fetch(url, dest, storage_options=opts).files
        assert got["received"] == CHUNK_SIZE + 4096
        assert proxy.sent["GET"] - sent <= CHUNK_SIZE + 64 * 1024
    assert dest.read_bytes() == b.read_bytes()


def test_an_artifact_of_footer_version_1_is_current_once_fetched(tmp_path: Path) -> None:
    """An artifact an older ptestore wrote (record and footer of version 1, checked whole):
    fetched once, the next fetch finds it current (the footer's version compared with
    the one its record's writer wrote, not with today's: it was fetched again each time)."""
    old = Path(__file__).parents[1] / "provenance" / "data" / "v1_trailer.pte"
    store = tmp_path / "store" / "m.pte"
    store.parent.mkdir()
    shutil.copyfile(old, store)
    shutil.copyfile(old.with_suffix(".ptd"), store.with_suffix(".ptd"))  # its pair
    dest = tmp_path / "dev" / "m.pte"
    assert not ptestore.fetch(store, dest).current
    before = _stamp(dest)
    again = ptestore.fetch(store, dest)
    assert again.current and {f["verified"] for f in again.files} == {"whole"}
    assert _stamp(dest) == before and dest.read_bytes() == old.read_bytes()
