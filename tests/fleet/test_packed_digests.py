"""What ties a delivered XNNPACK packed-weight file to the index, and what the runtime
needs of its layout, on a real file (executorch 1.4.1 exports and packs it).

A chunked delivery checks every chunk against the record ``chunks_root`` pins, and then
the whole file against the index's ``sha256``, the digest it is installed under: an
index whose ``sha256`` names another file is refused (it was installed under that digest,
then failed ``verify_cache`` and was still handed out by ``find_cache(full=False)``).
An index entry whose region is not at a multiple of 64 bytes (XNNPACK's alignment of a
packed weight; the runtime crashed loading such a file, SIGSEGV) is refused by
``parse_index``; one moved by 64 bytes is not."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.delta import packed_job, packed_run

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index import load_index, update_index
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack.xpwc import ALIGNMENT, parse_index

needs_runtime = pytest.mark.skipif(
    runtime_unavailable() is not None, reason=str(runtime_unavailable())
)

REPO = Path(__file__).resolve().parents[2]


class _Captured:
    """What :func:`support.delta.packed_run` reads of ``capsys`` (a module fixture has
    none): the standard output written since the last call."""

    def __init__(self, buffer: io.StringIO) -> None:
        self.buffer = buffer

    def readouterr(self) -> SimpleNamespace:
        out = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        return SimpleNamespace(out=out, err="")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A fleet run's index (local, version 3) of a real 3 x Linear(256, 256) export
    with the packed-weight file made here, and that file's ``xnnpack`` field."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import export_linear_stack
    finally:
        sys.path.remove(str(REPO / "scripts"))
    tmp = tmp_path_factory.mktemp("packed-digests")
    (model,) = export_linear_stack(tmp / "lin.pte", layers=3, dim=256)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        index = packed_run(packed_job(tmp, model, str(tmp / "out")), _Captured(buffer))
    (entry,) = load_index(index)["entries"]
    field: dict[str, Any] = entry["xnnpack"]
    assert field["chunks_root"] is not None  # delivered chunk by chunk
    return index, field


@pytest.mark.interop
@pytest.mark.slow
@needs_runtime
def test_an_index_whose_sha256_names_another_file_is_refused_by_ensure(
    made: tuple[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The ``sha256`` of the index's field set to another file's digest (the .pte's),
    ``chunks_root`` kept: every chunk matches, the whole file does not. ``ensure`` says
    why it did not use the fleet's file and makes one here; nothing is installed under
    the wrong digest (it was: ``xnnpack_from`` "index", a record naming that digest)."""
    from ptestore.xnnpack import verify_cache
    from ptestore.xnnpack.identity import file_sha256

    index, field = made
    (entry,) = load_index(index)["entries"]
    wrong = "sha256:" + file_sha256(entry["pte"]["url"])
    assert wrong != field["sha256"]

    def forged(e: dict[str, Any]) -> dict[str, Any]:
        return {**e, "xnnpack": {**e["xnnpack"], "sha256": wrong}}

    update_index(index, forged)
    try:
        capsys.readouterr()
        cache = tmp_path / "cache"
        argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device"]
        argv += ["phone", "--device-option", "soc=x", "--xnnpack-cache", "--json"]
        with caplog.at_level("WARNING", logger="ptestore.device"):
            assert main(argv) == 0
        out = capsys.readouterr().out
    finally:
        update_index(index, lambda e: {**e, "xnnpack": {**e["xnnpack"], **field}})
    got = json.loads(out)
    refused = (
        f"{field['url']}: the file assembled from its chunks has {field['sha256']}, the "
        f"index names {wrong} (its chunks match the chunks_root {field['chunks_root']} "
        "pins: the two digests name different files)"
    )
    assert (
        f"{got['pte']}: the fleet's XNNPACK packed-weight file was not used ({refused}); "
        "making one here"
    ) in caplog.text
    assert got["xnnpack_from"] == "made"
    packed = Path(got["xnnpack_cache"])
    record = json.loads(Path(str(packed) + ".json").read_text())
    assert record["sha256"] == file_sha256(packed) != wrong[7:]
    assert verify_cache(packed, pte=got["pte"], ptd=got.get("ptd")).sha256 == record["sha256"]
    entry_dir = Path(got["pte"]).parent
    assert not [p.name for p in entry_dir.iterdir() if p.name.startswith("xnnpack-download-")]


