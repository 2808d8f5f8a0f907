"""Delta delivery of XNNPACK packed-weight files, with the real exporter and runtime
(executorch 1.4.1): a fleet run records the chunk digests of each packed-weight file it
makes; a device that holds the file of the model's earlier version (its cache entry's,
or the one beside a fetched .pte) downloads only the chunks of the new one that differ.

The model is a real export of 4 x Linear(1024, 1024) (16 MiB of fp32 weights, a packed
file of 4-5 chunks of 4 MiB); its next version has one weight scaled
(``support.delta:Scale``), which changes that weight's packed region only."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from support.delta import PHONE, MiB, packed_job, packed_run
from support.fixtures import get_fixture

import ptestore
from ptestore.cli import main
from ptestore.fleet.index import load_index
from ptestore.fleet.packed import read_record
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.testing.runtime import runtime_unavailable
from ptestore.testing.s3server import S3TestServer

pytestmark = [
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import export_linear_stack
    finally:
        sys.path.remove(str(REPO / "scripts"))
    (pte,) = export_linear_stack(
        tmp_path_factory.mktemp("packed-delta") / "lin.pte", layers=4, dim=1024
    )
    return pte


def _field(index: str, opts: dict[str, Any] | None = None) -> dict[str, Any]:
    (entry,) = load_index(index, **(opts or {}))["entries"]
    field: dict[str, Any] = entry["xnnpack"]
    return field


def _changed(old: bytes, new: bytes) -> int:
    """Bytes of the 4 MiB chunks of ``new`` that ``old`` does not hold at the same
    offsets (what a delta delivery downloads)."""
    assert len(old) == len(new)
    return sum(
        len(new[a : a + CHUNK_SIZE])
        for a in range(0, len(new), CHUNK_SIZE)
        if old[a : a + CHUNK_SIZE] != new[a : a + CHUNK_SIZE]
    )


def _delivered(artifact: Any) -> tuple[int, int]:
    """``(from the store, from earlier files)`` of the packed-weight delivery ``ensure``
    reports (``choice["xnnpack_fetched"]``)."""
    fetched = artifact.choice["xnnpack_fetched"]
    return int(fetched["received"]), int(fetched["from_base"])


def test_the_record_names_the_chunk_digests_the_index_pins(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore.provenance.chunks import ChunkDigests

    index = packed_run(packed_job(tmp_path, model, str(tmp_path / "out"), "1"), capsys)
    field = _field(index)
    record = read_record(str(tmp_path / "out" / "phone" / "m.pte"), {})
    assert record is not None and record["xnnpack"] == field
    data = Path(field["url"]).read_bytes()
    assert len(data) == field["size"] > 4 * CHUNK_SIZE  # the test needs several chunks
    chunks = ChunkDigests.from_dict(record["chunks"], len(data), "record", "xnnpack")
    assert chunks.digests == tuple(
        hashlib.sha256(data[a : a + CHUNK_SIZE]).digest() for a in range(0, len(data), CHUNK_SIZE)
    )
    assert field["chunks_root"] == chunks.digest and chunks.digest.startswith("sha256-tree:")


def test_ensure_takes_the_unchanged_chunks_from_the_entrys_earlier_file(
    model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, cache = str(tmp_path / "out"), tmp_path / "cache"
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert first.xnnpack_from == "index" and first.xnnpack_cache is not None
    old = Path(first.xnnpack_cache).read_bytes()

    index = packed_run(packed_job(tmp_path, model, out, "2.5"), capsys)
    field = _field(index)
    got = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert got.xnnpack_from == "index" and got.xnnpack_cache is not None
    new = Path(got.xnnpack_cache).read_bytes()
    assert "sha256:" + hashlib.sha256(new).hexdigest() == field["sha256"]
    assert new == Path(field["url"]).read_bytes() and new != old
    changed = _changed(old, new)
    assert 0 < changed <= 2 * CHUNK_SIZE < len(new) // 2  # one weight's region
    assert _delivered(got) == (changed, len(new) - changed)
    # the earlier file went once the new one was installed; a hit finds the new one
    entry = Path(got.xnnpack_cache).parent
    assert sorted(p.name for p in entry.glob("xnnpack-*.xpwc")) == [Path(got.xnnpack_cache).name]
    again = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert (again.xnnpack_from, again.xnnpack_cache) == ("found", got.xnnpack_cache)
    from ptestore.xnnpack import verify_cache

    assert verify_cache(got.xnnpack_cache, pte=got.pte).sha256 == field["sha256"][7:]


def test_fetch_takes_them_from_the_file_beside_the_pte_it_replaces(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, dest = str(tmp_path / "out"), tmp_path / "dev" / "m.pte"
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    first = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True)
    assert first.xnnpack is not None and first.xnnpack["received"] == first.xnnpack["size"]
    old = Path(first.xnnpack["path"]).read_bytes()

    index = packed_run(packed_job(tmp_path, model, out, "0.5"), capsys)
    field = _field(index)
    argv = ["fetch", index, str(dest), "--model", "m", "--device", "phone", "--xnnpack-cache"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    (path,) = [
        p for p in dest.parent.glob("xnnpack-*.xpwc") if p.name != Path(first.xnnpack["path"]).name
    ]
    new = path.read_bytes()
    assert "sha256:" + hashlib.sha256(new).hexdigest() == field["sha256"]
    changed = _changed(old, new)
    assert 0 < changed <= 2 * CHUNK_SIZE
    assert text.splitlines()[-2:] == [
        f"{field['url']} -> {path}: {len(new)} bytes verified ({changed} received from the "
        f"store, {len(new) - changed} taken from earlier packed-weight files)",
        f"removed {first.xnnpack['path']}: the earlier packed-weight file of this .pte",
    ]


def test_a_fetch_cut_off_mid_file_resumes_at_its_verified_chunks(
    model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link drops after two chunks of the packed-weight file: the fetch fails (the
    pair is published), its ``.part`` and resume marker stay; the next fetch checks the
    two chunks again and downloads only the rest."""
    from ptestore.cli.exits import error_message
    from ptestore.errors import PartialPublish, StorageError
    from ptestore.fleet.ranged import PinnedReader

    index = packed_run(packed_job(tmp_path, model, str(tmp_path / "out"), "1"), capsys)
    field = _field(index)
    dest = tmp_path / "dev" / "m.pte"
    real = PinnedReader.stream
    served = {"requests": 0}

    def dropping(self: PinnedReader, start: int, end: int, piece: int) -> Any:
        if ".xnnpack-" in self.name:
            served["requests"] += 1
            if served["requests"] > 2:
                raise StorageError(f"{self.name}: connection reset (test)")
        return real(self, start, end, piece)

    monkeypatch.setattr(PinnedReader, "stream", dropping)
    with pytest.raises(PartialPublish) as err:
        ptestore.fetch(
            index, dest, model="m", device=PHONE, xnnpack_cache=True, chunk_size=CHUNK_SIZE
        )
    # it says what was published (the pair), not "nothing published"
    assert str(err.value).endswith(
        f"connection reset (test); {dest} was published, its XNNPACK packed-weight file "
        "was not (fetch --xnnpack-cache again resumes its download)"
    )
    assert err.value.published == (str(dest),)
    assert error_message("fetch", err.value, publishes=True).startswith(
        "ptestore fetch: failed after a partial publish: "
    )
    monkeypatch.setattr(PinnedReader, "stream", real)
    assert not list(dest.parent.glob("*.lock"))  # the delivery's lock went with it
    (part,) = dest.parent.glob("xnnpack-download-*.xpwc.part")
    assert json.loads(Path(f"{part}.json").read_text())["verified"] == 2
    assert dest.is_file() and not list(dest.parent.glob("xnnpack-*.xpwc"))

    moved: dict[str, int] = {}
    got = ptestore.fetch(
        index,
        dest,
        model="m",
        device=PHONE,
        xnnpack_cache=True,
        events=lambda e: (
            moved.__setitem__(e.origin, moved.get(e.origin, 0) + e.nbytes)
            if ".xnnpack-" in e.url
            else None
        ),
    ).xnnpack
    assert got is not None and got["sha256"] == field["sha256"]
    assert moved == {"part": 2 * CHUNK_SIZE, "store": field["size"] - 2 * CHUNK_SIZE}
    assert got["received"] == field["size"] - 2 * CHUNK_SIZE
    assert not list(dest.parent.glob("xnnpack-download-*"))


