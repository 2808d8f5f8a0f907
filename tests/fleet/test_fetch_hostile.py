"""``fetch`` against hostile or unlucky inputs (issue 29 D, E, 12): a .ptd its .pte was
not made with, a failure between publishing the .ptd and the .pte, links planted at the
download's own files, a trailer the index does not name, a resume after the object
changed in place, a ``.part`` that does not end where the object's bytes do. Local files
and S3 (moto and SeaweedFS) where the store is what the check depends on."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.delta import big_job, program, version
from support.digests import tree
from support.fixtures import get_fixture
from support.fleet_backend import specialized_pair
from support.fleetrun import fleet_run

import ptestore
from ptestore.cli import main
from ptestore.errors import IntegrityError, PartialPublish, PermissionDenied
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.provenance.trailer import encode_trailer
from ptestore.storage.loaders import BytesLoader, open_loader
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
DATA = Path(__file__).parents[1] / "provenance" / "data"
SPEC = "support.fleet_backend:Scaler=1.0"


def _content_sha(path: Path) -> str:
    data = path.read_bytes()
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    return tree(data[: trailer.content_size])


def _mixed(tmp: Path) -> tuple[Path, Path, Path]:
    """``mixed/m.pte`` of device a beside ``mixed/m.ptd`` of device b; and a's .ptd."""
    a_pte, a_ptd = specialized_pair(tmp, "a", 2.0)
    _, b_ptd = specialized_pair(tmp, "b", 3.0)
    assert _content_sha(a_ptd) != _content_sha(b_ptd)
    (tmp / "mixed").mkdir()
    shutil.copy(a_pte, tmp / "mixed" / "m.pte")
    shutil.copy(b_ptd, tmp / "mixed" / "m.ptd")
    return tmp / "mixed" / "m.pte", tmp / "mixed" / "m.ptd", a_ptd


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_fetch_url_refuses_a_ptd_its_pte_was_not_made_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pte, ptd, a_ptd = _mixed(tmp_path)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(pte, dest)
    assert str(info.value) == (
        f"{ptd}: is not the .ptd {pte} was made with: its bytes have {_content_sha(ptd)}, "
        f"the .pte's record names {_content_sha(a_ptd)}"
    )
    assert info.value.published is False
    assert _leftovers(dest.parent) == []  # nothing published, no download left
    assert main(["fetch", str(pte), str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore fetch: failed, nothing published: {ptd}: is not the .ptd")
    assert _leftovers(dest.parent) == []
    # The pair it was made with is fetched.
    shutil.copy(a_ptd, ptd)
    ptestore.fetch(pte, dest)
    assert dest.with_suffix(".ptd").read_bytes() == a_ptd.read_bytes()
    assert ptestore.verify(dest).status == "intact"


@pytest.mark.s3
def test_fetch_s3_url_refuses_a_ptd_its_pte_was_not_made_with(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    pte, ptd, a_ptd = _mixed(tmp_path)
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    for f in (pte, ptd):
        client.put_object(Bucket=bucket, Key=f"fleet/{f.name}", Body=f.read_bytes())
    url = f"s3://{bucket}/fleet/m.pte"
    dest = tmp_path / "dev" / "m.pte"
    opts = s3_server.storage_options
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(url, dest, storage_options=opts)
    assert str(info.value) == (
        f"s3://{bucket}/fleet/m.ptd: is not the .ptd {url} was made with: its bytes have "
        f"{_content_sha(ptd)}, the .pte's record names {_content_sha(a_ptd)}"
    )
    assert _leftovers(dest.parent) == []
    client.put_object(Bucket=bucket, Key="fleet/m.ptd", Body=a_ptd.read_bytes())
    ptestore.fetch(url, dest, storage_options=opts)
    assert dest.read_bytes() == pte.read_bytes()
    assert dest.with_suffix(".ptd").read_bytes() == a_ptd.read_bytes()


def test_a_failure_between_the_ptd_and_the_pte_says_what_was_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptestore.fleet import fetch as fetch_module

    pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    dest = tmp_path / "dev" / "m.pte"
    real_rename = fetch_module.rename

    def rename(src: str, dst: str, *args: Any, **kwargs: Any) -> None:
        # The .pte cannot be published: once the .ptd is, its name is taken by a
        # directory that is not empty (made after fetch checked DEST: a directory there
        # before is refused up front, test_a_directory_at_dest_is_refused_up_front).
        if dst == str(dest) and not dest.exists():
            (dest / "x").mkdir(parents=True)
        real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(fetch_module, "rename", rename)
    with pytest.raises(PartialPublish) as info:
        ptestore.fetch(pte, dest)
    ptd_dest = tmp_path / "dev" / "m.ptd"
    assert info.value.published == (str(ptd_dest),)
    assert str(info.value).startswith(
        f"{ptd_dest} was published, {dest} was not (it still holds what it held before, "
        "or nothing): the pair is torn until the fetch is run again: "
    )
    assert ptd_dest.read_bytes() == ptd.read_bytes()
    # Run again, the .ptd already current is left as it is (not published again): the
    # .pte's failure then publishes nothing.
    shutil.rmtree(dest)
    ino = ptd_dest.stat().st_ino
    assert main(["fetch", str(pte), str(dest), "--json"]) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert (err["type"], err["published"]) == ("StorageError", "nothing")
    assert ptd_dest.stat().st_ino == ino
    shutil.rmtree(dest)
    ptd_dest.unlink()  # the .ptd published again, then the .pte's failure
    assert main(["fetch", str(pte), str(dest), "--json"]) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert (err["type"], err["published"]) == ("PartialPublish", "partial")
    assert err["published_files"] == [str(ptd_dest)]
    assert err["message"].startswith(f"{ptd_dest} was published, {dest} was not")
    shutil.rmtree(dest)
    ptd_dest.unlink()
    assert main(["fetch", str(pte), str(dest)]) == 1
    line = capsys.readouterr().err
    assert line.startswith(f"ptestore fetch: failed after a partial publish: {ptd_dest} was ")
    # Once the name is free, the fetch completes the pair.
    monkeypatch.undo()
    shutil.rmtree(dest)
    ptestore.fetch(pte, dest)
    assert dest.read_bytes() == pte.read_bytes()
    assert ptestore.verify(dest).status == "intact"


@pytest.mark.parametrize("name", ["m.pte.part", "m.pte.part.json", "m.ptd.part", "m.ptd.part.json"])
def test_a_link_at_a_download_file_is_refused_and_never_written_through(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pte, _ = specialized_pair(tmp_path, "a", 2.0)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "dev" / "m.pte"
    dest.parent.mkdir()
    link = dest.parent / name
    link.symlink_to(victim)
    with pytest.raises(PermissionDenied) as info:
        ptestore.fetch(pte, dest)
    assert str(info.value) == (
        f"{link}: is a symbolic link (to {str(victim)!r}); fetch does not write through "
        "links at its download files: remove it and fetch again"
    )
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    assert not dest.exists() and not dest.with_suffix(".ptd").exists()
    assert main(["fetch", str(pte), str(dest)]) == 2  # refused: bad input, not a failure
    assert capsys.readouterr().err == f"ptestore fetch: error: {info.value}\n"
    assert victim.read_bytes() == b"precious" and link.is_symlink()


def _interrupted(src: str, dest: Path, **kwargs: Any) -> None:
    """A fetch interrupted (Ctrl-C) halfway through the .pte's download: a file checked
    whole has a ``.part`` that ends there; one checked by chunks has its verified chunks
    counted in ``.part.json`` (the ``.part`` has its final size)."""

    sizes: list[int] = []

    def progress(url: str, done: int, total: int) -> None:
        if url.endswith(".pte") and done >= total // 2:
            sizes.append(total)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ptestore.fetch(src, dest, chunk_size=256, progress=progress, **kwargs)
    assert not dest.exists()
    state = json.loads(Path(str(dest) + ".part.json").read_text())
    if "verified" in state:
        assert state["verified"] > 0 and state["verified"] * CHUNK_SIZE < sizes[0]
    else:
        assert 0 < os.path.getsize(str(dest) + ".part") < sizes[0]  # halfway through


def _v1(tmp: Path) -> Path:
    """A pair made by an older ptestore (version-1 records: no chunk digests), checked
    whole by fetch."""
    d = tmp / "v1"
    d.mkdir()
    for name in ("v1_trailer.pte", "v1_trailer.ptd"):
        shutil.copyfile(DATA / name, d / name)
    return d / "v1_trailer.pte"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20 MiB artifact (six 4 MiB chunks, a version-2 record)."""
    d = tmp_path_factory.mktemp("big")
    return version(program(d), d / "v1" / "m.pte", "1")


@pytest.mark.parametrize("checked", ["whole", "chunks"])
def test_a_hard_link_at_the_part_is_not_resumed_into(
    tmp_path: Path, big: Path, checked: str
) -> None:
    pte = _v1(tmp_path) if checked == "whole" else big
    dest = tmp_path / "dev" / "m.pte"
    _interrupted(str(pte), dest)
    part = Path(str(dest) + ".part")
    victim = tmp_path / "dev" / "victim"
    victim.write_bytes(part.read_bytes())  # as long as the download so far
    before = victim.read_bytes()
    part.unlink()
    os.link(victim, part)
    with pytest.raises(PermissionDenied) as info:
        ptestore.fetch(pte, dest)
    assert str(info.value).startswith(f"{part}: owner uid {os.geteuid()}, 2 link(s), mode ")
    assert str(info.value).endswith(
        f"fetch resumes only its own file (a regular file of uid {os.geteuid()} with one "
        "name): remove it and fetch again"
    )
    assert victim.read_bytes() == before


def test_the_published_file_is_the_download_itself(tmp_path: Path) -> None:
    """A fetch needs the artifact's size on disk once: the checked ``.part`` is renamed
    into place, not copied."""
    pte, _ = specialized_pair(tmp_path, "a", 2.0)
    dest = tmp_path / "dev" / "m.pte"
    inodes: dict[str, int] = {}

    def progress(url: str, done: int, total: int) -> None:
        if done == total:
            path = dest if url.endswith(".pte") else dest.with_suffix(".ptd")
            inodes[url] = os.stat(str(path) + ".part").st_ino

    ptestore.fetch(pte, dest, progress=progress)
    assert inodes[str(pte)] == dest.stat().st_ino
    assert inodes[str(pte.with_suffix(".ptd"))] == dest.with_suffix(".ptd").stat().st_ino
    assert _leftovers(dest.parent) == ["m.ptd", "m.pte"]


# --- against an index (12) ---------------------------------------------------------


def _job(tmp: Path, dest: str, scale: float = 2.0) -> Path:
    job = tmp / f"job{len(list(tmp.glob('job*.toml')))}.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        f'[devices.a]\nsoc = "x"\nscale = {scale}\n'
    )
    return job


def test_a_trailer_the_index_does_not_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    pte = out / "a" / "m.pte"
    data = pte.read_bytes()
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    # The same content, another valid trailer (its own checksum right).
    record = dict(trailer.record(), created="2000-01-01T00:00:00Z")
    forged = data[: trailer.content_size] + encode_trailer(record, trailer.content_size)
    pte.write_bytes(forged)
    other = read_trailer(BytesLoader(forged))
    assert other is not None and other.sha256 != trailer.sha256
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(info.value) == (
        f"{pte}: provenance trailer checksum sha256:{other.sha256}, the index names "
        f"sha256:{trailer.sha256}"
    )
    assert not dest.exists() and not dest.with_suffix(".ptd").exists()


def test_a_local_resume_is_pinned_to_the_version_not_the_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    index = fleet_run(big_job(tmp_path, str(out)), capsys)
    pte = out / "a" / "m.pte"
    dest = tmp_path / "dev" / "m.pte"
    _interrupted(index, dest, model="m", device="a")
    state = json.loads(Path(str(dest) + ".part.json").read_text())
    st = pte.stat()
    trailer = read_trailer(BytesLoader(pte.read_bytes()))
    assert trailer is not None
    chunks = read_provenance(open_loader(pte)).content.chunks  # type: ignore[union-attr]
    assert state == {
        "url": str(pte),
        "size": st.st_size,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "trailer_sha256": "sha256:" + trailer.sha256,
        "chunks": {"size": CHUNK_SIZE, "root": chunks.root},
        "verified": state["verified"],
    }
    assert state["verified"] > 0
    # The same bytes written again (another inode, another mtime): another version of
    # the object, so the download starts again rather than trust what it kept.
    copy = out / "a" / "copy.pte"
    shutil.copyfile(pte, copy)
    os.replace(copy, pte)
    result = ptestore.fetch(index, dest, model="m", device="a", chunk_size=256)
    got = next(f for f in result.files if f["path"] == str(dest))
    assert got["resumed_from"] == 0  # the other version: started again
    assert dest.read_bytes() == pte.read_bytes()


@pytest.mark.parametrize("change", ["one byte past", "one byte changed", "longer than the object"])
def test_a_part_that_does_not_end_where_the_object_does_restarts(
    tmp_path: Path, change: str
) -> None:
    """A file checked whole (a version-1 record) resumes only a ``.part`` whose last
    bytes are the object's."""
    pte = _v1(tmp_path)
    dest = tmp_path / "dev" / "m.pte"
    _interrupted(str(pte), dest)
    part = Path(str(dest) + ".part")
    data = bytearray(part.read_bytes())
    if change == "one byte past":  # a byte the object does not have there
        data.append(pte.read_bytes()[len(data)] ^ 0xFF)
    elif change == "one byte changed":
        data[-1] ^= 0xFF
    else:
        data += bytes(pte.stat().st_size)
    part.write_bytes(bytes(data))
    result = ptestore.fetch(pte, dest, chunk_size=256)
    got = next(f for f in result.files if f["path"] == str(dest))
    assert (got["resumed_from"], got["verified"]) == (0, "whole")
    assert dest.read_bytes() == pte.read_bytes()
    # An untouched .part resumes where it ends.
    dest2 = tmp_path / "dev2" / "m.pte"
    _interrupted(str(pte), dest2)
    size = os.path.getsize(str(dest2) + ".part")
    result = ptestore.fetch(pte, dest2, chunk_size=256)
    assert next(f for f in result.files if f["path"] == str(dest2))["resumed_from"] == size
    assert dest2.read_bytes() == pte.read_bytes()


def test_a_part_damaged_before_the_bytes_compared_is_downloaded_again(
    tmp_path: Path, big: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file checked whole resumes after comparing only the ``.part``'s last bytes: one
    damaged earlier fails the check, and is downloaded once more from the start (named
    in a warning) instead of being refused as a damaged object."""
    import hashlib
    import logging

    data = big.read_bytes()  # as a version-1 record (no chunk digests): checked whole
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    content, record = data[: trailer.content_size], trailer.record()
    record["version"] = 1
    record["content"] = {
        "size": len(content),
        "sha256": "sha256:" + hashlib.sha256(content).hexdigest(),
        "crc32": record["content"]["crc32"],
    }
    record["source"].pop("chunks", None)
    pte = tmp_path / "v1.pte"
    pte.write_bytes(content + encode_trailer(record, len(content)))
    dest = tmp_path / "dev" / "m.pte"
    _interrupted(str(pte), dest)
    part = Path(str(dest) + ".part")
    resumed = part.stat().st_size
    data = bytearray(part.read_bytes())
    data[10] ^= 1  # bit rot, a torn write: far before the last 64 KiB
    part.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "ptestore.fleet.whole"):
        result = ptestore.fetch(pte, dest, chunk_size=256)
    got = next(f for f in result.files if f["path"] == str(dest))
    assert (got["resumed_from"], got["verified"]) == (0, "whole")
    assert dest.read_bytes() == pte.read_bytes()
    assert any(
        m.startswith(f"{part}: the download resumed after {resumed} bytes does not check (")
        and m.endswith("downloading it again from the start")
        for m in caplog.messages
    )


def test_a_destination_named_like_a_ptd_is_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DEST is the .pte's path: one ending in .ptd is refused up front (a
    ``ConfigurationError``, exit 2), not after the whole download."""
    from ptestore.errors import ConfigurationError

    pte, _ = specialized_pair(tmp_path, "a", 2.0)
    dest = tmp_path / "dev" / "model.ptd"
    message = (
        f"{dest}: fetch writes the .pte to DEST (its .ptd, when it has one, beside it): a "
        "DEST ending in .ptd would name the .pte as external weights; give the .pte's path"
    )
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(pte, dest)
    assert str(info.value) == message
    assert not dest.parent.exists()  # nothing made, nothing downloaded
    assert main(["fetch", str(pte), str(dest)]) == 2
    assert message in capsys.readouterr().err


def _pte_without_ptd_beside_a_ptd(tmp: Path) -> tuple[Path, Path, Path]:
    """A version 2 index whose entry of model ``m`` for device ``a`` names a ``.pte``
    made without a ``.ptd`` (its record names none) and a ``.ptd`` of another pair
    (with its own trailer): the index, the .pte, the .ptd."""
    from ptestore.backends.compat import DeviceProfile
    from ptestore.fleet.index_entry import entry_for

    src = get_fixture("mlp_xnnpack")
    assert src.pte_path is not None
    pte = tmp / "fleet" / "a" / "m.pte"
    pte.parent.mkdir(parents=True)
    ptestore.specialize(
        src.pte_path, pte, backends=["passthrough"], device=DeviceProfile("a", {"soc": "x"})
    )
    prov = read_provenance(open_loader(str(pte)))
    assert prov is not None and prov.ptd_output is None  # made without a .ptd
    _, ptd = specialized_pair(tmp, "b", 3.0)
    entry = {**entry_for(str(pte), str(ptd), {}, None), "model": "m"}
    assert entry["ptd"] is not None and entry["ptd"]["url"] == str(ptd)
    index = tmp / "ptestore-index.json"
    index.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [entry]}))
    return index, pte, ptd


def test_a_ptd_the_pte_s_record_does_not_name_is_never_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .pte whose record names no .ptd, beside the .ptd the index names: refused before
    either is published, by fetch and by ensure (it was published and cached: only an
    index naming a .ptd the record does not was taken at its word)."""
    index, pte, ptd = _pte_without_ptd_beside_a_ptd(tmp_path)
    want = (
        f"{ptd}: is not a .ptd {pte} was made with: the .pte's record names no .ptd (it was "
        "made without one); not published"
    )
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(info.value) == want and info.value.published is False
    assert _leftovers(dest.parent) == []
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device="a")
    assert str(info.value) == want
    entries = ptestore.device.list_entries(cache)  # nothing cached, no entry directory
    assert entries == [], entries
    argv = ["fetch", str(index), str(dest), "--model", "m", "--device", "a"]
    assert main(argv) == 1
    assert capsys.readouterr().err == f"ptestore fetch: failed, nothing published: {want}\n"
    # The .pte alone is what its record says it is: fetched.
    entries = json.loads(index.read_text())["entries"]
    entries[0]["ptd"] = None
    index.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    ptestore.fetch(index, dest, model="m", device="a")
    assert dest.read_bytes() == pte.read_bytes() and _leftovers(dest.parent) == ["m.pte"]