def _moved(data: bytes, by: int) -> tuple[bytes, str, int]:
    """``data`` (a real packed-weight file) with the region of its last entry (in file
    order) moved ``by`` bytes further into the padding after it, its index entry saying
    so: the file, the entry's name and its new offset."""
    entries = sorted(parse_index(data, "real"), key=lambda e: e.offset)
    last = entries[-1]
    (index_start,) = struct.unpack_from("<Q", data, len(data) - 20)
    assert last.offset + last.size + by <= index_start  # the padding holds it
    out = bytearray(data)
    out[last.offset : last.offset + by] = bytes(by)
    out[last.offset + by : last.offset + by + last.size] = data[
        last.offset : last.offset + last.size
    ]
    raw = last.name.encode()
    at = data.index(struct.pack("<I", len(raw)) + raw, index_start) + 4 + len(raw)
    assert struct.unpack_from("<Q", data, at)[0] == last.offset
    struct.pack_into("<Q", out, at, last.offset + by)
    return bytes(out), last.name, last.offset + by


@pytest.mark.interop
@pytest.mark.slow
@needs_runtime
def test_an_entry_at_an_offset_xnnpack_cannot_read_is_refused(
    made: tuple[str, dict[str, Any]],
) -> None:
    """The runtime writes each region at a page boundary and reads it where its entry
    says; a region 4 bytes past one crashed it (SIGSEGV) and is refused, naming the
    entry, its offset and the alignment. One 64 bytes past it parses (XNNPACK needs 64
    bytes, not a page: such a file loaded and ran identically)."""
    _, field = made
    data = Path(field["url"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == field["sha256"][7:]
    assert all(e.offset % 4096 == 0 for e in parse_index(data, "real"))
    bad, name, offset = _moved(data, 4)
    index = sorted(parse_index(data, "real"), key=lambda e: e.offset)
    i = [e.name for e in parse_index(data, "real")].index(name)
    with pytest.raises(FormatError) as err:
        parse_index(bad, "f.xpwc")
    assert str(err.value) == (
        f"f.xpwc: index entry {i} ({name!r}) offset = {offset}: must be a multiple of "
        f"{ALIGNMENT} (XNNPACK reads a packed weight at that alignment: the runtime would "
        "crash loading this file)"
    )
    good, _, offset = _moved(data, ALIGNMENT)
    assert {e.name: e.offset for e in parse_index(good, "f.xpwc")} == {
        **{e.name: e.offset for e in index},
        name: offset,
    }


def test_a_download_that_cannot_be_read_back_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No runtime: a file of one region in the XPWC layout, delivered chunk by chunk; the
    read back to hash it fails (EIO): a :class:`StorageError` naming the ``.part``, the
    URL and the errno, not a raw ``OSError`` (and not an ``IntegrityError``: the verified
    chunks stay for the next call to resume from)."""
    import errno

    import ptestore.xnnpack.identity as identity
    from ptestore.errors import IntegrityError, StorageError
    from ptestore.fleet.packed_chunks import download_delta
    from ptestore.provenance.chunks import CHUNK_SIZE, ChunkHasher
    from ptestore.xnnpack.xpwc import MAGIC, VERSION

    raw = b"w"
    data = bytes(range(256)) * 16 + struct.pack("<I", 1) + raw + struct.pack("<QQI", 0, 4096, 0)
    data += struct.pack("<QIII", 4096, 1, MAGIC, VERSION)
    stored = tmp_path / "m.xnnpack-x.xpwc"
    stored.write_bytes(data)
    hasher = ChunkHasher(len(data))
    hasher.update(data)
    field = {"url": str(stored), "size": len(data)}
    field["sha256"] = "sha256:" + hashlib.sha256(data).hexdigest()
    dest = tmp_path / "xnnpack-download-x.xpwc"

    def failing(path: object) -> str:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(identity, "file_sha256", failing)
    with pytest.raises(StorageError) as err:
        download_delta(field, str(dest), hasher.result(), {}, [], CHUNK_SIZE)
    assert not isinstance(err.value, IntegrityError)
    assert str(err.value) == (
        f"{dest}.part: the download of {stored} could not be read back to hash it: "
        "Input/output error (EIO)"
    )
    assert Path(f"{dest}.part").read_bytes() == data