def test_two_deliveries_of_one_file_into_one_directory_take_turns(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second fetch of the same packed-weight file into the same directory (the same
    DEST fetched twice at once) waits for the first's lock before it touches the
    download's ``.part``, which the first is still filling (it would otherwise resume
    it and cut off the chunks the first had written but not yet counted)."""
    import threading

    from support.locks import blocked_on, wait_until

    from ptestore.storage.flock import locked

    index = packed_run(packed_job(tmp_path, model, str(tmp_path / "out"), "1"), capsys)
    field = _field(index)
    dest = tmp_path / "dev" / "m.pte"
    dest.parent.mkdir()
    lock = dest.parent / f"xnnpack-download-{field['sha256'][7:23]}.xpwc.lock"
    box: dict[str, Any] = {}

    def second() -> None:
        try:
            box["got"] = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True)
        except BaseException as exc:  # reported below
            box["error"] = exc

    thread = threading.Thread(target=second, daemon=True)
    with locked(lock):  # the first delivery, as far as the second can tell
        thread.start()
        wait_until(lambda: blocked_on(lock), "the second delivery to wait for the lock")
        assert dest.is_file()  # its pair is published; its packed file waits
        assert not list(dest.parent.glob("xnnpack-download-*.part*"))
    thread.join(600)
    assert "error" not in box, box.get("error")
    got = box["got"].xnnpack
    assert got is not None and got["sha256"] == field["sha256"]
    assert not list(dest.parent.glob("xnnpack-download-*"))


def test_a_file_made_before_chunk_records_is_downloaded_whole(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index field without ``chunks_root`` (a file an older ptestore made): the file
    is downloaded whole and checked by its SHA-256, an earlier file beside it unused."""
    from ptestore.fleet.packed import deliver

    index = packed_run(packed_job(tmp_path, model, str(tmp_path / "out"), "1"), capsys)
    field = {k: v for k, v in _field(index).items() if k != "chunks_root"}
    dest = tmp_path / "dev" / "m.pte"
    first = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert first is not None
    earlier = tmp_path / "dev" / "earlier"
    earlier.mkdir()
    moved: dict[str, int] = {}
    made = deliver(
        field,
        str(dest),
        None,
        str(earlier),
        {},
        bases=[first["path"]],
        events=lambda e: moved.__setitem__(e.origin, moved.get(e.origin, 0) + e.nbytes),
    )
    assert moved == {"store": field["size"]}
    assert "sha256:" + made.sha256 == field["sha256"] == first["sha256"]
    assert Path(made.path).read_bytes() == Path(first["path"]).read_bytes()
    assert not list(earlier.glob("xnnpack-download-*"))


@pytest.fixture(scope="module")
def reshaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two real exports: 6 x Linear(1024, 1024), and the same with layers 1 and 2
    Linear(1024, 1536) and Linear(1536, 1024) (the others' weights the same): the
    packed regions of layers 3-5 move by the 4 MiB and a page layer 1 and 2 grew by."""
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import _lower
    finally:
        sys.path.remove(str(REPO / "scripts"))
    torch.manual_seed(0)
    a = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(6)]).eval()
    wide = [nn.Linear(1024, 1536), nn.Linear(1536, 1024)]
    b = nn.Sequential(a[0], *wide, a[3], a[4], a[5]).eval()
    d = tmp_path_factory.mktemp("reshaped")
    x = (torch.randn(1, 1024),)
    (pa,) = _lower(a, x, d / "a.pte", False)
    (pb,) = _lower(b, x, d / "b.pte", False)
    return pa, pb


def test_regions_moved_by_a_reshaped_layer_are_taken_from_where_the_old_file_keeps_them(
    reshaped: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Layers 1 and 2 of the new version have other shapes: their packed regions are new
    and every region after them moved. The chunks that lie in the moved regions are
    built from the old file's ranges (pairing its index's entries by name and size),
    not downloaded; the same-offset matching alone found none of them."""
    from ptestore.xnnpack.xpwc import parse_index

    a, b = reshaped
    out, cache = str(tmp_path / "out"), tmp_path / "cache"
    index = packed_run(packed_job(tmp_path, a, out, "1"), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert first.xnnpack_cache is not None
    old = Path(first.xnnpack_cache).read_bytes()
    index = packed_run(packed_job(tmp_path, b, out, "1"), capsys)
    got = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert got.xnnpack_from == "index" and got.xnnpack_cache is not None
    new = Path(got.xnnpack_cache).read_bytes()
    assert "sha256:" + hashlib.sha256(new).hexdigest() == _field(index)["sha256"]
    old_at = {e.name: e for e in parse_index(old, "old")}
    moved = sorted(
        (e.offset, e.offset + e.size)
        for e in parse_index(new, "new")
        if e.name in old_at and old_at[e.name].size == e.size and old_at[e.name].offset != e.offset
    )
    assert len(moved) == 3  # layers 3-5
    # the chunks wholly inside the moved regions (those moved alike: consecutive)
    lo, hi = moved[0][0], moved[-1][1]
    inside = [a for a in range(0, len(new), CHUNK_SIZE) if lo <= a and a + CHUNK_SIZE <= hi]
    assert len(inside) >= 2
    same_offsets = sum(
        len(new[a : a + CHUNK_SIZE])
        for a in range(0, len(new), CHUNK_SIZE)
        if old[a : a + CHUNK_SIZE] != new[a : a + CHUNK_SIZE]
    )
    received, from_base = _delivered(got)
    assert received + from_base == len(new)
    assert received <= same_offsets - len(inside) * CHUNK_SIZE
    assert from_base >= (1 + len(inside)) * CHUNK_SIZE  # layer 0's chunk and those


def test_an_update_removes_the_file_it_replaces_and_never_one_another_pte_uses(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``a.pte`` and ``b.pte`` beside each other hold version 1 (one packed-weight file,
    installed for both). Version 2 into ``a.pte``: the version-1 file stays (``b.pte``
    uses it), its record names ``b.pte`` only; version 2 into ``b.pte`` too: it goes
    (record, file and lock). A file made on this machine is never removed."""
    from ptestore.xnnpack import make_cache
    from ptestore.xnnpack.users import USERS

    out, d = str(tmp_path / "out"), tmp_path / "dev"
    a, b = d / "a.pte", d / "b.pte"
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    for dest in (a, b):
        got = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
        assert got is not None and got["removed"] == []
    v1 = Path(got["path"])
    assert json.loads(Path(f"{v1}.json").read_text())[USERS] == [str(a), str(b)]
    other = get_fixture("mlp_xnnpack").pte_path
    assert other is not None
    shutil.copyfile(other, d / "c.pte")
    mine = make_cache(d / "c.pte", directory=d)  # made here, beside them: no user named
    index = packed_run(packed_job(tmp_path, model, out, "2.5"), capsys)

    argv = ["fetch", index, str(a), "--model", "m", "--device", "phone", "--xnnpack-cache"]
    assert main(argv) == 0
    assert "removed" not in capsys.readouterr().out
    assert v1.is_file() and json.loads(Path(f"{v1}.json").read_text())[USERS] == [str(b)]
    argv[2] = str(b)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == f"removed {v1}: the earlier packed-weight file of this .pte"
    assert not list(d.glob(f"{v1.name}*"))
    (v2,) = [p for p in d.glob("xnnpack-*.xpwc") if p != mine.path]
    assert json.loads(Path(f"{v2}.json").read_text())[USERS] == [str(a), str(b)]
    assert Path(mine.path).is_file() and Path(f"{mine.path}.json").is_file()


def test_an_installation_onto_a_file_made_here_leaves_it_one_no_update_removes(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device made DEST's packed-weight file itself; a fetch that delivers the same
    file finds it there (verified) and keeps it as it is, naming no user: the next
    version's fetch installs its own file and leaves the one made here."""
    from ptestore.xnnpack import make_cache
    from ptestore.xnnpack.users import USERS

    out, d = str(tmp_path / "out"), tmp_path / "dev"
    dest = d / "m.pte"
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    assert ptestore.fetch(index, dest, model="m", device=PHONE).xnnpack is None
    mine = make_cache(dest, directory=d)
    got = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert got is not None and got["path"] == str(mine.path) and got["removed"] == []
    assert USERS not in json.loads(Path(f"{mine.path}.json").read_text())
    index = packed_run(packed_job(tmp_path, model, out, "2.5"), capsys)
    got = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert got is not None and got["path"] != str(mine.path) and got["removed"] == []
    assert Path(mine.path).is_file() and Path(f"{mine.path}.json").is_file()


def test_an_entry_whose_new_artifact_was_refused_drops_the_earlier_file(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model's next version is a graph the runtime refuses to cache (Conv-PReLU-Conv,
    ExecuTorch 1.4.1): ``ensure`` serves it without a file, and the earlier version's
    file does not stay in the entry (it is bound to bytes the entry no longer holds)."""
    from support.fleetrun import fleet_run_json

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import export_conv_prelu
    finally:
        sys.path.remove(str(REPO / "scripts"))
    (prelu,) = export_conv_prelu(tmp_path / "prelu.pte")
    out, cache = str(tmp_path / "out"), tmp_path / "cache"
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert first.xnnpack_cache is not None
    entry = Path(first.pte).parent
    capsys.readouterr()
    run = fleet_run_json(packed_job(tmp_path, prelu, out, "1"), capsys)
    assert "refused" in run["pairs"][0]["xnnpack"]
    index = run["index"]
    got = ptestore.ensure(index, cache_dir=cache, model="m", device=PHONE, xnnpack_cache=True)
    assert got.xnnpack_cache is None and got.xnnpack_refused is not None
    assert got.xnnpack_refused.endswith("(refused by the fleet's runtime)")
    assert Path(got.pte).parent == entry
    assert not [p.name for p in entry.iterdir() if p.name.startswith("xnnpack-")]


def test_a_record_replaced_since_the_index_was_written_is_not_trusted(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index pins the chunk record by its root: a record beside the file that names
    other digests (a later run's, or tampered with) is not used; the file is downloaded
    whole and checked by its SHA-256."""
    out, dest = tmp_path / "out", tmp_path / "dev" / "m.pte"
    index = packed_run(packed_job(tmp_path, model, str(out), "1"), capsys)
    ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True)
    index = packed_run(packed_job(tmp_path, model, str(out), "3"), capsys)
    where = out / "phone" / "m.xpwc.json"
    record = json.loads(where.read_text())
    digests = bytearray(__import__("base64").b64decode(record["chunks"]["sha256"]))
    digests[0] ^= 1
    record["chunks"]["sha256"] = __import__("base64").b64encode(bytes(digests)).decode()
    where.write_text(json.dumps(record))
    got = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True)
    assert got.xnnpack is not None
    assert (got.xnnpack["received"], got.xnnpack["from_base"]) == (got.xnnpack["size"], 0)
    assert got.xnnpack["sha256"] == _field(index)["sha256"]


def test_a_damaged_stored_chunk_is_refused_and_one_the_base_holds_never_read(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte flipped in the stored file: in a chunk the earlier file holds, the delivery
    never reads it (the file installed is the one the index names); in a chunk it
    downloads, it is read twice and refused, naming the chunk, and nothing is
    installed."""
    from ptestore.errors import IntegrityError

    out, dest = tmp_path / "out", tmp_path / "dev" / "m.pte"
    index = packed_run(packed_job(tmp_path, model, str(out), "1"), capsys)
    old = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert old is not None
    old_bytes = Path(old["path"]).read_bytes()
    index = packed_run(packed_job(tmp_path, model, str(out), "4"), capsys)
    field = _field(index)
    stored = Path(field["url"])
    good = stored.read_bytes()
    same = [
        a
        for a in range(0, len(good), CHUNK_SIZE)
        if good[a : a + CHUNK_SIZE] == old_bytes[a : a + CHUNK_SIZE]
    ]
    moved = [a for a in range(0, len(good), CHUNK_SIZE) if a not in same]
    stored.chmod(0o644)

    def flipped(offset: int) -> None:
        data = bytearray(good)
        data[offset] ^= 0x40
        stored.write_bytes(bytes(data))

    flipped(same[0] + 100)
    got = ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert got is not None and got["sha256"] == field["sha256"]
    assert Path(got["path"]).read_bytes() == good
    Path(got["path"]).chmod(0o644)
    Path(got["path"]).unlink()
    for leftover in dest.parent.glob(Path(got["path"]).name + ".*"):
        leftover.unlink()

    flipped(moved[0] + 100)
    i = moved[0] // CHUNK_SIZE
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(index, dest, model="m", device=PHONE, xnnpack_cache=True)
    a, b = moved[0], min(moved[0] + CHUNK_SIZE, len(good))
    text = str(err.value)
    assert text.startswith(f"{field['url']}: downloaded bytes {a}:{b} (chunk {i}) have sha256:")
    assert (
        f", its chunk record (beside it, pinned by the index's chunks_root "
        f"{field['chunks_root']}) says sha256:{hashlib.sha256(good[a:b]).hexdigest()}; read "
        "twice: the object was damaged or changed after it was made; "
        f"{dest} was already current, no XNNPACK packed-weight file was"
    ) in text
    assert not err.value.published  # the pair fetched before was current: left as it was
    assert sorted(p.name for p in dest.parent.glob("xnnpack-*")) == sorted(
        p.name for p in Path(old["path"]).parent.glob(Path(old["path"]).name + "*")
    )


def test_a_packed_file_fetched_by_url_is_checked_against_the_record_beside_it(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fetched by the artifact's URL (no index), the packed-weight file is the one the
    XNNPACK record beside the artifact names, and an error says so (it said "the index
    names")."""
    from ptestore.errors import IntegrityError

    out, dest = tmp_path / "out", tmp_path / "dev" / "m.pte"
    index = packed_run(packed_job(tmp_path, model, str(out), "1"), capsys)
    (entry,) = load_index(index)["entries"]
    field, src = entry["xnnpack"], entry["pte"]["url"]
    stored = Path(field["url"])
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes()[:-1])
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(src, dest, xnnpack_cache=True)
    assert str(err.value) == (
        f"{field['url']}: {field['size'] - 1} bytes, the XNNPACK record beside {src} names "
        f"{field['size']}; {dest} was published, no XNNPACK packed-weight file was"
    )


@pytest.mark.s3
def test_s3_only_the_changed_chunks_cross_the_wire(
    model: Path, s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.faulty_proxy import faulty_proxy
    from support.s3job import s3_options_toml

    bucket = s3_server.new_bucket()
    out, dest = f"s3://{bucket}/fleet", tmp_path / "dev" / "m.pte"
    extra = s3_options_toml(s3_server.storage_options)
    opts = s3_server.storage_options
    index = packed_run(packed_job(tmp_path, model, out, "1", extra), capsys)
    first = ptestore.fetch(
        index, dest, model="m", device=PHONE, storage_options=opts, xnnpack_cache=True
    )
    assert first.xnnpack is not None
    old = Path(first.xnnpack["path"]).read_bytes()
    index = packed_run(packed_job(tmp_path, model, out, "2", extra), capsys)
    # the .pte updated first (not what is counted here: tests/fleet/test_delta_fetch.py)
    ptestore.fetch(index, dest, model="m", device=PHONE, storage_options=opts, base=str(dest))
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        via = {**opts, "endpoint_url": endpoint}
        got = ptestore.fetch(
            index,
            dest,
            model="m",
            device=PHONE,
            storage_options=via,
            xnnpack_cache=True,
            base=str(dest),
        )
        sent = proxy.sent["GET"]
    assert got.xnnpack is not None
    new = Path(got.xnnpack["path"]).read_bytes()
    changed = _changed(old, new)
    assert got.xnnpack["received"] == changed <= 2 * CHUNK_SIZE
    # the packed file's changed chunks and the small objects (index, record, the
    # artifact's trailer reads): nothing near the whole file
    assert changed <= sent <= changed + 1 * MiB < len(new)
